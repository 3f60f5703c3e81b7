"""OpenTelemetry mode: a request's spans reach a real OTLP/HTTP receiver (the test's,
from the OTLP protobuf definitions), in the client's own trace when it sends a W3C
traceparent (HTTP header or gRPC metadata), with shoal's process and batch attributes,
a shoal.hops span (hop_spans=true) with an event per hop naming the processes, and the
hops in /metrics."""

from __future__ import annotations

import queue
import secrets
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.otlp_receiver import OtlpReceiver, Span
from tests.serverctl import ShoalServer
from tools import modelgen


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("otel")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    srv = ShoalServer(
        repo,
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0",  # (Triton's way: only requests with a trace context)
        f"--trace-config=opentelemetry,url={receiver.url}",
        "--trace-config=opentelemetry,resource=service.name=shoal-test",
        "--trace-config=opentelemetry,bsp_schedule_delay=20",
        "--trace-config=opentelemetry,hop_spans=true",
    )
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def _inputs(module: object) -> list[object]:
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = module.InferInput(name, [1, 16], "INT32")  # type: ignore[attr-defined]
        t.set_data_from_numpy(np.ones((1, 16), np.int32))
        out.append(t)
    return out


def _context() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _of(spans: list[Span], trace_id: str) -> dict[str, Span]:
    return {s.name: s for s in spans if s.trace_id == trace_id}


HOPS = ("frontend_to_broker", "in_broker", "broker_to_worker", "in_worker",
        "worker_to_frontend")  # fmt: skip


def _check_hops(server: ShoalServer, hops: Span, model: Span) -> None:
    """A shoal.hops span within the model span: an event per hop, in order, each
    naming the real processes it went from and to, its duration the model span's
    attribute, and the hops adding up to the way from REQUEST_START to REQUEST_END."""
    assert hops.parent_span_id == model.span_id
    assert (hops.start_ns, hops.end_ns) == (model.start_ns, model.end_ns)
    frontend = f"frontend 0 (pid {server.pids('frontend')[0]})"
    broker = f"broker (pid {server.pids('broker')[0]})"
    (worker_pid,) = server.pids("workers")
    worker = f"worker {hops.attributes['shoal.instance']} (pid {worker_pid})"
    legs = [(frontend, broker), (broker, broker), (broker, worker), (worker, worker),
            (worker, frontend)]  # fmt: skip
    assert [e[0] for e in hops.events] == list(HOPS)
    at = model.start_ns
    for (name, ns, attrs), (left, to) in zip(hops.events, legs, strict=True):
        assert (attrs["shoal.hop.from"], attrs["shoal.hop.to"]) == (left, to)
        assert attrs["shoal.hop.duration_ns"] == model.attributes[f"shoal.hop.{name}_ns"] > 0
        at += attrs["shoal.hop.duration_ns"]
        assert ns == at  # (when the hop ended)
    assert at == model.end_ns
    assert hops.attributes["shoal.worker_pid"] == worker_pid
    assert hops.attributes["shoal.batch_size"] == 1


def test_the_clients_trace_is_continued_over_both_protocols(
    server: ShoalServer, receiver: OtlpReceiver
) -> None:
    http = httpclient.InferenceServerClient(server.url)
    http.infer("simple", _inputs(httpclient))  # no context, rate 0: not traced
    h_trace, h_span, h_parent = _context()
    http.infer("simple", _inputs(httpclient), headers={"traceparent": h_parent})
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    g_trace, g_span, g_parent = _context()
    grpc.infer("simple", _inputs(grpcclient), headers={"traceparent": g_parent})
    s_trace, s_span, s_parent = _context()  # a stream's context: its requests' parent
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put((result, error)),
                      headers={"traceparent": s_parent})  # fmt: skip
    grpc.async_stream_infer("simple", _inputs(grpcclient))
    assert answers.get(timeout=60)[1] is None
    grpc.stop_stream()
    # (one sink thread exports in order: the untraced request's spans, had there been
    # any, would have come with or before these)
    traces = (h_trace, g_trace, s_trace)
    spans = receiver.wait_for(lambda got: all(len(_of(got, t)) == 4 for t in traces))
    assert {s.trace_id for s in spans} == set(traces)
    for trace_id, client_span in ((h_trace, h_span), (g_trace, g_span), (s_trace, s_span)):
        got = _of(spans, trace_id)
        top, model, compute = got["InferRequest"], got["simple"], got["compute"]
        assert top.parent_span_id == client_span  # a child of the client's span
        assert model.parent_span_id == top.span_id and compute.parent_span_id == model.span_id
        _check_hops(server, got["shoal.hops"], model)
        assert top.start_ns <= model.start_ns <= compute.start_ns
        assert compute.end_ns <= model.end_ns <= top.end_ns
        assert top.resource["service.name"] == "shoal-test"
        p = "HTTP" if trace_id == h_trace else "GRPC"
        read = ["HTTP_RECV_START", "HTTP_RECV_END"] if p == "HTTP" else [
            "GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]  # fmt: skip
        assert [e[0] for e in top.events] == [  # Triton's root span events
            *read,
            "INFER_RESPONSE_COMPLETE",
            f"{p}_SEND_START",
            f"{p}_SEND_END",
        ]
        assert model.attributes["triton.model_name"] == "simple"
        assert model.attributes["triton.model_version"] == 1
        assert model.attributes["shoal.worker_pid"] in server.pids("workers")
        assert model.attributes["shoal.batch_size"] == 1
        hops = [model.attributes[f"shoal.hop.{h}_ns"] for h in HOPS]
        assert all(ns > 0 for ns in hops)
        assert [e[0] for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        names = [e[0] for e in compute.events]
        assert names == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                         "COMPUTE_END"]  # fmt: skip
    http.close()
    grpc.close()
    # the three traced requests' hops, in this frontend's histogram
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    assert "# TYPE shoal_hop_duration_us histogram" in text
    for hop in HOPS:
        assert f'shoal_hop_duration_us_count{{frontend="0",hop="{hop}"}} 3' in text
        assert f'shoal_hop_duration_us_bucket{{frontend="0",hop="{hop}",le="+Inf"}} 3' in text
