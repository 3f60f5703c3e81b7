"""A decoupled model's open requests (shoal/workers/streams.py) without sockets: its responses
go to their frontends as the model sends them, from its threads too; the ones still open
after ``execute`` are reported ended once their final flag went out."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.spec_reader import read_spec
from shoal.ipc import messages as m
from shoal.ipc.errors import Code
from shoal.ipc.shm import RegionMap
from shoal.workers import pb_utils
from shoal.workers.batch_io import BatchAssembler
from shoal.workers.cuda_regions import CudaRegions
from shoal.workers.instance import ModelInstance
from shoal.workers.loading import LoadedModel
from shoal.workers.streams import DecoupledStreams

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_CONFIG = """name: "d" max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }"""


class Decoupled:
    """A decoupled model whose ``execute`` is the test's ``model(senders)``."""

    decoupled = True

    def __init__(self, model: Callable[[list[pb_utils.InferenceResponseSender]], None]) -> None:
        self.model = model

    def requests(self, pairs: list[Any], senders: list[Any]) -> list[Any]:
        return senders

    def execute_decoupled(self, senders: list[Any]) -> str | None:
        self.model(senders)
        return None


class Iterative(Decoupled):
    """A decoupled model of iterative sequences: its ``model(requests)`` gets pb_utils
    requests (each with its sender), which it may reschedule."""

    iterative = True

    def requests(self, pairs: list[Any], senders: list[Any]) -> list[Any]:
        start = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START  # (as the broker gives it)
        return [pb_utils.InferenceRequest([], [], flags=start, sender=s) for s in senders]


class Setup:
    def __init__(self, model: Callable[[list[Any]], None], backend: type = Decoupled) -> None:
        config = read_spec(text_format.Parse(_CONFIG, pb.ModelConfig()))
        loaded = LoadedModel.of(backend(model), config, 1, BatchAssembler.from_config(config))
        self.regions = RegionMap()
        self.core = ModelInstance(loaded, "d", 1, self.regions, CudaRegions(None))
        self.lock = threading.RLock()
        self.sent: list[tuple[bytes, m.InferResponse]] = []
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        where = {"worker_pid": 7, "instance": "d_0"}
        self.streams = DecoupledStreams(
            self.core, "d_0", self.lock, self._answer, lambda: None, self.wake, lambda: where
        )
        self.core.streams = self.streams

    def _answer(self, frontend: bytes, payloads: list[bytes]) -> None:
        self.sent += [(frontend, m.decode_response(p)) for p in payloads]

    def run(self, *req_ids: int, frontend: bytes = b"f-0-1", traced: bool = False) -> m.BatchDone:
        items = [m.WorkItem(frontend, _request(i)) for i in req_ids]
        for item in items if traced else []:  # its frontend's send, the broker's two stamps
            item.request.hops = m.TracedWay(item.request.req_id, [1, 2, 3])
        with self.lock:  # as the worker's loop holds it
            done, answers = self.core.run(m.ExecuteBatch(1, items), 0)
        assert answers == []  # (they went through the senders)
        return done

    def close(self) -> None:
        os.close(self.wake)
        self.regions.close()


def _request(req_id: int) -> m.InferRequest:
    data = np.ones(1, np.float32).tobytes()
    x = m.TensorRef("IN", "FP32", [1], len(data), data=data)
    return m.InferRequest(req_id, "d", 1, [x], [m.OutputSpec("OUT")])


def _response(value: float) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(1, value, np.float32))])


@pytest.fixture
def setup() -> Iterator[Callable[..., Setup]]:
    made: list[Setup] = []

    def make(model: Callable[[list[Any]], None], backend: type = Decoupled) -> Setup:
        made.append(Setup(model, backend))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _values(sent: list[tuple[bytes, m.InferResponse]]) -> list[tuple[int, Any, bool]]:
    out = []
    for _, r in sent:
        value = None if r.empty else float(np.frombuffer(r.outputs[0].data or b"", np.float32)[0])
        out.append((r.req_id, value, r.final))
    return out


def test_responses_sent_within_execute_leave_nothing_open(setup: Callable[..., Setup]) -> None:
    def model(senders: list[pb_utils.InferenceResponseSender]) -> None:
        for s in senders:
            s.send(_response(1.0))
            s.send(_response(2.0), _FINAL)

    s = setup(model)
    done = s.run(1, 2)
    assert (done.batch_size, done.failed, done.open) == (2, [], [])
    assert _values(s.sent) == [(1, 1.0, False), (1, 2.0, True), (2, 1.0, False), (2, 2.0, True)]
    assert s.streams.open == {} and s.streams.take_ended() == []


def test_a_traced_requests_final_response_carries_the_workers_stamps(
    setup: Callable[..., Setup],
) -> None:
    """The worker's part of a traced request to a decoupled model rides on its final
    response (the others carry none): the batch's receipt, its inputs ready, execute's
    return, the final send, in that order, and the process that ran it."""
    kept: list[pb_utils.InferenceResponseSender] = []

    def model(senders: list[pb_utils.InferenceResponseSender]) -> None:
        senders[0].send(_response(1.0))
        kept.extend(senders)

    s = setup(model)
    s.run(4, traced=True)
    kept[0].send(_response(2.0), _FINAL)  # after execute returned
    (_, first), (_, last) = s.sent
    assert first.hops == [] and isinstance(last.hops, m.TracedAnswer)
    names = [n for n, _ in last.hops.stamps]
    assert names == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    times = [ns for _, ns in last.hops.stamps]
    assert times == sorted(times) and times[0] > 3
    assert last.hops.hops == [1, 2, 3, times[0], times[-1]]  # the way, receipt, send
    assert last.hops.attributes == {"worker_pid": 7, "instance": "d_0"}


def test_a_request_answered_later_is_reported_open_then_ended(setup: Callable[..., Setup]) -> None:
    kept: list[pb_utils.InferenceResponseSender] = []
    s = setup(kept.extend)
    done = s.run(5)
    assert done.open == [0] and s.sent == []
    thread = threading.Thread(target=lambda: kept[0].send(_response(3.0), _FINAL))
    thread.start()
    thread.join()
    assert _values(s.sent) == [(5, 3.0, True)]
    assert select.select([s.wake], [], [], 0)[0] == [s.wake]  # the loop is woken
    assert s.streams.take_ended() == [(b"f-0-1", 5)] and s.streams.take_ended() == []


def test_an_execute_that_fails_ends_each_request_not_ended_with_its_error(
    setup: Callable[..., Setup],
) -> None:
    def model(senders: list[pb_utils.InferenceResponseSender]) -> None:
        senders[0].send(None, _FINAL)
        raise RuntimeError("broken")

    s = setup(model)
    done = s.run(1, 2)
    assert done.failed == [1] and done.open == []
    (first, second) = s.sent
    assert first[1].req_id == 1 and first[1].empty and first[1].final
    assert second[1].req_id == 2 and second[1].final and second[1].error is not None
    assert second[1].error.message == (
        "Failed to process the request(s) for model 'd_0', message: RuntimeError: broken"
    )


def test_a_gone_frontend_s_requests_are_cancelled_and_not_answered(
    setup: Callable[..., Setup],
) -> None:
    kept: list[pb_utils.InferenceResponseSender] = []
    s = setup(kept.extend)
    s.run(1, frontend=b"f-0-9")
    s.streams.frontend_gone(b"f-0-9")
    assert kept[0].is_cancelled()
    kept[0].send(_response(1.0), _FINAL)
    assert s.sent == [] and s.streams.take_ended() == [(b"f-0-9", 1)]


def test_a_cancel_reaches_the_model(setup: Callable[..., Setup]) -> None:
    kept: list[pb_utils.InferenceResponseSender] = []
    s = setup(kept.extend)
    s.run(1, 2)
    s.streams.cancel(b"f-0-1", 2)
    assert [k.is_cancelled() for k in kept] == [False, True]
    for k in kept:  # (a sender dropped open would end its request from __del__)
        k.close()
    assert s.streams.take_ended() == [(b"f-0-1", 1), (b"f-0-1", 2)]


def test_requests_still_open_when_the_instance_stops_end_with_an_error(
    setup: Callable[..., Setup],
) -> None:
    kept: list[pb_utils.InferenceResponseSender] = []
    s = setup(kept.extend)
    s.run(4)
    s.streams.end_all(version=1)
    ((_, resp),) = s.sent
    assert resp.req_id == 4 and resp.error is not None
    assert resp.error.code == int(Code.UNAVAILABLE)
    assert "the instance stopped before the model sent the final response" in resp.error.message
    kept[0].send(_response(1.0), _FINAL)  # too late: nothing more goes out
    assert len(s.sent) == 1


def test_each_rerun_of_a_rescheduled_request_is_reported_for_the_statistics(
    setup: Callable[..., Setup],
) -> None:
    """A request rescheduled twice runs three times, the last two as reruns (flags 0),
    each reported (RerunDone: one request, one sample, no failure); it stays open until
    its final response, then ends."""
    flags: list[int] = []

    def model(requests: list[pb_utils.InferenceRequest]) -> None:
        for r in requests:
            flags.append(r.flags())
            if len(flags) < 3:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                r.get_response_sender().send(_response(float(len(flags))))
            else:
                r.get_response_sender().send(_response(3.0), _FINAL)

    s = setup(model, Iterative)
    done = s.run(1)
    assert (done.batch_size, done.failed, done.open) == (1, [], [0])
    reports = []
    with s.lock:  # as the worker's loop holds it
        while s.core.rescheduled:
            reports.append(s.streams.rerun())
    assert [(r.ok, r.ok_samples, r.failed, r.done.batch_size) for r in reports] == [
        (1, 1, 0, 1),
        (1, 1, 0, 1),
    ]
    assert flags == [1, 0, 0]  # (START, then flags 0, as Triton's)
    assert _values(s.sent) == [(1, 1.0, False), (1, 2.0, False), (1, 3.0, True)]
    assert s.streams.take_ended() == [(b"f-0-1", 1)]


def test_a_rerun_that_fails_is_reported_failed(setup: Callable[..., Setup]) -> None:
    runs: list[int] = []

    def model(requests: list[pb_utils.InferenceRequest]) -> None:
        runs.append(len(requests))
        if len(runs) > 1:
            raise RuntimeError("lost its state")
        requests[0].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    s = setup(model, Iterative)
    s.run(1)
    with s.lock:
        report = s.streams.rerun()
    assert (report.ok, report.failed) == (0, 1) and not s.core.rescheduled
    (final,) = [r for _, r in s.sent if r.final]
    assert final.error is not None and "lost its state" in final.error.message
