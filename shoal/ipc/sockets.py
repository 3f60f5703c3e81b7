"""ZeroMQ endpoints and socket options shared by every role.

All endpoints are ``ipc://`` paths inside one runtime directory that only the server's
user can open (0700): no TCP, so nothing off-host can reach the broker. Every ROUTER
fails loudly (ROUTER_MANDATORY) instead of silently dropping a message addressed to a
peer that went away, and every socket closes without lingering.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Final

import zmq
from zmq.backend import Socket as _CSocket

from shoal.ipc.lifecycle import pid_alive
from shoal.ipc.shm import owner_gone

FRONTEND_SOCKET: Final[str] = "frontends.sock"
WORKER_SOCKET: Final[str] = "workers.sock"
# The launcher's identity on the frontend socket (explicit model control: it starts the
# workers of the models the API loads).
LAUNCHER_IDENTITY: Final[bytes] = b"launcher"
_FRONTEND_IDENT = re.compile(rb"^f-\d+-\d+$")


_OWN_RUNTIME_DIR = re.compile(r"^shoal-run-\d+-[A-Za-z0-9_]+$")
_RUNTIME_LOCK: Final[str] = ".lock"
_held_locks: list[int] = []  # this process's runtime-dir locks, held until it exits


def ensure_runtime_dir(path: str | None) -> Path:
    """Create (or check) the private runtime directory. When None, a fresh temp dir
    (``shoal-run-<pid>-...``) that this process holds a lock on for as long as it lives,
    after removing the ones whose creator is gone (a SIGKILLed launcher never removes
    its own)."""
    if not path:
        sweep_runtime_dirs()
        return _locked_temp_dir()
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = p.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(f"runtime dir {p} is owned by uid {st.st_uid}, not {os.getuid()}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(p, 0o700)
    return p


def _locked_temp_dir() -> Path:
    """Made under a name sweepers ignore, locked, then renamed: a sweep never sees it
    unlocked. The lock, not the pid in the name, says whether its creator lives: it holds
    across pid namespaces sharing /tmp, and with reused pids (as shoal.ipc.shm's segments)."""
    making = Path(tempfile.mkdtemp(prefix=".shoal-run-"))
    fd = os.open(making / _RUNTIME_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held_locks.append(fd)
    final = making.with_name(f"shoal-run-{os.getpid()}-{making.name.rsplit('-', 1)[1]}")
    os.rename(making, final)
    return final


def sweep_runtime_dirs() -> list[Path]:
    """Remove the temp runtime dirs made by ``ensure_runtime_dir`` (by name, owner and
    lock file) whose creator is gone (their lock is free); returns them."""
    removed: list[Path] = []
    tmp = Path(tempfile.gettempdir())
    for entry in tmp.iterdir():
        if not _OWN_RUNTIME_DIR.match(entry.name):
            continue
        try:
            st = entry.lstat()
        except OSError:  # gone meanwhile
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if not owner_gone(entry / _RUNTIME_LOCK):  # its creator lives, or not one of ours
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def endpoint(runtime_dir: Path | str, name: str) -> str:
    return f"ipc://{Path(runtime_dir) / name}"


def frontend_identity(index: int) -> bytes:
    return f"f-{index}-{os.getpid()}".encode()


def frontend_pid(frontend: bytes) -> int | None:
    """The pid in a frontend identity (``f-<index>-<pid>``), or None if malformed."""
    if not _FRONTEND_IDENT.match(frontend):
        return None
    return int(frontend.rsplit(b"-", 1)[1])


def readiness_path(runtime_dir: Path | str, pid: int) -> str:
    """Where the worker ``pid`` answers its model's readiness checks (a unix socket:
    shoal/workers/readiness.py)."""
    return str(Path(runtime_dir) / f"ready-{pid}.sock")


def result_path(runtime_dir: Path | str, frontend: bytes) -> str:
    """Where a frontend receives results straight from the workers: the unix socket it
    listens on (shoal.ipc.result_link)."""
    if not _FRONTEND_IDENT.match(frontend):
        raise ValueError(f"not a frontend identity: {frontend!r}")
    return str(Path(runtime_dir) / f"results-{frontend.decode()}.sock")


def sweep_stale_results(runtime_dir: Path | str) -> list[Path]:
    """Remove the result sockets' files of frontends that are gone (killed, so they could
    not remove their own, with no broker running to see it); returns them."""
    removed: list[Path] = []
    for path in Path(runtime_dir).glob("results-f-*.sock"):
        pid = frontend_pid(path.name.removeprefix("results-").removesuffix(".sock").encode())
        if pid is None or pid_alive(pid):  # (another user's process with its pid: left)
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def running_frontends(runtime_dir: Path | str) -> list[tuple[bytes, int]]:
    """(identity, pid) of the frontends of this runtime directory that are running, found
    by their result sockets' files: a process with the pid that runs ``shoal.frontend``
    on this directory (not one that took a dead frontend's pid over)."""
    found: list[tuple[bytes, int]] = []
    for path in Path(runtime_dir).glob("results-f-*.sock"):
        ident = path.name.removeprefix("results-").removesuffix(".sock").encode()
        pid = frontend_pid(ident)
        if pid is None:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone
            continue
        if "shoal.frontend" in argv and _runtime_dir_of(argv) == Path(runtime_dir):
            found.append((ident, pid))
    return found


def _runtime_dir_of(argv: list[str]) -> Path | None:
    """A role's ``--runtime-dir`` (shoal.ipc.lifecycle.add_process_flags) from its argv."""
    for i, arg in enumerate(argv):
        if arg == "--runtime-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--runtime-dir="):
            return Path(arg.removeprefix("--runtime-dir="))
    return None


def router(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # A peer that reconnects under its identity (a frontend giving up on a broker that
    # went silent, then greeting it again) takes over from its old connection; without
    # this the new one is ignored while the old one lingers, and the peer never gets in.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(addr)
    return sock


def dealer(ctx: zmq.Context, addr: str, identity: bytes | None = None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(addr)
    return sock


# The hot path's sends and receives, on the Cython socket itself. pyzmq's
# send_multipart/recv_multipart type-check every frame and combine enum flags in Python
# (about 1.5 µs a frame here), and a recv that finds nothing raises an exception (about
# 4 µs); these cost a quarter of that. Same semantics: a ROUTER_MANDATORY send to a gone
# peer still raises EHOSTUNREACH on its first frame, and NOBLOCK still raises zmq.Again.
_send = _CSocket.send
_recv = _CSocket.recv
_get = _CSocket.get
_SNDMORE: Final[int] = int(zmq.SNDMORE)
_EVENTS: Final[int] = int(zmq.EVENTS)
_POLLIN: Final[int] = int(zmq.POLLIN)
NOBLOCK: Final[int] = int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket, frames: list[bytes], flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags)``, for bytes-like frames (at least one)."""
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], _SNDMORE | flags)
    _send(sock, frames[last], flags)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """``sock.recv_multipart(flags)``: every frame of the next message, as bytes. Each
    frame is taken as a zmq.Frame, whose ``more`` flag costs no ZMQ_RCVMORE option read."""
    frame = _recv(sock, flags, False)
    parts: list[bytes] = [frame.bytes]
    while frame.more:
        frame = _recv(sock, flags, False)
        parts.append(frame.bytes)
    return parts


def readable(sock: zmq.Socket) -> bool:
    """A whole message is waiting (ZMQ_EVENTS): a drain loop asks this before each
    receive instead of ending on zmq.Again. It also lets the socket process its pending
    commands, which an edge-triggered ZMQ_FD needs before the loop sleeps again."""
    return bool(_get(sock, _EVENTS) & _POLLIN)  # type: ignore[operator]
