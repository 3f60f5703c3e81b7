"""Message framing: typed round trips, and malformed input refused."""

from __future__ import annotations

import msgspec
import pytest

from shoal.ipc import messages as m


def test_round_trip_of_every_kind() -> None:
    samples = [
        m.InferRequest(
            1,
            "simple",
            -1,
            [m.TensorRef("INPUT0", "INT32", [1, 16], 64, "r", 128)],
            [m.OutputSpec("OUTPUT0", "r", 256, 64)],
        ),
        m.InferResponse(1, [m.TensorRef("OUTPUT0", "INT32", [1, 16], 64, data=b"\0" * 64)]),
        m.ExecuteBatch(3, [m.WorkItem(b"f-0", m.InferRequest(2, "x", 1, [], []))]),
        m.WorkerHello("simple", 1, 0, 123),
        m.ModelInfo(9, m.ErrorInfo(4, "bad"), "x"),
        m.ServerState(5, True, False, [m.ModelState("x", 1, "READY")]),
        m.ServerState(6, True, True, [], ready_checks=[101, 102]),
        m.RerunDone(m.BatchDone(-1, 2, 10, 20, 30), ok=1, ok_samples=1, failed=1),
        m.FrontendLeaving(),
    ]
    for msg in samples:
        kind, payload = m.encode(msg)
        assert m.decode(kind, payload) == msg


def test_unknown_kind_and_malformed_payload_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown message kind"):
        m.decode(b"?", b"")
    kind, payload = m.encode(m.WorkerHello("simple", 1, 0, 123))
    with pytest.raises(ValueError, match="malformed"):
        m.decode(kind, payload[:-2])
    with pytest.raises(ValueError, match="malformed"):
        m.decode(m.KINDS[m.Welcome], m.encode_payload(m.WorkerFailed("not a welcome")))


def test_a_response_carries_its_parameters_with_their_types() -> None:
    """A response's parameters (a Python model's) travel with it, bool, int and str kept
    apart (msgpack's own types); without them a response is one byte longer than its
    fields before them."""
    plain = m.InferResponse(7, [], None, 1)
    assert m.encode_payload(plain) == msgspec.msgpack.encode([7, [], None, 1, True, False, [], {}])
    given = m.InferResponse(7, [], None, 1, parameters={"b": True, "i": -3, "s": "x"})
    decoded = m.decode_response(m.encode_payload(given))
    assert decoded.parameters == {"b": True, "i": -3, "s": "x"}
    assert type(decoded.parameters["b"]) is bool and type(decoded.parameters["i"]) is int
