"""Start and stop a real ``shoal serve`` on free ports, for integration and fault tests.

Every server gets its own ports, its own runtime directory and its own log file, so
tests never share state by accident. Every child process of a server carries that
runtime directory on its command line, which is how the tests find the processes of
one server (and prove none is left after it stops).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SHM_DIR = Path("/dev/shm")
#: Each test process's servers' runtime folders (``tempfile`` prefix): the pytest-xdist
#: worker's name in it, so that each worker checks for its own servers left behind.
RUN_PREFIX = f"shoal-test-run-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"
_log_dir: Path | None = None


def log_dir() -> Path:
    """This test run's folder of server logs (``shoal-test-logs-*`` in the temp dir),
    made at its first use. conftest removes it when the run passes and names it when
    one fails."""
    global _log_dir
    if _log_dir is None:
        _log_dir = Path(tempfile.mkdtemp(prefix="shoal-test-logs-"))
    return _log_dir


def finish_logs(keep: bool) -> Path | None:
    """At the run's end: the logs' folder if one was made and ``keep``; else it is
    removed (if made) and None."""
    global _log_dir
    kept, _log_dir = _log_dir, None
    if kept is not None and not keep:
        shutil.rmtree(kept, ignore_errors=True)
        return None
    return kept


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now. Picked below the kernel's ephemeral range: a
    port the kernel hands to ``bind(0)`` is one it may hand out again at once (two servers
    got the same one for HTTP and gRPC) or give to a client connection before the server
    binds it; below that range only a server that binds on purpose can take it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    start, stop = 10000, max(low, 20000)
    rng = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("0.0.0.0", rng.randrange(start, stop)))  # gRPC listens on every address
            except OSError:
                s.close()
                continue
            held.append(s)  # held until all are chosen: they are distinct
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def processes_with(marker: str) -> dict[int, str]:
    """pid -> command line of every process whose command line contains ``marker``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found[int(entry.name)] = cmd
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _established() -> list[tuple[int, int, int]]:
    """(local port, remote port, inode) of every established TCP socket of this host's
    network namespace (/proc/net/tcp and tcp6)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "01":  # ESTABLISHED
                    local, remote = (int(a.rsplit(":", 1)[1], 16) for a in f[1:3])
                    out.append((local, remote, int(f[9])))
    return out


def served_by(port: int, servers: list[int]) -> dict[int, int]:
    """This process's connections to ``port``: each one's local port -> the pid among
    ``servers`` holding its other end (which frontend a client landed on, for the tests
    that stop one of several frontends sharing a port)."""
    sockets = _established()
    mine = _socket_inodes(os.getpid())
    held = {inode: pid for pid in servers for inode in _socket_inodes(pid)}
    clients = {local for local, remote, inode in sockets if remote == port and inode in mine}
    return {
        remote: held[inode]
        for local, remote, inode in sockets
        if local == port and remote in clients and inode in held
    }


def shm_segments_of(pids: set[int]) -> list[str]:
    return [
        p.name
        for p in SHM_DIR.iterdir()
        if p.name.startswith("shoal-") and int(p.name.split("-")[1]) in pids
    ]


class ShoalServer:
    def __init__(
        self,
        repo: Path | str,
        *args: str,
        wait_ready: bool = True,
        env: dict[str, str] | None = None,
        open_files: int | None = None,
    ) -> None:
        """``open_files``: start it under ``prlimit --nofile=N:N`` (soft and hard limit:
        no process of the server can raise it)."""
        self.repo = repo
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.runtime_dir = tempfile.mkdtemp(prefix=RUN_PREFIX)
        self.log_path = log_dir() / f"{Path(self.runtime_dir).name}.log"
        self.args = args
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        prefix = [] if open_files is None else ["prlimit", f"--nofile={open_files}", "--"]
        self.proc = subprocess.Popen(
            [
                *prefix,  # (prlimit execs the server: the pid is the server's)
                sys.executable,
                "-m",
                "shoal",
                "serve",
                f"--model-repository={repo}",
                f"--http-port={self.http_port}",
                "--http-address=127.0.0.1",
                f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}",
                f"--runtime-dir={self.runtime_dir}",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.seen_pids: set[int] = {self.proc.pid}
        if wait_ready:
            try:
                self.wait_ready()
            except BaseException:  # (a start that failed, timed out or was interrupted:
                # no fixture holds this server to stop it)
                with contextlib.suppress(Exception):  # (the start's error is the one to see)
                    self.stop()
                raise

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, protocol: str) -> tuple[str, Any]:
        """The URL and the tritonclient module (tritonclient.http or .grpc) to reach this
        server over ``protocol`` ("http" or "grpc")."""
        if protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module  # type: ignore[no-redef]
        port = self.http_port if protocol == "http" else self.grpc_port
        return f"127.0.0.1:{port}", module

    def http(
        self, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One HTTP request (POST when ``body`` is given): its status and body."""
        req = urllib.request.Request(f"http://{self.url}{path}", data=body, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read()

    def http_status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0  # not listening (yet, or any more)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"shoal exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError):
                if self.http_status("/v2/health/ready") == 200:
                    self.seen_pids |= set(self.pids())
                    return
            time.sleep(0.1)
        raise TimeoutError(f"shoal not ready after {timeout}s:\n{self.log()}")

    def wait_answering(self, timeout: float = 60.0) -> None:
        """Until the HTTP port answers at all (a server that is not live answers 400)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"shoal exited with {self.proc.returncode}:\n{self.log()}")
            if self.http_status("/v2/health/live") != 0:
                return
            time.sleep(0.1)
        raise TimeoutError(f"shoal not answering after {timeout}s:\n{self.log()}")

    def model_version(self, model: str) -> dict[str, Any]:
        """shoal's extension: the model's (first) version, with its state, reason and
        instances."""
        with urllib.request.urlopen(f"http://{self.url}/v2/shoal/models/{model}", timeout=5) as r:
            return dict(json.loads(r.read())["versions"][0])

    def wait_settled(self, models: tuple[str, ...], timeout: float = 180.0) -> None:
        """Until every model is READY or UNAVAILABLE (a server that is not strict about
        readiness is ready once its start-up loads are over, but a broker started again
        loads them anew, and a model loaded through the API may still be loading)."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {m: self.model_version(m)["state"] for m in models}
            if all(state in ("READY", "UNAVAILABLE") for state in states.values()):
                return
            time.sleep(0.1)
        raise TimeoutError(f"models still loading after {timeout}s: {states}\n{self.log()}")

    def pids(self, role: str = "") -> list[int]:
        """Children of this server, optionally of one role ("broker", "frontend", "workers")."""
        found = processes_with(self.runtime_dir)
        return sorted(
            pid
            for pid, cmd in found.items()
            if pid != self.proc.pid and (not role or f"-m shoal.{role} " in cmd)
        )

    def worker_pid(self, model: str) -> int:
        found = processes_with(self.runtime_dir)
        for pid, cmd in found.items():
            if "-m shoal.workers " in cmd and f"--model {model} " in cmd:
                return pid
        raise LookupError(f"no worker for {model}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        """Stop the server and check it left nothing behind; returns its exit code."""
        self.seen_pids |= set(self.pids())
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        finally:
            self._log.close()
        leftovers = self.leftovers()
        assert not leftovers, f"left behind: {leftovers}\n{self.log()}"
        return rc

    def leftovers(self) -> list[str]:
        deadline = time.monotonic() + 5
        while True:
            procs = processes_with(self.runtime_dir)
            segs = shm_segments_of(self.seen_pids)
            if (not procs and not segs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return [f"process {p}: {c}" for p, c in procs.items()] + [f"/dev/shm/{s}" for s in segs]


@contextlib.contextmanager
def settled_server(repo: Path, models: tuple[str, ...], *args: str) -> Iterator[ShoalServer]:
    """A server (with the flags ``args``) that starts whatever loads (some models may fail
    on purpose), once every model in ``models`` is READY or UNAVAILABLE; stopped cleanly
    and removed after."""
    srv = ShoalServer(repo, "--exit-on-error=false", "--strict-readiness=false", *args)
    try:
        srv.wait_settled(models)
    except BaseException:
        srv.stop()
        raise
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@contextlib.contextmanager
def served(
    repo: Path | str, *args: str, env: dict[str, str] | None = None
) -> Iterator[ShoalServer]:
    """A server for the ``with`` block: stopped after it, failing or not, and checked to
    have exited cleanly and left nothing behind. ``repo``: a folder, or a location in
    object storage (``s3://...``)."""
    srv = ShoalServer(repo, *args, env=env)
    try:
        yield srv
    finally:
        assert srv.stop() == 0
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)
