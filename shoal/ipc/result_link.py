"""Results from the workers to a frontend: a unix stream socket per (worker, frontend).

The broker's sockets are ZeroMQ (identities, routing, reconnects); this hop is point to
point and needs none of that. A ZeroMQ message between two processes wakes a ZeroMQ I/O
thread on each side before the receiver, and costs three to four times the latency and
the CPU of a write on a unix socket (bench/run_hops.py measures both side by side).
Every answer takes this hop, so it is a plain socket: the frontend listens
on ``results-<frontend identity>.sock`` in the runtime directory, each worker connects once
and writes; the frontend's event loop reads the socket itself, no thread in between.

Framing: each answer (an encoded ``InferResponse``) is preceded by its length, a 32-bit
little-endian unsigned integer; a batch's answers to one frontend leave in one write.

The sender never blocks the worker: what the socket does not take at once (a frontend
slow to read, a large answer) waits in order in a backlog that a helper thread writes,
so one slow frontend never holds up the answers to the others. A frontend that reads
nothing for ``stall_s`` is given up on (its link closed, the rest of its answers
dropped, said in the log): it is stuck, and the launcher replaces a stuck frontend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading
from collections import deque
from collections.abc import Sequence
from typing import Final

log = logging.getLogger("shoal.ipc.results")

_LENGTH: Final = struct.Struct("<I")
#: An answer's length must fit the prefix; larger answers travel in shared memory.
MAX_ANSWER_BYTES: Final[int] = 2**32 - 1
#: iovecs per sendmsg (Linux's IOV_MAX is 1024): two per answer.
_IOV_PAIRS: Final[int] = 500
#: What one read of a frontend's link asks for: a batch of small answers in one syscall.
_READ_BYTES: Final[int] = 256 * 1024
#: A frontend that takes nothing for this long is not reading.
STALL_S: Final[float] = 30.0
#: ...and one whose listening socket accepts nothing for this long (its backlog full).
_CONNECT_S: Final[float] = 2.0


def listen(path: str) -> socket.socket:
    """The frontend's listening socket (non-blocking), bound at ``path``; any file left
    there by an earlier process of the same identity is replaced."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(path)
        sock.listen(socket.SOMAXCONN)  # every worker of a big host may connect at once
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def frame(payloads: Sequence[bytes]) -> list[bytes]:
    """The buffers that carry ``payloads``: each one's length, then the payload."""
    out: list[bytes] = []
    for p in payloads:
        n = len(p)
        if n > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of {n} bytes does not fit a frame")
        out.append(_LENGTH.pack(n))
        out.append(p)
    return out


class FrameReader:
    """Reassembles the answers of a byte stream, whatever the reads cut them into."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def partial(self) -> int:
        """Bytes held of an answer not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[memoryview]:
        """The answers that ``data`` completes, in order (views valid until the next
        call)."""
        buf: bytes
        if self._buf:
            self._buf += data
            held = len(self._buf)
            if held < 4 or held < 4 + _LENGTH.unpack_from(self._buf)[0]:
                return []  # (a large answer arrives in many reads: copied once, whole)
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = data
        view = memoryview(buf)
        out: list[memoryview] = []
        at, end = 0, len(buf)
        unpack = _LENGTH.unpack_from
        while end - at >= 4:
            (n,) = unpack(buf, at)
            if end - at - 4 < n:
                break
            out.append(view[at + 4 : at + 4 + n])
            at += 4 + n
        if at < end:
            self._buf += view[at:]
        return out


class ResultSender:
    """A worker's link to one frontend. ``send`` never blocks; safe from any thread."""

    def __init__(self, path: str, stall_s: float = STALL_S) -> None:
        self.path = path
        self.stall_s = stall_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(min(stall_s, _CONNECT_S))  # a frontend's backlog may be full
            sock.connect(path)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._lock = threading.Lock()
        self._backlog: deque[bytes] = deque()  # bytes the socket has not taken, in order
        self._flusher: threading.Thread | None = None
        self.closed = False

    def send(self, payloads: Sequence[bytes]) -> bool:
        """Queue ``payloads`` for the frontend, in order after what was sent before;
        False if this link is closed (the frontend is gone or stuck): they are dropped."""
        buffers = frame(payloads)
        with self._lock:
            if self.closed:
                return False
            if self._backlog:  # behind what waits: in order
                self._backlog.extend(buffers)
                return True
            for i in range(0, len(buffers), 2 * _IOV_PAIRS):
                chunk = buffers[i : i + 2 * _IOV_PAIRS]
                try:
                    sent = self._sock.sendmsg(chunk)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._close_locked(f"the frontend's link broke ({exc.strerror})")
                    return False
                if sent < sum(len(b) for b in chunk):
                    self._defer(buffers[i:], sent)
                    break
            return True

    def _defer(self, buffers: list[bytes], sent: int) -> None:
        for b in buffers:
            if sent >= len(b):
                sent -= len(b)
                continue
            self._backlog.append(b[sent:] if sent else b)
            sent = 0
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush, name="shoal-results", daemon=True)
            self._flusher.start()

    def _flush(self) -> None:
        """Writes the backlog as the frontend reads it (the helper thread's life)."""
        while True:
            with self._lock:
                if self.closed or not self._backlog:
                    self._flusher = None
                    return
                head = self._backlog[0]
                try:
                    sent = self._sock.send(head)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._close_locked(f"the frontend's link broke ({exc.strerror})")
                    return
                if sent == len(head):
                    self._backlog.popleft()
                    continue
                self._backlog[0] = head[sent:]
                sock = self._sock
            # the lock is free while the frontend reads: others may queue behind
            try:
                _, writable, _ = select.select([], [sock], [], self.stall_s)
            except (OSError, ValueError):  # closed meanwhile (close())
                return
            if not writable:
                with self._lock:
                    self._close_locked(f"the frontend read nothing for {self.stall_s:.0f}s")
                return

    def _close_locked(self, why: str) -> None:
        if self.closed:
            return
        if self._backlog:
            log.error("results to %s dropped: %s", os.path.basename(self.path), why)
        else:
            log.debug("link to %s closed: %s", os.path.basename(self.path), why)
        self._backlog.clear()
        self._flusher = None
        self._sock.close()
        self.closed = True  # (last: whoever sees it closed sees it said, too)

    def close(self, linger_s: float = 0.0) -> None:
        """Close the link; what waits still gets ``linger_s`` to leave."""
        flusher = self._flusher
        if linger_s > 0 and flusher is not None:
            flusher.join(linger_s)
        with self._lock:
            self._close_locked("closed")
