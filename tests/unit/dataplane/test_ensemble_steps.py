"""The frontend's ensemble runner's pure parts (shoal/dataplane/ensemble_runner.py): which steps a
request needs, and how a tensor's shape changes between models that batch and those
that do not (Triton's ReshapeTensorDims)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncGenerator
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.dataplane.ensemble_runner import EnsembleRun, Step, _reshaped, needed
from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import (
    EMPTY_FINAL,
    FINAL_FLAG,
    ClientRequest,
    InferenceResult,
    InputTensor,
    OutputTensor,
    RequestedOutput,
    ResponseError,
)

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


def _request() -> ClientRequest:
    data = memoryview(b"\0\0\0\0")
    return ClientRequest("e", "", inputs=[InputTensor("IN", "FP32", [1, 1], data)])


class _Steps:
    """Composing models that answer when told to, counting what their answers hold."""

    def __init__(self) -> None:
        self.held = 0
        self.gates: dict[str, asyncio.Event] = {}

    async def infer(self, req: ClientRequest) -> InferenceResult:
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


# -- ensembles with decoupled steps (EnsembleRun.stream) ------------------------------

# IN -> gen (decoupled) -> A -> post -> OUT
STREAMED = [
    Step(0, "gen", "", {"X": "IN"}, {"Y": "A"}),
    Step(1, "post", "", {"X": "A"}, {"Y": "OUT"}),
]


class _Decoupled(_Steps):
    """``gen`` is decoupled: its responses are what the test puts in ``sent`` (True: a
    response, with the final flag if ``final``; "final": the final flag alone; an error
    message); ``post`` answers at once. Counts what is held and whether gen's stream was
    closed before its end."""

    def __init__(self) -> None:
        super().__init__()
        for name in ("gen", "post"):
            self.gates[name] = asyncio.Event()
            self.gates[name].set()
        self.sent: asyncio.Queue[tuple[object, bool]] = asyncio.Queue()
        self.closed_early = False

    async def infer_stream(
        self, req: ClientRequest
    ) -> AsyncGenerator[InferenceResult | ResponseError, None]:
        assert req.model == "gen" and EMPTY_FINAL not in req.parameters
        ended = False
        try:
            while True:
                what, final = await self.sent.get()
                if what == "final":
                    ended = True
                    return
                if isinstance(what, str):
                    yield ResponseError(what, final)
                else:
                    result = await self.infer(req)
                    result.parameters[FINAL_FLAG] = final
                    yield result
                if final:
                    ended = True
                    return
        finally:
            self.closed_early = not ended

    async def model_of(self, name: str, version: str) -> ModelHandle:
        handle = _model_handle(name)
        handle.decoupled = name == "gen"
        return handle


async def _settle() -> None:
    """Let every task run until none has anything left to do (no I/O here)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _stream_run(steps: _Decoupled, **params: bool) -> EnsembleRun:
    req = _request()
    req.outputs = [RequestedOutput("OUT")]
    req.parameters.update(params)
    return EnsembleRun(_handle(), req, steps.infer, steps.model_of, infer_stream=steps.infer_stream)


def _collect(run: EnsembleRun, steps: _Decoupled, sends: list[tuple[object, bool]]) -> list[Any]:
    """The responses of ``run`` to gen's ``sends``, each released once taken."""

    async def go() -> list[Any]:
        out: list[Any] = []

        async def take() -> None:
            async for r in run.stream(run.check(STREAMED)):
                if isinstance(r, InferenceResult):
                    r.release()
                    out.append(([o.name for o in r.outputs], r.model_version, r.parameters))
                else:
                    out.append(r)

        taking = asyncio.ensure_future(take())
        for s in sends:  # one at a time, each through every step before the next
            steps.sent.put_nowait(s)
            await _settle()
        await taking
        return out

    return asyncio.run(go())


def test_each_response_of_a_decoupled_step_answers_once_through_the_steps_after_it() -> None:
    steps = _Decoupled()
    answers = _collect(_stream_run(steps), steps, [(True, False), (True, False), (True, True)])
    data = (["OUT"], "1")
    assert answers == [
        (*data, {FINAL_FLAG: False}), (*data, {FINAL_FLAG: False}), (*data, {FINAL_FLAG: True})
    ]  # fmt: skip
    assert steps.held == 0  # gen's three answers, post's three


def test_a_final_flag_alone_is_an_empty_response_only_when_asked_for() -> None:
    sends: list[tuple[object, bool]] = [(True, False), ("final", True)]
    steps = _Decoupled()
    assert _collect(_stream_run(steps), steps, sends) == [(["OUT"], "1", {FINAL_FLAG: False})]
    steps = _Decoupled()
    answers = _collect(_stream_run(steps, **{EMPTY_FINAL: True}), steps, sends)
    assert answers[1:] == [([], "", {FINAL_FLAG: True})]
    steps = _Decoupled()
    assert _collect(_stream_run(steps), steps, [("final", True)]) == []  # no response at all
    assert steps.held == 0


def test_the_first_error_ends_the_request_and_cancels_what_runs() -> None:
    steps = _Decoupled()
    run = _stream_run(steps)
    answers = _collect(run, steps, [(True, False), ("boom", False), (True, False)])
    assert answers[0][2] == {FINAL_FLAG: False}
    (error,) = answers[1:]
    assert error == ResponseError("in ensemble 'e', boom", True)
    assert run.failed and steps.closed_early and steps.held == 0


def test_a_response_holds_its_pass_until_released() -> None:
    """A response shows its pass's tensors (post's answer, gen's response) until the
    transport releases it; then they go. The client leaving mid-way releases the rest."""

    async def go() -> None:
        steps = _Decoupled()
        run = _stream_run(steps)
        responses = run.stream(run.check(STREAMED))
        steps.sent.put_nowait((True, False))
        first = await anext(responses)
        assert isinstance(first, InferenceResult) and steps.held == 2
        first.release()
        assert steps.held == 0
        steps.sent.put_nowait((True, False))
        second = await anext(responses)
        assert steps.held == 2
        await responses.aclose()  # the client left, holding the second
        await _settle()  # (gen's stream ends as its cancelled step does)
        assert steps.held == 0 and steps.closed_early
        assert isinstance(second, InferenceResult)
        second.release()  # a late release changes nothing
        assert steps.held == 0

    asyncio.run(go())


class _Reordering(_Decoupled):
    """post's answers come when the test releases them, each by its call's number (its
    OUT holds that number), in whatever order the test chooses."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.post_gates: dict[int, asyncio.Event] = {}

    async def infer(self, req: ClientRequest) -> InferenceResult:
        if req.model != "post":
            return await super().infer(req)
        self.calls += 1
        number = self.calls
        await self.post_gates.setdefault(number, asyncio.Event()).wait()
        self.held += 1
        out = OutputTensor("Y", "FP32", [1, 1], memoryview(struct.pack("<f", number)))
        return InferenceResult(req.model, "1", "", [out], release=self._release)


def test_responses_keep_the_order_of_the_decoupled_responses_they_come_from() -> None:
    """post answers gen's second response first (another instance, say): its response
    waits for the first one's, and the final flag rides on the last one sent."""

    async def go() -> None:
        steps = _Reordering()
        run = _stream_run(steps)
        got: list[tuple[float, object]] = []

        async def take() -> None:
            async for r in run.stream(run.check(STREAMED)):
                assert isinstance(r, InferenceResult)
                data = r.outputs[0].data
                assert data is not None
                got.append((struct.unpack("<f", data)[0], r.parameters[FINAL_FLAG]))
                r.release()

        taking = asyncio.ensure_future(take())
        for s in [(True, False), (True, True)]:
            steps.sent.put_nowait(s)
            await _settle()
        steps.post_gates[2].set()
        await _settle()
        assert got == []  # the second pass's response waits for the first's
        steps.post_gates[1].set()
        await taking
        assert got == [(1.0, False), (2.0, True)]
        assert steps.held == 0

    asyncio.run(go())
