"""Which requests of the batch a Python model runs (one that is not decoupled) their clients
cancelled, for the model's ``request.is_cancelled()``, as Triton's Python backend tells it.

A client that gives up (a gRPC cancel or deadline, an HTTP client that hangs up) makes its
frontend send a Cancel; the broker drops a request still queued, and forwards the Cancel
of one that runs to its worker (shoal/broker/proc.py). A decoupled model's requests learn
of it through their response senders (shoal/workers/streams.py); the others through this.

The model's ``execute`` runs on the worker loop's thread, which waits meanwhile: a model
that asks reads the Cancels the broker sent since (``read_cancels``, the loop's own
socket, so only from that thread). An async ``execute`` runs on its event loop's thread
while the loop's thread waits for it in ``wait``, reading each Cancel as it arrives: the
coroutine's ``is_cancelled()`` sees it at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import zmq

from shoal.ipc import messages as m

Key = tuple[bytes, int]  # (frontend, req_id)


class RunningCancels:
    def __init__(self, read_cancels: Callable[[], None], broker: Any = None) -> None:
        """``read_cancels``: read the Cancels the broker sent (calls ``cancel``); only
        from the thread that makes this. ``broker``: the socket they come on (what
        ``wait`` polls)."""
        self._read = read_cancels
        self._thread = threading.get_ident()
        self._broker = broker
        self._done_fd = -1  # an async execute's end wakes ``wait`` (made for the first)
        self.running: dict[Key, bool] = {}  # the batch's requests: cancelled or not

    def wait(self, future: Future[Any]) -> Any:
        """The result of an async ``execute`` (``future``, run on another thread), read
        on the loop's thread, which meanwhile reads each Cancel as it comes."""
        if self._broker is None or threading.get_ident() != self._thread:
            return future.result()
        if self._done_fd < 0:
            self._done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        fd = self._done_fd
        future.add_done_callback(lambda _: os.eventfd_write(fd, 1))
        poller = zmq.Poller()
        poller.register(self._broker, zmq.POLLIN)
        poller.register(fd, zmq.POLLIN)
        # (until the callback has written: it never writes after the fd is reused)
        while fd not in dict(poller.poll()):
            self._read()
        os.eventfd_read(fd)
        return future.result()

    def close(self) -> None:
        if self._done_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._done_fd)
            self._done_fd = -1

    def begin(self, items: list[m.WorkItem]) -> list[Callable[[], bool]]:
        """A batch of these requests begins: each one's ``is_cancelled``."""
        self.running = {(it.frontend, it.request.req_id): False for it in items}
        return [self._watch((it.frontend, it.request.req_id)) for it in items]

    def end(self) -> None:
        """The batch ended: a Cancel that comes now is too late for its model."""
        self.running = {}

    def cancel(self, frontend: bytes, req_id: int) -> None:
        """The broker says the client of this request gave up."""
        key = (frontend, req_id)
        if key in self.running:
            self.running[key] = True

    def frontend_gone(self, frontend: bytes) -> None:
        """Each request of an exited frontend is cancelled."""
        for key in self.running:
            if key[0] == frontend:
                self.running[key] = True

    def _watch(self, key: Key) -> Callable[[], bool]:
        def cancelled() -> bool:
            if not self.running.get(key, False) and threading.get_ident() == self._thread:
                self._read()
            return self.running.get(key, False)

        return cancelled
