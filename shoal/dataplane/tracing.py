"""Tracing a request across the processes: which requests are traced (``Tracer``, one
per frontend, following the broker's trace settings), and one traced request's timeline
(``Trace``). Pure: no I/O; the trace sink (shoal/frontend/trace_sink.py) writes what
``Tracer.finish`` hands it, on a thread of its own, so no request waits on a file or an
exporter.

Off costs one attribute read per request: an adapter asks ``tracer.active`` before
anything else, and an untraced request's messages are what they were without tracing
(its ``hops`` stay an empty list). A traced request's stamps travel with it, in the
place of the hop timing's: the frontend stamps its send, the broker its receipt and
dispatch, the worker its receipt and send (``InferRequest.hops``, a ``TracedWay``), and
the worker adds its compute phases, the batch it ran in and the traces its model
spawned (BLS) in the answer's ``hops`` (a ``TracedAnswer``). Every stamp is
``time.monotonic_ns()``: one clock for every process of a host.

Trace ids are unique in the server: a frontend numbers its traces ``index << 32 | n``
(frontend 0: 1, 2, 3, ... as Triton), a worker its BLS traces ``pid << 40 | n``.
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shoal.configs.trace_settings import RATE_ZERO, invalid_reason
from shoal.dataplane.broker_client import HOPS, BrokerClient
from shoal.dataplane.types import ClientRequest, OutputTensor
from shoal.ipc import datatypes
from shoal.ipc import messages as m

Attrs = dict[str, int | str | list[int]]
#: (record, its setting, whether it is the last its count allows, the mode)
Sink = Callable[[m.TraceRecord, m.TraceSetting, bool, str], None]


@dataclass(slots=True, eq=False)
class Trace:
    """One traced request: its timestamps in the order they happened, the traces it
    spawned, and what it crossed. Owned by the task that serves the request."""

    id: int
    model: str
    next_id: Callable[[], int]
    parent_id: int = 0
    version: int = -1
    request_id: str = ""
    tensors_level: bool = False  # TENSORS: its inputs and outputs are recorded
    traceparent: str = ""  # the client's W3C trace context, if it sent one
    context: str = ""  # opentelemetry mode: its model span's own traceparent (otel_context)
    last: bool = False  # the last trace its setting's count allows
    responses: int = 0  # the responses its client got so far (a decoupled model's)
    setting: m.TraceSetting | None = None  # the setting that sampled it (its file's)
    # its client left after it was sent: it is finished when its answer comes (``late``)
    waiting: bool = False
    finisher: Callable[[Trace], None] | None = None
    stamps: list[tuple[str, int]] = field(default_factory=list)
    attributes: Attrs = field(default_factory=dict)
    tensors: list[tuple[str, str, str, list[int], str]] = field(default_factory=list)
    children: list[Trace | m.TraceRecord] = field(default_factory=list)

    def stamp(self, name: str, ns: int = 0) -> None:
        self.stamps.append((name, ns or time.monotonic_ns()))

    def child(self, model: str) -> Trace:
        """A trace this one spawns (an ensemble's step): linked by parent_id."""
        t = Trace(self.next_id(), model, self.next_id, self.id, tensors_level=self.tensors_level)
        self.children.append(t)
        return t

    def tensor(
        self, activity: str, name: str, datatype: str, shape: list[int], data: memoryview | None
    ) -> None:
        """At TENSORS level: a tensor's values as Triton's trace file shows them
        (comma-separated; none for BYTES or a tensor in client shared memory)."""
        dt = datatypes.datatype(datatype)
        text = ""
        if data is not None and dt is not None and dt.numpy is not None:
            values = np.frombuffer(data, dt.numpy).tolist()
            text = ",".join(str(int(v) if isinstance(v, bool) else v) for v in values)
        self.tensors.append((activity, name, datatype, list(shape), text))

    def leaving(self, req: ClientRequest, msg: m.InferRequest, broker: BrokerClient) -> None:
        """``req`` leaves for the broker as ``msg``: its id, the processes it crosses first,
        its inputs at TENSORS level, then ``sent``."""
        self.request_id = req.id
        self.attributes |= {"frontend_index": broker.index, "frontend_pid": os.getpid()}
        self.attributes["broker_pid"] = broker.broker_pid
        if self.tensors_level:
            for t in req.inputs:
                self.tensor("TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, t.data)
        self.sent(msg)

    def sent(self, msg: m.InferRequest) -> None:
        """``msg`` leaves for the broker: REQUEST_START, and its stamps begin."""
        now = time.monotonic_ns()
        self.stamps.append(("REQUEST_START", now))
        msg.hops = m.TracedWay(self.id, [now], self.context)

    def outputs(self, answer: list[OutputTensor]) -> None:
        """At TENSORS level: an answer's outputs (a decoupled model's: each response's)."""
        if self.tensors_level:
            for t in answer:
                self.tensor("TENSOR_BACKEND_OUTPUT", t.name, t.datatype, t.shape, t.data)

    def cache_hit(
        self, req: ClientRequest, version: int, looked_up: int, answer: list[OutputTensor]
    ) -> None:
        """``req`` was answered from the response cache, whose lookup began at
        ``looked_up``: as Triton stamps a hit, REQUEST_START and QUEUE_START there and
        REQUEST_END now (no compute), with the attribute ``cache_hit``."""
        self.request_id, self.version = req.id, version
        self.attributes["cache_hit"] = 1
        if self.tensors_level:
            for t in req.inputs:
                self.tensor("TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, t.data)
        self.outputs(answer)
        self.stamps += [("REQUEST_START", looked_up), ("QUEUE_START", looked_up)]
        self.stamp("REQUEST_END")

    def answered(self, resp: m.InferResponse) -> None:
        """Its answer came back: the stamps of the processes it crossed, REQUEST_END."""
        now = time.monotonic_ns()
        if resp.model_version:
            self.version = resp.model_version
        way = resp.hops
        hops = way.hops if isinstance(way, m.TracedAnswer) else way
        if len(hops) >= 2:
            self.stamps.append(("QUEUE_START", hops[1]))
        if isinstance(way, m.TracedAnswer):
            self.stamps.extend(way.stamps)
            self.attributes.update(way.attributes)
            self.children.extend(way.children)
        self.stamps.append(("REQUEST_END", now))
        if len(hops) == len(HOPS):
            points = [*hops, now]
            self.attributes["hops_ns"] = [b - a for a, b in itertools.pairwise(points)]

    def late(self, resp: m.InferResponse | None) -> None:
        """The answer of a request its client left (None: none came, the broker was
        lost): its stamps, then the trace is finished, as Triton finishes a cancelled
        request's trace when the request is released."""
        if resp is not None:
            self.answered(resp)
        self.waiting = False
        if self.finisher is not None:
            self.finisher(self)

    def record(self) -> m.TraceRecord:
        """The trace as the sink takes it (its children's records within; the client's
        trace context, if any, as the attribute ``traceparent``)."""
        if self.traceparent:
            self.attributes["traceparent"] = self.traceparent
        if self.context:
            self.attributes["otel_context"] = self.context
        return m.TraceRecord(
            id=self.id,
            model=self.model,
            version=self.version,
            parent_id=self.parent_id,
            request_id=self.request_id,
            stamps=sorted(self.stamps, key=_ns),  # (stamps from several processes)
            attributes=self.attributes,
            tensors=self.tensors,
            children=[c if isinstance(c, m.TraceRecord) else c.record() for c in self.children],
        )


def otel_context(traceparent: str) -> str:
    """The W3C traceparent a traced request's model span will have (the exporter gives
    the span these ids): in the client's trace if it sent one, else in a new one."""
    parts = traceparent.split("-")
    valid = len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16
    trace_id = parts[1] if valid else secrets.token_hex(16)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


def _ns(stamp: tuple[str, int]) -> int:
    return stamp[1]


@dataclass(slots=True)
class _Sampling:
    """A setting's counters, as Triton's: requests seen, traces left (-1: no limit)."""

    setting: m.TraceSetting
    seen: int = 0
    left: int = -1


class Tracer:
    """Which of this frontend's requests are traced, under the broker's trace settings
    (``apply``). Not thread-safe: used on the frontend's event loop only."""

    def __init__(self, index: int, sink: Sink) -> None:
        self.active = False  # some setting traces something: the one check when off
        self.mode = "triton"
        self.table = m.TraceTable()
        self._sink = sink
        self._ids = itertools.count((index << 32) + 1)
        self.next_id: Callable[[], int] = self._ids.__next__
        self._sampling: dict[str, _Sampling] = {}

    def apply(self, table: m.TraceTable) -> None:
        """The broker's settings: counters restart where a setting changed (an update
        of the global setting changes those of the models that follow it too)."""
        old = self._sampling
        self.table, self.mode = table, table.mode
        self._sampling = {}
        for name, setting in [("", table.default), *table.models.items()]:
            reason = invalid_reason(setting, table.mode)
            # (opentelemetry at rate 0 traces the requests that carry a trace context)
            if reason and not (reason == RATE_ZERO and table.mode == "opentelemetry"):
                continue
            kept = old.get(name)
            if kept is not None and kept.setting == setting:
                self._sampling[name] = kept
            else:
                self._sampling[name] = _Sampling(setting, left=setting.count)
        self.active = bool(self._sampling)

    def setting(self, model: str) -> m.TraceSetting:
        return self.table.models.get(model, self.table.default)

    def sample(self, model: str, traceparent: str = "") -> Trace | None:
        """A trace for a request to ``model`` if it is sampled (one in ``rate``, while
        ``count`` lasts); in opentelemetry mode a client's trace context always is."""
        key = model if model in self.table.models else ""
        s = self._sampling.get(key)
        if s is None:
            return None
        s.seen += 1
        forced = bool(traceparent) and self.mode == "opentelemetry"
        rate = s.setting.rate
        if not forced and (not rate or s.seen % rate != 0 or s.left == 0):
            return None
        if s.left > 0:
            s.left -= 1
        tensors = "TENSORS" in s.setting.levels
        context = otel_context(traceparent) if self.mode == "opentelemetry" else ""
        return Trace(self.next_id(), model, self.next_id, tensors_level=tensors,
                     traceparent=traceparent, last=s.left == 0, setting=s.setting,
                     context=context)  # fmt: skip

    def finish(self, trace: Trace) -> None:
        """``trace`` is complete: to the sink, under the setting that sampled it (the
        last one ``count`` allows flushes its file, as Triton writes its traces when the
        count runs out)."""
        if trace.waiting:  # (finished when its answer comes: Trace.late)
            trace.finisher = self.finish
            return
        setting = trace.setting or self.setting(trace.model)
        self._sink(trace.record(), setting, trace.last, self.mode)

    def remaining(self, model: str) -> int | None:
        """Traces ``model``'s setting may still take here (-1: no limit)."""
        key = model if model in self.table.models else ""
        s = self._sampling.get(key)
        return None if s is None else s.left
