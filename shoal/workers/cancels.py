"""Which requests of the batch a Python model runs (one that is not decoupled) their clients
cancelled, for the model's ``request.is_cancelled()``, as Triton's Python backend tells it.

A client that gives up (a gRPC cancel or deadline, an HTTP client that hangs up) makes its
frontend send a Cancel; the broker drops a request still queued, and forwards the Cancel
of one that runs to its worker (shoal/broker/proc.py). A decoupled model's requests learn
of it through their response senders (shoal/workers/streams.py); the others through this.

The model's ``execute`` runs on the worker loop's thread, which waits meanwhile: a model
that asks reads the Cancels the broker sent since (``read_cancels``, the loop's own
socket, so only from that thread). An async ``execute`` asks from its event loop's thread:
it sees the Cancels read before the batch began, and those read on the loop's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from shoal.ipc import messages as m

Key = tuple[bytes, int]  # (frontend, req_id)


class RunningCancels:
    def __init__(self, read_cancels: Callable[[], None]) -> None:
        """``read_cancels``: read the Cancels the broker sent (calls ``cancel``); only
        from the thread that makes this."""
        self._read = read_cancels
        self._thread = threading.get_ident()
        self.running: dict[Key, bool] = {}  # the batch's requests: cancelled or not

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
