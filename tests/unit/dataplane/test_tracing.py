"""Which requests are traced and what a trace records (shoal/dataplane/tracing.py)."""

from __future__ import annotations

import msgspec

from shoal.dataplane.broker_client import HOPS
from shoal.dataplane.tracing import Tracer
from shoal.ipc import messages as m

ON = m.TraceSetting(levels=("TIMESTAMPS",), rate=3, count=2, file="/f")


def _tracer(table: m.TraceTable) -> tuple[Tracer, list[tuple[m.TraceRecord, bool]]]:
    got: list[tuple[m.TraceRecord, bool]] = []
    t = Tracer(0, lambda r, s, last, mode: got.append((r, last)))
    t.apply(table)
    return t, got


def test_off_is_one_false_attribute() -> None:
    t, _ = _tracer(m.TraceTable())
    assert t.active is False and t.sample("m") is None


def test_one_in_rate_while_the_count_lasts_and_the_last_one_says_so() -> None:
    t, got = _tracer(m.TraceTable(default=ON))
    sampled = [t.sample("m") for _ in range(9)]
    ids = [s.id for s in sampled if s is not None]
    assert [i for i, s in enumerate(sampled) if s is not None] == [2, 5] and ids == [1, 2]
    for s in sampled:
        if s is not None:
            t.finish(s)
    assert [last for _, last in got] == [False, True]
    assert t.remaining("m") == 0


def test_a_model_of_its_own_and_counters_kept_across_an_unrelated_change() -> None:
    table = m.TraceTable(default=ON, models={"x": m.TraceSetting(levels=())})
    t, _ = _tracer(table)
    assert t.sample("x") is None
    t.sample("m")
    t.apply(m.TraceTable(default=ON, models={}))  # the global setting as it was: kept
    t.sample("m")
    assert t.sample("m") is not None  # the third request since the start
    t.apply(m.TraceTable(default=msgspec.structs.replace(ON, rate=2)))  # changed: afresh
    assert t.sample("m") is None and t.sample("m") is not None


def test_opentelemetry_traces_every_request_with_a_client_context() -> None:
    setting = m.TraceSetting(levels=("TIMESTAMPS",), rate=0)
    t, _ = _tracer(m.TraceTable(mode="opentelemetry", default=setting))
    assert t.active and t.sample("m") is None
    trace = t.sample("m", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert trace is not None and trace.traceparent.startswith("00-")


def test_a_trace_takes_the_stamps_of_the_processes_it_crossed() -> None:
    t, _ = _tracer(m.TraceTable(default=ON))
    for _ in range(2):
        t.sample("m")
    trace = t.sample("m")
    assert trace is not None
    step = trace.child("step")
    req = m.InferRequest(1, "m", -1, [], [])
    trace.sent(req)
    assert isinstance(req.hops, m.TracedWay) and req.hops.id == trace.id
    req = m.decode(b"I", m.encode_payload(req))  # type: ignore[assignment]
    assert isinstance(req.hops, m.TracedWay)
    (start,) = req.hops.stamps
    hops = [start, start + 10, start + 20, start + 30, start + 40]
    way = m.TracedAnswer(hops, [("COMPUTE_START", start + 30)], {"worker_pid": 7})
    resp = m.decode_response(m.encode_payload(m.InferResponse(1, model_version=3, hops=way)))
    trace.answered(resp)
    r = trace.record()
    assert [n for n, _ in r.stamps] == ["REQUEST_START", "QUEUE_START", "COMPUTE_START",
                                        "REQUEST_END"]  # fmt: skip
    assert r.version == 3 and r.attributes["worker_pid"] == 7
    hops = r.attributes["hops_ns"]
    assert isinstance(hops, list) and len(hops) == len(HOPS) and hops[:4] == [10] * 4
    assert [c.parent_id for c in r.children] == [trace.id] and r.children[0].id == step.id


def test_tensors_are_recorded_as_tritons_file_shows_them() -> None:
    t, _ = _tracer(m.TraceTable(default=m.TraceSetting(("TENSORS",), rate=1, file="/f")))
    trace = t.sample("m")
    assert trace is not None and trace.tensors_level
    trace.tensor(
        "TENSOR_QUEUE_INPUT", "A", "INT32", [1, 3], memoryview(b"\1\0\0\0\2\0\0\0\3\0\0\0")
    )
    trace.tensor("TENSOR_QUEUE_INPUT", "B", "BOOL", [2], memoryview(b"\1\0"))
    trace.tensor("TENSOR_BACKEND_OUTPUT", "S", "BYTES", [1], memoryview(b"\1\0\0\0x"))
    assert trace.record().tensors == [
        ("TENSOR_QUEUE_INPUT", "A", "INT32", [1, 3], "1,2,3"),
        ("TENSOR_QUEUE_INPUT", "B", "BOOL", [2], "1,0"),
        ("TENSOR_BACKEND_OUTPUT", "S", "BYTES", [1], ""),
    ]


def test_a_request_its_client_left_is_finished_when_its_answer_comes() -> None:
    """As Triton finishes a cancelled request's trace when the request is released: the
    adapter's finish waits, and the late answer's stamps (here a broker's refusal of a
    queued request, which brings back the way so far: QUEUE_START) are in the record."""
    t, got = _tracer(m.TraceTable(default=msgspec.structs.replace(ON, rate=1, count=-1)))
    trace = t.sample("m")
    assert trace is not None
    trace.sent(m.InferRequest(1, "m", -1, [], []))
    trace.waiting = True  # (the data plane: cancelled once sent)
    t.finish(trace)
    assert got == []
    error = m.InferResponse(1, [], m.ErrorInfo(7, "Request was cancelled"))
    error.hops = m.TracedAnswer([trace.stamps[0][1], trace.stamps[0][1] + 5], [])
    trace.late(error)
    ((record, _),) = got
    assert [n for n, _ in record.stamps] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    lost = t.sample("m")
    assert lost is not None
    lost.waiting = True
    t.finish(lost)
    lost.late(None)  # the broker was lost: what it has
    assert len(got) == 2
