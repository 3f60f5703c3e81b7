"""The frontend's ensemble runner's pure parts (frontend/ensemble.py): which steps a
request needs, and how a tensor's shape changes between models that batch and those
that do not (Triton's ReshapeTensorDims)."""

from __future__ import annotations

import asyncio
import contextlib

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from frontend.ensemble import EnsembleRun, Step, _reshaped, needed
from frontend.model_handle import ModelHandle
from frontend.types import InferenceRequest, InferenceResult, InputTensor, OutputTensor

STEPS = [
    Step(0, "pre", "", {"X": "IN"}, {"Y": "A", "Z": "SIDE"}),
    Step(1, "model", "", {"X": "A"}, {"Y": "B"}),
    Step(2, "post", "", {"X": "B"}, {"Y": "OUT"}),
    Step(3, "other", "", {"X": "IN"}, {"Y": "OTHER"}),
]


def test_only_the_steps_the_wanted_outputs_depend_on() -> None:
    assert [s.index for s in needed(STEPS, {"OUT"})] == [0, 1, 2]
    assert [s.index for s in needed(STEPS, {"SIDE"})] == [0]
    assert [s.index for s in needed(STEPS, {"OTHER", "SIDE"})] == [0, 3]
    assert needed(STEPS, {"IN"}) == []


def test_a_batch_of_one_loses_its_batch_dimension_for_a_model_without_one() -> None:
    assert _reshaped([1, 4], batched=True, mbs=0, dims=(4,)) == [4]
    assert _reshaped([1, 4], batched=True, mbs=0, dims=(1, 4)) == [1, 4]  # fits as it is
    assert _reshaped([2, 4], batched=True, mbs=0, dims=(4,)) == [2, 4]  # not a batch of 1


def test_a_tensor_without_a_batch_gains_one_for_a_model_that_batches() -> None:
    assert _reshaped([4], batched=False, mbs=8, dims=(4,)) == [1, 4]
    assert _reshaped([4], batched=False, mbs=8, dims=(-1,)) == [1, 4]
    assert _reshaped([2, 4], batched=False, mbs=8, dims=(4,)) == [2, 4]  # does not fit
    assert _reshaped([2, 4], batched=True, mbs=8, dims=(4,)) == [2, 4]


def _handle() -> ModelHandle:
    text = (
        'name: "e" platform: "ensemble" max_batch_size: 4 '
        'input { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } '
        'output { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } '
        'output { name: "SIDE" data_type: TYPE_FP32 dims: [ 1 ] }'
    )
    config = text_format.Parse(text, mc.ModelConfig())
    return ModelHandle("e", 1, [1], config.SerializeToString())


def _model_handle(name: str) -> ModelHandle:
    text = (
        f'name: "{name}" max_batch_size: 4 input {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} '
        'output { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } '
        'output { name: "Z" data_type: TYPE_FP32 dims: [ 1 ] }'
    )
    return ModelHandle(name, 1, [1], text_format.Parse(text, mc.ModelConfig()).SerializeToString())


def _request() -> InferenceRequest:
    data = memoryview(b"\0\0\0\0")
    return InferenceRequest("e", "", inputs=[InputTensor("IN", "FP32", [1, 1], data)])


class _Steps:
    """Composing models that answer when told to, counting what their answers hold."""

    def __init__(self) -> None:
        self.held = 0
        self.gates: dict[str, asyncio.Event] = {}

    async def infer(self, req: InferenceRequest) -> InferenceResult:
        gate = self.gates.setdefault(req.model, asyncio.Event())
        await gate.wait()
        self.held += 1
        outputs = [OutputTensor(o.name, "FP32", [1, 1], memoryview(b"\0" * 4)) for o in req.outputs]
        return InferenceResult(req.model, "1", "", outputs, release=self._release)

    def _release(self) -> None:
        self.held -= 1

    async def model_of(self, name: str, version: str) -> ModelHandle:
        return _model_handle(name)


def test_every_answer_is_released_with_the_result() -> None:
    async def go() -> None:
        steps = _Steps()
        for name in ("pre", "model", "post", "other"):
            steps.gates.setdefault(name, asyncio.Event()).set()
        run = EnsembleRun(_handle(), _request(), steps.infer, steps.model_of)
        result = await run.run(run.check(STEPS[:3]))
        assert [o.name for o in result.outputs] == ["OUT", "SIDE"] and steps.held == 3
        result.release()
        assert steps.held == 0

    asyncio.run(go())


def test_a_request_abandoned_mid_way_releases_what_its_steps_answered() -> None:
    """The client leaves while one step has answered (its answer not yet collected) and
    another still runs: the answer is released, the other step is cancelled."""

    async def go() -> None:
        steps = _Steps()
        parallel = [
            Step(0, "a", "", {"X": "IN"}, {"Y": "OUT"}),
            Step(1, "b", "", {"X": "IN"}, {"Y": "SIDE"}),
        ]
        run = EnsembleRun(_handle(), _request(), steps.infer, steps.model_of)
        task = asyncio.ensure_future(run.run(parallel))
        await asyncio.sleep(0.01)
        steps.gates["a"].set()  # a answers ...
        await asyncio.sleep(0)  # ... and its task finishes, uncollected
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert steps.held == 0

    asyncio.run(go())
