"""The broker's admission of a request, on a broker whose table is filled by hand (no
workers): what it sends is captured at its one send call (its outbox's)."""

from __future__ import annotations

import os

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from shoal.broker.models import Instance, ModelVersion
from shoal.broker.proc import BrokerProc
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError


def _capture_sends(broker: BrokerProc, monkeypatch: pytest.MonkeyPatch) -> list[list[bytes]]:
    sent: list[list[bytes]] = []
    monkeypatch.setattr(broker.out, "send", lambda sock, frames: sent.append(frames))
    return sent


def _serving(
    broker: BrokerProc, version: int, cfg: mc.ModelConfig
) -> tuple[ModelVersion, Instance]:
    """Version ``version`` of "simple" with one idle READY instance, as a worker's
    WorkerReady would leave it."""
    broker.table.add_model("simple", {version: 1}, "onnxruntime_onnx")
    mv = broker.table.version("simple", version)
    assert mv is not None
    mv.set_config(cfg.SerializeToString())
    inst = Instance(b"w0", "simple", version, 0, os.getpid(), state="READY")
    mv.instances[inst.ident] = inst
    broker.table.by_ident[inst.ident] = inst
    mv.refresh_state()
    broker.router.instance_ready(inst, 0.0)
    return mv, inst


def test_an_ordered_request_for_the_latest_version_gets_its_answer(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # preserve_ordering holds each answer until the ones before it left; a request that
    # named version -1 must still find its version's order when its answer comes.
    sent = _capture_sends(broker, monkeypatch)
    cfg = mc.ModelConfig(name="simple", max_batch_size=8)
    cfg.dynamic_batching.preserve_ordering = True
    _, inst = _serving(broker, 3, cfg)

    broker._on_infer(b"fe", m.InferRequest(1, "simple", -1, [], []))
    assert inst.in_flight is not None
    (item,) = inst.in_flight.items
    assert item.seq == 1 and item.request.version == 3
    broker.out.fail_item(item, ServingError(Code.INTERNAL, "boom"))
    (answer,) = [f for f in sent if f[1] == m.RESULT]
    assert answer[0] == b"fe"
    resp = m.decode_response(answer[2])
    assert resp.req_id == 1 and resp.error is not None and resp.error.message == "boom"


@pytest.mark.parametrize("rejoin", [True, False])
def test_after_a_broker_restart_a_version_serves_with_the_instances_that_came_back(
    broker: BrokerProc, rejoin: bool
) -> None:
    # Two instances expected; only one greets this (new) broker. Having served under the
    # last broker, it makes its version READY; a first-time greeting waits for both.
    broker.table.add_model("simple", {1: 2}, "onnxruntime_onnx")
    mv = broker.table.version("simple", 1)
    assert mv is not None
    cfg = mc.ModelConfig(name="simple").SerializeToString()
    hello = m.WorkerHello("simple", 1, 0, os.getpid(), rejoin)
    broker._on_worker([b"w0", *m.encode(hello)])
    assert mv.state == "LOADING"
    broker._on_worker([b"w0", *m.encode(m.WorkerReady(cfg))])
    assert mv.state == ("READY" if rejoin else "LOADING")
    assert broker.table.startup_done() is rejoin


def test_a_request_the_broker_fails_to_admit_is_answered_not_dropped(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _capture_sends(broker, monkeypatch)
    mv, inst = _serving(broker, 1, mc.ModelConfig(name="simple"))

    def broken(req: m.InferRequest) -> list[m.ClientRegion]:
        raise KeyError("a bug")

    monkeypatch.setattr(broker.client_regions, "resolve", broken)
    broker._on_infer(b"fe", m.InferRequest(5, "simple", 1, [], []))
    ((fe, kind, payload),) = sent
    resp = m.decode_response(payload)
    assert (fe, kind, resp.req_id) == (b"fe", m.RESULT, 5)
    assert resp.error is not None and resp.error.code == int(Code.INTERNAL)
    assert resp.error.message == "KeyError: 'a bug'"
    assert len(mv.queue) == 0 and inst.in_flight is None


def test_every_request_of_a_frontend_s_message_is_admitted_in_order(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frontend sends the requests of one turn of its loop as one message; a malformed
    # one among them is dropped, and the others still run.
    sent = _capture_sends(broker, monkeypatch)
    mv, inst = _serving(broker, 1, mc.ModelConfig(name="simple"))
    kind = m.KINDS[m.InferRequest]
    reqs = [m.encode_payload(m.InferRequest(i, "simple", 1, [], [])) for i in (1, 2, 3)]
    broker._on_frontend([b"fe", kind, reqs[0], b"\xc1 not msgpack", reqs[1], reqs[2]])
    assert inst.in_flight is not None
    assert [it.request.req_id for it in inst.in_flight.items] == [1]
    assert [it.request.req_id for it in mv.queue] == [2, 3]
    ((worker, batch_kind, _),) = sent
    assert (worker, batch_kind) == (inst.ident, m.KINDS[m.ExecuteBatch])


def test_requests_that_arrive_together_are_batched_together(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # max_queue_delay 0 sends whatever is queued when an instance is idle: the group's
    # first request must not leave alone while the others wait for its batch to end.
    sent = _capture_sends(broker, monkeypatch)
    cfg = mc.ModelConfig(name="simple", max_batch_size=8)
    cfg.dynamic_batching.SetInParent()
    _, inst = _serving(broker, 1, cfg)
    kind = m.KINDS[m.InferRequest]
    reqs = [m.encode_payload(m.InferRequest(i, "simple", 1, [], [])) for i in (1, 2, 3)]
    broker._on_frontend([b"fe", kind, *reqs])
    assert inst.in_flight is not None
    assert [it.request.req_id for it in inst.in_flight.items] == [1, 2, 3]
    assert len(sent) == 1


def test_a_group_fills_a_bounded_queue_only_after_an_idle_instance_took_its_batch(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # max_queue_size 2: a group of 5 is not refused for the requests an idle instance
    # would have taken anyway. The instance takes the first two; the next two queue;
    # the fifth finds the queue full while the instance is busy.
    sent = _capture_sends(broker, monkeypatch)
    cfg = mc.ModelConfig(name="simple", max_batch_size=8)
    cfg.dynamic_batching.default_queue_policy.max_queue_size = 2
    mv, inst = _serving(broker, 1, cfg)
    kind = m.KINDS[m.InferRequest]
    reqs = [m.encode_payload(m.InferRequest(i, "simple", 1, [], [])) for i in range(1, 6)]
    broker._on_frontend([b"fe", kind, *reqs])
    assert inst.in_flight is not None
    assert [it.request.req_id for it in inst.in_flight.items] == [1, 2]
    refused = [m.decode_response(f[2]) for f in sent if f[1] == m.RESULT]
    assert [r.req_id for r in refused] == [5]
    assert refused[0].error is not None and refused[0].error.code == int(Code.UNAVAILABLE)
    assert refused[0].error.message == "Exceeds maximum queue size"
    assert mv.batcher is not None and len(mv.batcher) == 2


def test_a_request_that_fails_in_a_group_strands_none_of_the_others(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bug while queueing the second request: it is answered (INTERNAL), the third is
    # still admitted, and the queued ones are dispatched without waiting for a message.
    sent = _capture_sends(broker, monkeypatch)
    mv, inst = _serving(broker, 1, mc.ModelConfig(name="simple"))
    submit = broker.router.submit

    def failing(mv: ModelVersion, item: m.WorkItem, now: float, dispatch: bool = True) -> object:
        if item.request.req_id == 2:
            raise KeyError("a bug")
        return submit(mv, item, now, dispatch)

    monkeypatch.setattr(broker.router, "submit", failing)
    kind = m.KINDS[m.InferRequest]
    reqs = [m.encode_payload(m.InferRequest(i, "simple", 1, [], [])) for i in (1, 2, 3)]
    broker._on_frontend([b"fe", kind, *reqs])
    assert inst.in_flight is not None
    assert [it.request.req_id for it in inst.in_flight.items] == [1]
    assert [it.request.req_id for it in mv.queue] == [3]
    (refused,) = [m.decode_response(f[2]) for f in sent if f[1] == m.RESULT]
    assert refused.req_id == 2 and refused.error is not None
    assert (refused.error.code, refused.error.message) == (int(Code.INTERNAL), "KeyError: 'a bug'")


def test_a_request_queued_before_a_failure_is_left_to_its_batch(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failure comes after the request was queued: its batch answers it, not an error
    # now (it would be answered twice), and the batch still goes out at once.
    sent = _capture_sends(broker, monkeypatch)
    mv, inst = _serving(broker, 1, mc.ModelConfig(name="simple"))

    def failing(clients: list[m.ClientRegion]) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(broker.client_regions, "acquire", failing)
    kind = m.KINDS[m.InferRequest]
    reqs = [m.encode_payload(m.InferRequest(i, "simple", 1, [], [])) for i in (1, 2)]
    broker._on_frontend([b"fe", kind, *reqs])
    assert inst.in_flight is not None
    assert [it.request.req_id for it in inst.in_flight.items] == [1]
    assert [it.request.req_id for it in mv.queue] == [2]
    assert not [f for f in sent if f[1] == m.RESULT]
