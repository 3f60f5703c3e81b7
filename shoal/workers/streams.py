"""A decoupled model's requests, from their batch until their final response.

Such a model answers each request through its response sender, any number of times, now
or later, from ``execute`` or from threads of its own. Each response goes to its frontend
at once, through the worker's ``answer``; the broker holds a request open (its frontend's
slots, its statistics) until the worker reports it ended (StreamsEnded): the keys of such
requests wait in ``ended``, and the worker's loop is woken (its eventfd) to report them.

Thread safety: the worker's loop calls every method holding ``io_lock``, and lets go of it
while the model's ``execute`` runs (``execute``); the model's threads send through the
senders, which take it. What they touch (the open streams, the worker's result sockets and
mappings) is shared only under that lock; the broker socket stays the loop's alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shoal.ipc import messages as m
from shoal.ipc.errors import Code
from shoal.workers import pb_utils, trace_note
from shoal.workers.instance import Live, ModelInstance, error
from shoal.workers.python_backend import rescheduled as _rescheduled
from shoal.workers.rescheduling import NOT_CONFIGURED, Pending

log = logging.getLogger("shoal.worker")

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass
class Stream:
    """A decoupled model's request, from its batch until its final response."""

    item: m.WorkItem
    reported_open: bool = False  # its BatchDone named it open: StreamsEnded names its end
    cancelled: bool = False  # its client gave up (the broker said so)
    # traced: its batch's receipt, inputs ready, execute's return (trace_note.py)
    ran: list[int] | None = None


class DecoupledStreams:
    def __init__(
        self,
        instance: ModelInstance,
        instance_name: str,
        io_lock: threading.RLock,
        answer: Callable[[bytes, list[bytes]], None],
        read_cancels: Callable[[], None],
        wake_fd: int,
        where: Callable[[], trace_note.Attrs],
        children: Callable[[int], list[m.TraceRecord]] = lambda _: [],
    ) -> None:
        """``answer``: send payloads to a frontend; ``read_cancels``: read the cancels the
        broker sent while the model runs on the loop's thread; ``wake_fd``: the eventfd
        that wakes the loop; ``where``: the attributes a traced request's final response
        names this process by (shoal/workers/trace_note.py); ``children``: the BLS
        traces a traced request spawned (taken), by its trace id."""
        self.instance, self.instance_name = instance, instance_name
        self._where, self._children = where, children
        self.io_lock = io_lock
        self._answer, self._read_cancels, self._wake = answer, read_cancels, wake_fd
        self.open: dict[tuple[bytes, int], Stream] = {}
        self.ended: list[tuple[bytes, int]] = []  # reported open, since ended
        self.gone: set[bytes] = set()  # frontends that exited: their streams go unsent
        self._main_thread = threading.get_ident()

    def execute(self, live: Live, failed: list[int], still_open: list[int]) -> tuple[int, int, int]:
        """A decoupled model's batch: each request answers through its response sender,
        now or later, from any thread. ``still_open`` gets the positions whose final
        response has not gone out when this returns; the broker holds them open until
        StreamsEnded. An ``execute`` that fails ends each request not ended yet with the
        error (those count as failed). Returns when the execution began and ended, and
        the samples it ran."""
        backend: Any = self.instance.backend
        sequence = self.instance.sequence
        senders = [self._sender(it) for _, it, _ in live]
        t1 = time.perf_counter_ns()
        requests: list[Any] = [None] * len(live)
        try:
            if sequence is not None:  # (Oldest only: no null requests to answer)
                for _, it, tensors in live:
                    sequence.add(it, tensors)
            requests = backend.requests([(it.request, tensors) for _, it, tensors in live], senders)
            t1 = time.perf_counter_ns()
            self._stamp(live)
            with self._unlocked():  # the model's threads may answer meanwhile
                failure = backend.execute_decoupled(requests)
            self._stamp(live)
        except Exception as exc:  # the model's fault, never the worker's end
            log.exception("model '%s': requests could not be run", self.instance.model)
            failure = (
                f"Failed to process the request(s) for model '{self.instance_name}', "
                f"message: {type(exc).__name__}: {exc}"
            )
        t2 = time.perf_counter_ns()
        ran = [
            (sender, Pending(it, tensors, r) if r is not None else None)
            for (_, it, tensors), r, sender in zip(live, requests, senders, strict=True)
        ]
        # (the model's requests, and so their senders, are let go of: a sender the model
        # kept no reference to ends its request when this returns, through its __del__)
        requests = []
        ended = self._after(ran, failure)
        del ran
        for (pos, it, _), sender in zip(live, senders, strict=True):
            if sender in ended:
                failed.append(pos)
            stream = self.open.get((it.frontend, it.request.req_id))
            if stream is not None:
                stream.reported_open = True
                still_open.append(pos)
        return t1, t2, self.instance.samples(live)

    def _stamp(self, live: Live) -> None:
        """The traced requests' next compute stamp (trace_note.decoupled_answer)."""
        for _, it, _ in live:
            stream = self.open.get((it.frontend, it.request.req_id))
            if stream is not None and stream.ran is not None:
                stream.ran.append(time.monotonic_ns())

    def _after(self, ran: list[tuple[Any, Pending | None]], failure: str | None) -> list[Any]:
        """After ``execute`` ran these requests (each one's sender, and its request if it
        was made): each one still open ends with the ``failure`` (if any); one the model
        rescheduled is held to run again (or ends with Triton's refusal, where its model
        has no iterative sequences). Returns the senders a failure ended."""
        if failure is not None:
            log.error("%s", failure)
        ended = []
        for sender, p in ran:
            message = failure
            if p is not None and message is None and _rescheduled(p.request) and not sender.closed:
                if self.instance.backend.iterative:
                    self.instance.rescheduled.add(p.item, p.tensors, p.request)
                    continue
                message = NOT_CONFIGURED
            if message is not None and not sender.closed:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
                # (a model thread's final flag may win the race: then it is closed)
                with contextlib.suppress(pb_utils.TritonModelException):
                    sender.send(response, _FINAL)
                    ended.append(sender)
        return ended

    def rerun(self) -> m.RerunDone:
        """Run the requests the model rescheduled, together, with their senders;
        returns the run's report."""
        t0 = time.perf_counter_ns()
        pending = self.instance.next_runs()
        t1 = time.perf_counter_ns()
        try:
            with self._unlocked():
                failure = self.instance.backend.execute_decoupled([p.request for p in pending])
        except Exception as exc:  # the model's fault, never the worker's end
            log.exception("model '%s': requests could not be run", self.instance.model)
            failure = (
                f"Failed to process the request(s) for model '{self.instance_name}', "
                f"message: {type(exc).__name__}: {exc}"
            )
        t2 = time.perf_counter_ns()
        ended = self._after([(p.request.get_response_sender(), p) for p in pending], failure)
        ok = [p.item for p in pending if p.request.get_response_sender() not in ended]
        return self.instance.rerun_done(len(pending), ok, t0, t1, t2)

    def cancel(self, frontend: bytes, req_id: int) -> None:
        """The broker says the client of this request gave up: the model may look."""
        stream = self.open.get((frontend, req_id))
        if stream is not None:
            stream.cancelled = True

    def frontend_gone(self, frontend: bytes) -> None:
        """Its requests are cancelled, and their responses no longer sent."""
        self.gone.add(frontend)  # (identities carry the pid: never one again)
        for stream in self.open.values():
            if stream.item.frontend == frontend:
                stream.cancelled = True

    def take_ended(self) -> list[tuple[bytes, int]]:
        """The requests reported open whose final response went out since the last call."""
        keys, self.ended = self.ended, []
        return keys

    def end_all(self, version: int) -> None:
        """The instance stops: each request still open ends with an error (nothing will
        answer it)."""
        for key, stream in list(self.open.items()):
            self.open.pop(key, None)
            info = m.ErrorInfo(
                int(Code.UNAVAILABLE),
                f"Failed to process the request(s) for model instance '{self.instance_name}',"
                " message: the instance stopped before the model sent the final response",
            )
            resp = m.InferResponse(key[1], [], info, version)
            self._answer(stream.item.frontend, [m.encode_payload(resp)])

    def _sender(self, item: m.WorkItem) -> pb_utils.InferenceResponseSender:
        stream = self.open[(item.frontend, item.request.req_id)] = Stream(item)
        if isinstance(item.request.hops, m.TracedWay):
            stream.ran = [time.monotonic_ns()]

        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            self._deliver(stream, response, final)

        def cancelled() -> bool:
            if not stream.cancelled and threading.get_ident() == self._main_thread:
                self._read_cancels()  # the model streams inside execute: the loop waits
            return stream.cancelled

        return pb_utils.InferenceResponseSender(deliver, cancelled)

    def _deliver(self, stream: Stream, response: Any, final: bool) -> None:
        """One response of a decoupled model's request (``response`` None: the final
        flag alone), sent to its frontend at once, from whichever thread the model
        sends it."""
        item = stream.item
        req_id = item.request.req_id
        with self.io_lock:
            if self.open.get((item.frontend, req_id)) is not stream:
                return  # ended already: the instance is stopping (end_all)
            try:
                resp = self.instance.stream_response(item, response, final)
                if final and stream.ran is not None:
                    assert isinstance(item.request.hops, m.TracedWay)
                    now = time.monotonic_ns()
                    way = item.request.hops
                    resp.hops = trace_note.decoupled_answer(
                        way, stream.ran, now, self._where(), self._children(way.id)
                    )
                payload = m.encode_payload(resp)
            except Exception as exc:  # the model's fault: the request ends with it
                log.exception("model '%s': a response could not be sent", self.instance.model)
                final = True
                message = f"failed to send a response: {type(exc).__name__}: {exc}"
                payload = m.encode_payload(error(item, Code.INTERNAL, message))
            if item.frontend not in self.gone:  # a frontend gone reads nothing more
                self._answer(item.frontend, [payload])
            if final:
                key = (item.frontend, req_id)
                self.open.pop(key, None)
                if stream.reported_open:
                    self.ended.append(key)
                    os.eventfd_write(self._wake, 1)

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let go of ``io_lock`` (held once, by the loop) while the model's code runs."""
        self.io_lock.release()
        try:
            yield
        finally:
            self.io_lock.acquire()
