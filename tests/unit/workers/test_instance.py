"""The worker's core (shoal/workers/instance.py) without sockets: a batch in, its report and
its requests' answers out, with stand-in backends over inline tensors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_spec import ModelSpec
from shoal.configs.spec_reader import read_spec
from shoal.ipc import datatypes
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.shm import RegionMap
from shoal.workers import instance as instance_mod
from shoal.workers import pb_utils
from shoal.workers.batch_io import BatchAssembler
from shoal.workers.cuda_regions import CudaRegions
from shoal.workers.instance import IN_PLACE_MIN_BYTES, ModelInstance
from shoal.workers.loading import LoadedModel
from shoal.workers.sequence_io import SequenceIO

_IO = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class Doubler:
    """A backend that runs gathered batches: OUTPUT0 = 2 * INPUT0."""

    def __init__(self, fails: Exception | None = None) -> None:
        self.fails = fails
        self.batches: list[dict[str, Any]] = []

    def execute(self, feeds: dict[str, Any], names: list[str], dests: Any) -> list[Any]:
        self.batches.append(feeds)
        if self.fails is not None:
            raise self.fails
        return [feeds["INPUT0"] * 2 for _ in names]


class PerRequest:
    """A backend that takes requests one by one, as a Python model: each request's outputs
    from ``answer``."""

    per_request = True

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def requests(self, pairs: list[tuple[m.InferRequest, dict[str, Any]]]) -> list[Any]:
        return pairs

    def execute_requests(self, requests: list[Any]) -> list[Any]:
        return [self.answer(req, tensors) for req, tensors in requests]


@pytest.fixture
def regions() -> Iterator[RegionMap]:
    r = RegionMap()
    yield r
    r.close()


def _config(text: str = _IO) -> ModelSpec:
    return read_spec(text_format.Parse(f'name: "m" {text}', pb.ModelConfig()))


def _instance(backend: Any, regions: RegionMap, config: ModelSpec | None = None) -> ModelInstance:
    config = config or _config()
    loaded = LoadedModel.of(backend, config, 1, BatchAssembler.from_config(config))
    return ModelInstance(loaded, "m", 3, regions, CudaRegions(None))


def _item(req_id: int, value: float, frontend: bytes = b"f-0-1") -> m.WorkItem:
    data = np.full((1, 4), value, dtype=np.float32).tobytes()
    x = m.TensorRef("INPUT0", "FP32", [1, 4], len(data), data=data)
    return m.WorkItem(frontend, m.InferRequest(req_id, "m", 3, [x], [m.OutputSpec("OUTPUT0")]))


def _value(resp: m.InferResponse) -> float:
    assert resp.error is None, resp.error
    (ref,) = resp.outputs
    assert ref.data is not None
    return float(np.frombuffer(ref.data, np.float32)[0])


def test_a_batch_runs_once_and_each_request_gets_its_own_rows(regions: RegionMap) -> None:
    backend = Doubler()
    core = _instance(backend, regions)
    done, answers = core.run(m.ExecuteBatch(7, [_item(1, 1.0), _item(2, 2.0), _item(3, 3.0)]), 0)
    assert len(backend.batches) == 1 and backend.batches[0]["INPUT0"].shape == (3, 4)
    assert [(it.request.req_id, _value(r)) for it, r in answers] == [(1, 2.0), (2, 4.0), (3, 6.0)]
    assert all(r.model_version == 3 for _, r in answers)
    assert (done.batch_id, done.batch_size, done.failed, done.refused, done.open) == (
        7, 3, [], [], []
    )  # fmt: skip
    assert min(done.input_ns, done.infer_ns, done.output_ns) >= 0


def test_the_time_the_worker_took_the_batch_starts_its_input_time(regions: RegionMap) -> None:
    core = _instance(Doubler(), regions)
    done, _ = core.run(m.ExecuteBatch(1, [_item(1, 1.0)]), t0=-(10**12))
    assert done.input_ns > 10**12 - 1


def test_a_request_whose_input_does_not_map_fails_alone(regions: RegionMap) -> None:
    bad = _item(2, 0.0)
    bad.request.inputs[0].data = b"\x00" * 3  # not 16 bytes
    core = _instance(Doubler(), regions)
    done, answers = core.run(m.ExecuteBatch(1, [_item(1, 1.0), bad, _item(3, 3.0)]), 0)
    assert (done.batch_size, done.failed, done.refused) == (2, [1], [])
    by_id = {it.request.req_id: r for it, r in answers}
    assert by_id[2].error is not None and by_id[2].error.code == int(Code.INVALID_ARG)
    assert by_id[2].error.message.startswith("bad input reference: input 'INPUT0' holds 3 bytes")
    assert (_value(by_id[1]), _value(by_id[3])) == (2.0, 6.0)
    assert [it.request.req_id for it, _ in answers] == [2, 1, 3]  # refusals first


def test_malformed_bytes_are_refused_in_triton_s_words(
    regions: RegionMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    def layout_error(*args: object) -> object:
        raise datatypes.BytesLayoutError("incomplete string data", names_request=True)

    monkeypatch.setattr(instance_mod, "input_array", layout_error)
    done, ((_, resp),) = _instance(Doubler(), regions).run(m.ExecuteBatch(1, [_item(1, 1.0)]), 0)
    assert (done.batch_size, done.failed, done.refused) == (0, [0], [0])
    assert resp.error == m.ErrorInfo(int(Code.INVALID_ARG), "incomplete string data", True)


@pytest.mark.parametrize(
    ("raised", "code", "message"),
    [
        (ServingError(Code.INVALID_ARG, "a shape"), Code.INVALID_ARG, "a shape"),
        (RuntimeError("boom"), Code.INTERNAL, "RuntimeError: boom"),
    ],
)
def test_a_failed_execution_answers_every_request_with_its_error(
    regions: RegionMap, raised: Exception, code: Code, message: str
) -> None:
    core = _instance(Doubler(fails=raised), regions)
    done, answers = core.run(m.ExecuteBatch(1, [_item(1, 1.0), _item(2, 2.0)]), 0)
    assert (done.batch_size, done.failed) == (2, [0, 1])
    assert [(r.error.code, r.error.message) for _, r in answers if r.error] == [
        (int(code), message)
    ] * 2


def test_a_model_without_batching_counts_one_sample_per_request(regions: RegionMap) -> None:
    config = _config(_IO.replace("max_batch_size: 8", "max_batch_size: 0"))
    core = _instance(Doubler(), regions, config)
    item = _item(1, 1.0)
    item.request.batch_size = 5
    done, _ = core.run(m.ExecuteBatch(1, [item]), 0)
    assert done.batch_size == 1


def test_requests_run_one_by_one_and_a_wrong_output_is_the_model_s_fault(
    regions: RegionMap,
) -> None:
    def answer(req: m.InferRequest, tensors: dict[str, Any]) -> Any:
        if req.req_id == 2:
            return ServingError(Code.INVALID_ARG, "the model refused it")
        if req.req_id == 3:
            return {"OUTPUT0": np.zeros((1, 4), np.complex64)}  # not within FP32's kind
        if req.req_id == 4:
            return {}
        return {"OUTPUT0": tensors["INPUT0"] + 1}

    core = _instance(PerRequest(answer), regions)
    items = [_item(i, float(i)) for i in (1, 2, 3, 4)]
    done, answers = core.run(m.ExecuteBatch(1, items), 0)
    assert (done.batch_size, done.failed) == (4, [1, 2, 3])
    by_id = {it.request.req_id: r for it, r in answers}
    assert _value(by_id[1]) == 2.0
    errors = {i: (r.error.code, r.error.message) for i, r in by_id.items() if r.error}
    assert errors == {
        2: (int(Code.INVALID_ARG), "the model refused it"),
        3: (
            int(Code.INTERNAL),
            "output 'OUTPUT0' of model 'm' has data type complex64, which its config's FP32 "
            "cannot hold",
        ),
        4: (int(Code.INTERNAL), "output 'OUTPUT0' was not produced by the model"),
    }


def test_requests_a_python_model_could_not_run_all_fail_internal(regions: RegionMap) -> None:
    def answer(req: m.InferRequest, tensors: dict[str, Any]) -> Any:
        raise ValueError("the model broke")

    done, answers = _instance(PerRequest(answer), regions).run(
        m.ExecuteBatch(1, [_item(1, 1.0), _item(2, 2.0)]), 0
    )
    assert done.failed == [0, 1]
    assert {r.error.message for _, r in answers if r.error} == {"ValueError: the model broke"}


_SEQUENCE = """
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching {
  direct { }
  control_input [ { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY
                                              fp32_false_true: [ 0, 1 ] } ] } ]
}
"""


def test_a_direct_batch_puts_each_request_in_its_slot_s_row(
    regions: RegionMap, tmp_path: Path
) -> None:
    """Three rows, requests in slots 2 and 0: a null row (READY 0) in row 1, and each
    request's answer from its own row."""
    config = _config(_SEQUENCE)
    sequence = SequenceIO.from_config(config, tmp_path)
    assert sequence is not None

    class Rows(Doubler):
        def execute(self, feeds: dict[str, Any], names: list[str], dests: Any) -> list[Any]:
            super().execute(feeds, names, dests)
            return [feeds["INPUT0"] * feeds["READY"]]

    backend = Rows()
    loaded = LoadedModel.of(backend, config, 1, BatchAssembler.from_config(config), sequence)
    core = ModelInstance(loaded, "m", 3, regions, CudaRegions(None))
    a, b = _item(1, 1.0), _item(2, 2.0)
    a.slot, b.slot = 2, 0
    for it in (a, b):
        it.request.sequence_id = it.request.req_id
    done, answers = core.run(m.ExecuteBatch(1, [a, b], rows=3), 0)
    (feeds,) = backend.batches
    assert feeds["READY"].ravel().tolist() == [1.0, 0.0, 1.0]
    assert feeds["INPUT0"][:, 0].tolist() == [2.0, 0.0, 1.0]
    assert done.batch_size == 3
    assert [(it.request.req_id, _value(r)) for it, r in answers] == [(1, 1.0), (2, 2.0)]


def test_small_outputs_are_not_written_in_place(regions: RegionMap) -> None:
    """Below IN_PLACE_MIN_BYTES, copying costs less than binding: nothing is looked up."""
    core = _instance(Doubler(), regions)
    item = _item(1, 1.0)
    item.request.outputs = [m.OutputSpec("OUTPUT0", "slab", 0, IN_PLACE_MIN_BYTES - 1)]
    assert core.destinations(item) is None


def test_a_decoupled_model_s_responses_become_answers(regions: RegionMap) -> None:
    core = _instance(Doubler(), regions)
    item = _item(9, 0.0)
    empty = core.stream_response(item, None, True)
    assert (empty.final, empty.empty, empty.outputs) == (True, True, [])
    failed = pb_utils.InferenceResponse(
        error=pb_utils.TritonError("no", pb_utils.TritonError.INVALID_ARG)
    )
    resp = core.stream_response(item, failed, False)
    assert resp.error == m.ErrorInfo(int(Code.INVALID_ARG), "no") and not resp.final
    out = pb_utils.Tensor("OUTPUT0", np.full((1, 4), 5.0, np.float32))
    resp = core.stream_response(item, pb_utils.InferenceResponse([out]), False)
    assert _value(resp) == 5.0 and not resp.final and resp.model_version == 3
