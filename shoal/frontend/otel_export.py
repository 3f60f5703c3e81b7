"""OpenTelemetry mode: each finished trace as spans, exported by the official SDK's batch
span processor over OTLP/HTTP to ``url`` (default http://localhost:4318/v1/traces), as
Triton exports. Runs on the trace sink's thread (shoal/frontend/trace_sink.py).

Spans, as Triton's: a top-level span per request (received -> answer sent), a model span
per trace (REQUEST_START -> REQUEST_END, with its timestamps as events) and a compute
span (COMPUTE_START -> COMPUTE_END); an ensemble's steps and a Python model's BLS
requests are model spans within their parent's. A client's W3C ``traceparent`` makes
the top-level span a child of the client's span, in the client's trace. Beyond Triton,
the spans say which processes did the work and which batch the request ran in
(``shoal.*`` attributes), and how long each hop between processes took
(``shoal.hop.<hop>_ns``); the spans' events are Triton's, no more (its QA checks them).
With the option ``hop_spans=true`` a model span whose way was measured has one more
child, ``shoal.hops``: one event per hop (``hop_events``), naming the processes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from shoal.dataplane.broker_client import HOPS
from shoal.ipc import messages as m

DEFAULT_URL = "http://localhost:4318/v1/traces"
_SCALARS = (int, str, float, bool)
#: The top-level span's events, as Triton's: the protocol's stamps.
_PROTOCOL = frozenset(
    ("HTTP_RECV_START", "HTTP_RECV_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
     "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START",
     "GRPC_SEND_END")
)  # fmt: skip


#: Each leg of a request's way (HOPS' order): the process it leaves, the one that handles it.
_LEGS = (("frontend", "broker"), ("broker", "broker"), ("broker", "worker"),
         ("worker", "worker"), ("worker", "frontend"))  # fmt: skip
HOP_SPAN = "shoal.hops"
Event = tuple[str, int, dict[str, str | int]]


def hop_spans(options: dict[str, str]) -> bool:
    """Whether the option ``hop_spans`` (``true`` or ``false``, as the trace flags'
    parser leaves it) asks for ``shoal.hops`` spans; off by default: tools written for
    Triton, its QA among them, count a request's spans."""
    return options.get("hop_spans") == "true"


def processes(attributes: dict[str, int | str | list[int]]) -> dict[str, str]:
    """The processes a traced request crossed, by role, as its hop events name them."""
    a = attributes
    return {
        "frontend": f"frontend {a.get('frontend_index', '?')} (pid {a.get('frontend_pid', '?')})",
        "broker": f"broker (pid {a.get('broker_pid', '?')})",
        "worker": f"worker {a.get('instance', '?')} (pid {a.get('worker_pid', '?')})",
    }


def hop_events(r: m.TraceRecord) -> list[Event]:
    """The events of ``r``'s ``shoal.hops`` span: per leg of its way (HOPS), when the
    leg ended (monotonic ns), with the process it left (``shoal.hop.from``), the one
    that handled it (``shoal.hop.to``; the same one for the time inside a process) and
    its duration (``shoal.hop.duration_ns``). None for a trace whose way was not
    measured (a cache hit, a request refused before it left)."""
    hops = r.attributes.get("hops_ns")
    at = dict(r.stamps).get("REQUEST_START")  # (the way's first stamp)
    if not isinstance(hops, list) or len(hops) != len(HOPS) or at is None:
        return []
    names = processes(r.attributes)
    events: list[Event] = []
    for hop, (left, to), ns in zip(HOPS, _LEGS, hops, strict=True):
        at += ns
        attrs: dict[str, str | int] = {"shoal.hop.from": names[left], "shoal.hop.to": names[to],
                                       "shoal.hop.duration_ns": ns}  # fmt: skip
        events.append((hop, at, attrs))
    return events


def resource_attributes(options: dict[str, str]) -> dict[str, str]:
    """``resource=key=value`` settings (several joined by ","), after Triton's default."""
    attrs = {"service.name": "triton-inference-server"}
    for pair in filter(None, options.get("resource", "").split(",")):
        key, _, value = pair.partition("=")
        attrs[key.strip()] = value.strip()
    return attrs


def endpoint(url: str) -> str:
    """``url`` as the exporter takes it: Triton's (opentelemetry-cpp's) exporter takes
    ``host:port/path`` without a scheme, which means http."""
    return url if "://" in url else f"http://{url}"


#: The shortest export delay the SDK's processor is given (ms): it refuses 0, which
#: opentelemetry-cpp takes as "export at once"; its worker then waits this long at most.
MIN_DELAY_MS = 1.0


def bsp_arguments(options: dict[str, str]) -> tuple[int, float, int]:
    """The batch span processor's queue size, export delay (ms) and export batch size,
    as opentelemetry-cpp takes them: the Python SDK refuses a delay of 0 (it means at
    once: batches of one span, the worker waking every MIN_DELAY_MS) and a batch larger
    than the queue (a batch is the whole queue then)."""
    queue = max(1, int(options.get("bsp_max_queue_size", 2048)))
    delay = float(options.get("bsp_schedule_delay", 5000))
    batch = min(queue, max(1, int(options.get("bsp_max_export_batch_size", 512))))
    if delay <= 0:  # at once: each span goes out as it ends
        return queue, MIN_DELAY_MS, 1
    return queue, delay, batch


def _shoal_attributes(span: Any, attributes: dict[str, int | str | list[int]]) -> None:
    """A trace's process and batch attributes on ``span``, as ``shoal.<name>`` (the
    hops are set apart: ``shoal.hop.<hop>_ns``, or ``hop_events``)."""
    for key, value in attributes.items():
        if key != "hops_ns" and (isinstance(value, _SCALARS) or value):
            span.set_attribute(f"shoal.{key}", value)


class _TritonWords(logging.Filter):
    """The SDK's warning of a full queue in opentelemetry-cpp's words, which Triton logs
    (and its QA greps for)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().lower().startswith("queue full, dropping span"):
            record.msg, record.args = "BatchSpanProcessor queue is full - dropping span.", ()
        return True


class _PresetIds(RandomIdGenerator):  # type: ignore[misc]
    """The SDK's random ids, but for the ids preset for the next trace and the next span
    (each taken once): a traced request's model span keeps the context its model was
    given while it ran. Used on the sink's thread only."""

    def __init__(self) -> None:
        self.trace = self.span = self.model_span = 0

    def generate_trace_id(self) -> int:
        trace_id, self.trace = self.trace, 0
        return trace_id or int(super().generate_trace_id())

    def generate_span_id(self) -> int:
        span_id, self.span = self.span, 0
        return span_id or int(super().generate_span_id())


class OtelExporter:
    """A tracer provider of its own (the process's global one is left alone)."""

    def __init__(self, options: dict[str, str], frontend: int, processor: Any = None) -> None:
        """``processor``: the span processor (None: the batch span processor over the
        OTLP/HTTP exporter, as the options say)."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.ids = _PresetIds()
        self.provider = TracerProvider(
            resource=Resource.create(resource_attributes(options)),
            id_generator=self.ids,
        )
        if processor is None:
            queue, delay, batch = bsp_arguments(options)
            processor = BatchSpanProcessor(
                OTLPSpanExporter(endpoint=endpoint(options.get("url", DEFAULT_URL))),
                max_queue_size=queue,
                schedule_delay_millis=delay,
                max_export_batch_size=batch,
            )
        self.provider.add_span_processor(processor)
        logging.getLogger("opentelemetry.sdk._shared_internal").addFilter(_TritonWords())
        self.tracer = self.provider.get_tracer("shoal")
        self.propagator = TraceContextTextMapPropagator()
        self.frontend = frontend
        self.hop_spans = hop_spans(options)
        # monotonic stamps -> the wall clock OpenTelemetry wants (one host: one offset)
        self.offset = time.time_ns() - time.monotonic_ns()

    def export(self, record: m.TraceRecord) -> None:
        from opentelemetry import trace

        traceparent = record.attributes.pop("traceparent", "")
        context = record.attributes.pop("otel_context", "")
        assert isinstance(traceparent, str) and isinstance(context, str)
        ctx = self.propagator.extract({"traceparent": traceparent}) if traceparent else None
        if context:  # the ids its model saw (request.trace().get_context())
            _, trace_id, span_id, _ = context.split("-")
            self.ids.trace, self.ids.model_span = int(trace_id, 16), int(span_id, 16)
        first = min((ns for _, ns in record.stamps), default=time.monotonic_ns())
        last = max((ns for _, ns in record.stamps), default=first)
        top = self.tracer.start_span("InferRequest", context=ctx, start_time=first + self.offset)
        self.ids.trace = 0  # (unused where the client's context gave the trace)
        self.ids.span, self.ids.model_span = self.ids.model_span, 0  # the next: its model's
        top.set_attribute("shoal.frontend.index", self.frontend)
        for name, ns in record.stamps:  # (a decoupled model's: a send per response)
            if name in _PROTOCOL:
                top.add_event(name, timestamp=ns + self.offset)
        self._model_span(record, trace.set_span_in_context(top))
        top.end(end_time=last + self.offset)

    def _model_span(self, r: m.TraceRecord, ctx: Any) -> None:
        from opentelemetry import trace

        stamps = dict(r.stamps)
        start = stamps.get("REQUEST_START", r.stamps[0][1] if r.stamps else time.monotonic_ns())
        span = self.tracer.start_span(r.model, context=ctx, start_time=start + self.offset)
        span.set_attribute("triton.model_name", r.model)
        span.set_attribute("triton.model_version", r.version)
        span.set_attribute("triton.trace_id", r.id)
        span.set_attribute("triton.trace_parent_id", r.parent_id)
        if r.request_id:
            span.set_attribute("triton.request_id", r.request_id)
        _shoal_attributes(span, r.attributes)
        for name in ("REQUEST_START", "QUEUE_START", "REQUEST_END"):
            if name in stamps:
                span.add_event(name, timestamp=stamps[name] + self.offset)
        hops = r.attributes.get("hops_ns")
        if isinstance(hops, list):  # (attributes: the span's events stay Triton's own)
            for hop, ns in zip(HOPS, hops, strict=False):
                span.set_attribute(f"shoal.hop.{hop}_ns", ns)
        if "COMPUTE_START" in stamps and "COMPUTE_END" in stamps:
            inner = trace.set_span_in_context(span)
            compute = self.tracer.start_span(
                "compute", context=inner, start_time=stamps["COMPUTE_START"] + self.offset
            )
            for name in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                         "COMPUTE_END"):  # fmt: skip
                if name in stamps:
                    compute.add_event(name, timestamp=stamps[name] + self.offset)
            compute.end(end_time=stamps["COMPUTE_END"] + self.offset)
        if self.hop_spans:
            self._hop_span(r, trace.set_span_in_context(span))
        for child in r.children:
            self._model_span(child, trace.set_span_in_context(span))
        end = stamps.get("REQUEST_END", start)
        span.end(end_time=end + self.offset)

    def _hop_span(self, r: m.TraceRecord, ctx: Any) -> None:
        """``r``'s ``shoal.hops`` span (REQUEST_START -> REQUEST_END, in ``ctx``): the
        processes and the batch as attributes, an event per hop (``hop_events``)."""
        events = hop_events(r)
        if not events:
            return
        stamps = dict(r.stamps)
        start = stamps["REQUEST_START"] + self.offset
        span = self.tracer.start_span(HOP_SPAN, context=ctx, start_time=start)
        _shoal_attributes(span, r.attributes)
        for name, ns, attrs in events:
            span.add_event(name, attributes=attrs, timestamp=ns + self.offset)
        span.end(end_time=stamps.get("REQUEST_END", events[-1][1]) + self.offset)

    def shutdown(self) -> None:
        self.provider.shutdown()
