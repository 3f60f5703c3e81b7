"""A traced request's part in a worker (shoal/workers/trace_note.py)."""

from __future__ import annotations

import msgspec

from shoal.ipc import messages as m
from shoal.workers.trace_note import first_traced, traced_answer


def _item(req_id: int, hops: list[int] | m.TracedWay) -> m.WorkItem:
    return m.WorkItem(b"f", m.InferRequest(req_id, "m", 1, [], [], hops=hops))


def test_compute_phases_follow_the_batch_timings_and_name_the_companions() -> None:
    way = m.TracedWay(8, [1, 2, 3])
    done = m.BatchDone(1, batch_size=3, input_ns=10, infer_ns=100, output_ns=5)
    child = m.TraceRecord(99, "called", parent_id=8)
    answer = traced_answer(way, [7, 9], done, 1000, 1200, {"worker_pid": 42}, [child])
    assert answer.hops == [1, 2, 3, 1000, 1200]
    assert answer.stamps == [("COMPUTE_START", 1000), ("COMPUTE_INPUT_END", 1010),
                             ("COMPUTE_OUTPUT_START", 1110), ("COMPUTE_END", 1115)]  # fmt: skip
    assert answer.attributes == {"worker_pid": 42, "batch_size": 3, "batch_requests": 3,
                                 "batch_companions": [7, 9]}  # fmt: skip
    assert answer.children == [child]


def test_the_first_traced_request_of_a_batch_parents_its_bls_calls() -> None:
    batch = m.ExecuteBatch(1, [_item(1, []), _item(2, [5]), _item(3, m.TracedWay(77, [5]))])
    assert first_traced(batch) == 77
    assert first_traced(m.ExecuteBatch(1, [_item(1, [])])) == 0


def test_an_untraced_request_encodes_as_without_tracing() -> None:
    plain = m.encode_payload(m.InferRequest(1, "m", 1, [], []))
    hops = m.InferRequest.__struct_fields__.index("hops")
    assert msgspec.msgpack.decode(plain)[hops] == []  # (the empty array, one byte, as ever)
    traced = m.decode(b"I", m.encode_payload(m.InferRequest(1, "m", 1, [], [],
                                                            hops=m.TracedWay(3, [4]))))  # fmt: skip
    assert isinstance(traced, m.InferRequest) and traced.hops == m.TracedWay(3, [4])
    answer = msgspec.msgpack.decode(m.encode_payload(m.InferResponse(1)))
    assert answer[m.InferResponse.__struct_fields__.index("hops")] == []
