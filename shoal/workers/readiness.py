"""A model's own readiness check (a Python model's ``TritonPythonModel.is_ready``),
answered on the worker's readiness socket, as Triton's Python backend answers it.

Each probe of ``/v2/models/{m}/ready`` (HTTP) or ModelReady (gRPC) of a READY version
whose model has one asks each of its instances (shoal/dataplane/readiness_checks.py), and
so does each probe of the server's readiness under strict readiness (every READY
version's): the frontend connects to the worker's unix socket (shoal/ipc/readiness.py).
As in Triton:

* the check runs beside ``execute`` (on a thread of its own: a busy instance answers);
* one check per instance at a time: a probe that comes while one runs waits for it and
  takes its answer;
* an answer that does not come within CHECK_TIMEOUT_S is "not ready" for that probe; the
  check goes on, and the next probe waits for it rather than starting another;
* ``False``, an exception, or a value that is not a bool: not ready.

Inference is not affected: a model that says it is not ready still serves requests.
``ReadinessCheck`` is the core (the call in, the answer out); ``ReadinessServer`` its
socket shell. Both are thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socketserver
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from shoal.ipc.readiness import CHECK_TIMEOUT_S, Answer, encode

log = logging.getLogger("shoal.worker")

NOT_BOOL = "is_ready() must return a boolean value"
TIMED_OUT = "Timed out waiting for user-defined is_ready() response"


class ReadinessCheck:
    def __init__(self, call: Callable[[], Any], timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """``call``: the model's check (its value, or an exception)."""
        self._call = call
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._running: Future[Answer] | None = None

    def ask(self) -> Answer:
        """The answer of the check running, or of one started now; not ready if it
        takes longer than the timeout."""
        with self._lock:
            running = self._running
            if running is None:
                running = self._running = Future()
                threading.Thread(target=self._run, args=(running,), daemon=True).start()
        try:
            return running.result(self._timeout_s)
        except FutureTimeout:
            return False, TIMED_OUT

    def _run(self, future: Future[Answer]) -> None:
        try:
            value = self._call()
            answer: Answer = (value, "") if isinstance(value, bool) else (False, NOT_BOOL)
        except Exception as exc:
            answer = (False, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._running = None
        future.set_result(answer)


class _Listener(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # many probes at once (a load balancer's, Triton's tests' 16 threads): socketserver's
    # backlog of 5 would refuse the others' connections, which a prober reads as "not ready"
    request_queue_size = 256


class ReadinessServer:
    """``check``'s socket at ``path``, served by threads of its own until ``close``."""

    def __init__(self, path: str, check: ReadinessCheck, instance: str) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                if not self.request.recv(1):
                    return
                answer = check.ask()
                if not answer[0]:  # (Triton says why at verbose level)
                    log.debug("model '%s' is not ready: %s", instance, answer[1])
                with contextlib.suppress(OSError):  # the prober gave up
                    self.request.sendall(encode(answer))

        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # (a pid's leftover: pids are reused)
        self.path = path
        self._server = _Listener(path, Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="readiness", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
