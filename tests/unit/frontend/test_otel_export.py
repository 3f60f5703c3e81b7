"""A finished trace as OpenTelemetry spans (shoal/frontend/otel_export.py), caught by the
SDK's in-memory exporter: an ensemble with a step that made a BLS call, in a client's
trace."""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shoal.frontend.otel_export import HOP_SPAN, OtelExporter, resource_attributes
from shoal.ipc.messages import TraceRecord

MODEL = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]  # fmt: skip


def _model(id_: int, model: str, parent: int, at: int) -> TraceRecord:
    stamps = [(name, at + 10 * i) for i, name in enumerate(MODEL)]
    return TraceRecord(id_, model, 1, parent, stamps=stamps,
                       attributes={"worker_pid": 7, "batch_companions": [3, 4],
                                   "hops_ns": [1, 2, 3, 4, 5]})  # fmt: skip


def test_an_ensemble_its_step_and_a_bls_call_nest_in_the_clients_trace() -> None:
    caught = InMemorySpanExporter()
    exporter = OtelExporter({"resource": "service.name=s,k=v"}, 0, SimpleSpanProcessor(caught))
    bls = _model(3, "called", 2, 1030)
    step = _model(2, "bls", 1, 1010)
    step.children = [bls]
    client_trace, client_span = "ab" * 16, "cd" * 8
    root = TraceRecord(1, "ens", 1, stamps=[("HTTP_RECV_START", 1000), ("REQUEST_START", 1001),
                                            ("REQUEST_END", 1200), ("HTTP_SEND_END", 1201)],
                       attributes={"traceparent": f"00-{client_trace}-{client_span}-01"},
                       children=[step])  # fmt: skip
    exporter.export(root)
    exporter.shutdown()
    spans = {(s.name, s.attributes.get("triton.trace_id")): s for s in caught.get_finished_spans()}
    top = spans[("InferRequest", None)]
    ens, step_span, called = spans[("ens", 1)], spans[("bls", 2)], spans[("called", 3)]
    assert format(top.context.trace_id, "032x") == client_trace
    assert top.parent is not None and format(top.parent.span_id, "016x") == client_span
    assert ens.parent.span_id == top.context.span_id  # type: ignore[union-attr]
    assert step_span.parent.span_id == ens.context.span_id  # type: ignore[union-attr]
    assert called.parent.span_id == step_span.context.span_id  # type: ignore[union-attr]
    computes = [s for s in caught.get_finished_spans() if s.name == "compute"]
    assert {s.parent.span_id for s in computes} == {  # type: ignore[union-attr]
        step_span.context.span_id,
        called.context.span_id,
    }
    assert called.attributes["shoal.batch_companions"] == (3, 4)
    assert [called.attributes[f"shoal.hop.{h}_ns"] for h in (
        "frontend_to_broker", "in_broker", "broker_to_worker", "in_worker",
        "worker_to_frontend")] == [1, 2, 3, 4, 5]  # fmt: skip
    assert [e.name for e in called.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert top.resource.attributes["k"] == "v" and top.resource.attributes["service.name"] == "s"
    assert top.start_time < ens.start_time < called.start_time < called.end_time < top.end_time
    assert HOP_SPAN not in {s.name for s in caught.get_finished_spans()}  # (off by default)


def test_hop_spans_name_the_processes_and_time_each_hop() -> None:
    """With ``hop_spans=true`` each model span whose way was measured has a shoal.hops
    child: its processes and batch, and one event per hop, when the hop ended, saying
    from where to where and how long it took; Triton's spans keep their own events."""
    caught = InMemorySpanExporter()
    exporter = OtelExporter({"hop_spans": "true"}, 0, SimpleSpanProcessor(caught))
    step = _model(2, "step", 1, 1010)
    step.attributes |= {"frontend_index": 0, "frontend_pid": 11, "broker_pid": 12,
                        "instance": "step_0", "batch_size": 3}  # fmt: skip
    hit = TraceRecord(3, "cached", 1, 1, stamps=[("REQUEST_START", 1005), ("REQUEST_END", 1006)],
                      attributes={"cache_hit": 1})  # fmt: skip
    root = TraceRecord(1, "ens", 1, stamps=[("HTTP_RECV_START", 1000), ("REQUEST_START", 1001),
                                            ("REQUEST_END", 1200), ("HTTP_SEND_END", 1201)],
                       children=[step, hit])  # fmt: skip
    exporter.export(root)
    exporter.shutdown()
    spans = caught.get_finished_spans()
    hops = [s for s in spans if s.name == HOP_SPAN]
    assert len(hops) == 1  # (the ensemble's own way and the cache hit's were not measured)
    step_span = next(s for s in spans if s.name == "step")
    assert hops[0].parent.span_id == step_span.context.span_id  # type: ignore[union-attr]
    assert [e.name for e in step_span.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert hops[0].attributes["shoal.worker_pid"] == 7
    assert hops[0].attributes["shoal.batch_size"] == 3
    assert hops[0].attributes["shoal.batch_companions"] == (3, 4)
    frontend, broker, worker = "frontend 0 (pid 11)", "broker (pid 12)", "worker step_0 (pid 7)"
    offset = exporter.offset
    got = [(e.name, e.timestamp - offset, dict(e.attributes)) for e in hops[0].events]  # type: ignore[union-attr,operator]
    assert got == [
        (name, 1010 + at, {"shoal.hop.from": a, "shoal.hop.to": b, "shoal.hop.duration_ns": ns})
        for name, at, a, b, ns in (
            ("frontend_to_broker", 1, frontend, broker, 1),
            ("in_broker", 3, broker, broker, 2),
            ("broker_to_worker", 6, broker, worker, 3),
            ("in_worker", 10, worker, worker, 4),
            ("worker_to_frontend", 15, worker, frontend, 5),
        )
    ]
    assert hops[0].start_time == 1010 + offset and hops[0].end_time == 1070 + offset


def test_resource_attributes_start_from_tritons_service_name() -> None:
    assert resource_attributes({}) == {"service.name": "triton-inference-server"}


def test_the_model_span_has_the_context_its_python_model_was_given() -> None:
    """In opentelemetry mode the frontend picks the model span's ids before the request
    runs (a Python model reads them: request.trace().get_context()); the exported span
    has them, in the client's trace or in a new one."""
    from shoal.dataplane.tracing import otel_context

    caught = InMemorySpanExporter()
    exporter = OtelExporter({}, 0, SimpleSpanProcessor(caught))
    client = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    given = [otel_context(client), otel_context("")]
    assert given[0].split("-")[1] == "ab" * 16 and given[1].split("-")[1] != "ab" * 16
    for i, context in enumerate(given):
        attrs: dict[str, int | str | list[int]] = {"otel_context": context}
        if i == 0:
            attrs["traceparent"] = client
        exporter.export(_record_with(i + 1, attrs))
    exporter.shutdown()
    models = [s for s in caught.get_finished_spans() if s.name == "m"]
    seen = [f"00-{s.context.trace_id:032x}-{s.context.span_id:016x}-01" for s in models]
    assert seen == given
    tops = [s for s in caught.get_finished_spans() if s.name == "InferRequest"]
    assert [format(s.context.trace_id, "032x") for s in tops] == [g.split("-")[1] for g in given]


def _record_with(id_: int, attributes: dict[str, int | str | list[int]]) -> TraceRecord:
    stamps = [("REQUEST_START", 10), ("REQUEST_END", 20)]
    return TraceRecord(id_, "m", 1, stamps=stamps, attributes=attributes)


def test_a_full_queue_is_logged_in_tritons_words(caplog: Any) -> None:
    exporter = OtelExporter({}, 0, SimpleSpanProcessor(InMemorySpanExporter()))
    logging.getLogger("opentelemetry.sdk._shared_internal").warning("Queue full, dropping %s.",
                                                                     "Span")  # fmt: skip
    exporter.shutdown()
    assert "BatchSpanProcessor queue is full - dropping span." in caplog.messages


def test_batch_span_processor_settings_the_sdk_would_refuse_are_taken_as_tritons() -> None:
    from shoal.frontend.otel_export import MIN_DELAY_MS, bsp_arguments

    assert bsp_arguments({}) == (2048, 5000.0, 512)
    assert bsp_arguments({"bsp_max_queue_size": "1"}) == (1, 5000.0, 1)  # (a batch: the queue)
    assert bsp_arguments({"bsp_schedule_delay": "0"}) == (2048, MIN_DELAY_MS, 1)  # at once
    OtelExporter({"bsp_max_queue_size": "1", "bsp_schedule_delay": "0"}, 0).shutdown()
