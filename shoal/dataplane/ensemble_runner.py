"""Triton's ensemble scheduler, run by the frontend that took the request.

An ensemble (platform "ensemble") has no instances: its ``ensemble_scheduling`` steps
name composing models, and map their inputs and outputs to the ensemble's tensors. The
frontend runs each step as an ordinary request to its model, through the broker like
any other (so the composing models batch, queue, count statistics and fail as they
always do), as soon as the tensors it reads exist, steps that can run at once at once,
and answers with the ensemble outputs asked for. As in Triton 2.51:

* Only the steps some requested output depends on run; each asks its model for every
  output its ``output_map`` names. ``model_version`` -1 is the latest ready version at
  the time of the step.
* Every step inherits the request's id and parameters (priority, timeout, sequence
  flags, custom ones).
* A step's failure fails the request with the step's code and message after "in
  ensemble '<name>', ", once the steps already running have ended.
* ``max_inflight_requests`` bounds the requests each step has running at once, across
  the ensemble's requests (in each frontend process); a step at its bound waits.
* Tensors change rank between a model that batches and one that does not
  (ReshapeTensorDims): a batch-1 tensor loses its batch dimension for a model without
  one whose dims it does not fit otherwise; a tensor without one gains a batch of 1 for
  a model with one whose dims it fits.

Intermediate tensors stay where their step's answer put them (the frontend's shared
memory, or the message) until the request ends; a later step's request names them there
(a reference to the slab slot: no copy), or carries them inline when they are small. An
ensemble input in a client's shared-memory region is passed to its steps as the same
reference: the frontend never reads it. An ensemble output asked into a client region is
written there by the step that produces it, unless a later step also reads it (refused:
the frontend cannot read a client's region).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

from shoal.configs.ensemble import in_order
from shoal.configs.model_spec import InputSpec, ModelSpec
from shoal.dataplane import ensemble_labels
from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import (
    EMPTY_FINAL,
    FINAL_FLAG,
    ClientRequest,
    InferenceResult,
    InputTensor,
    OutputTensor,
    ParamValue,
    RequestedOutput,
    ResponseError,
)
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError

log = logging.getLogger("shoal.frontend")

Infer = Callable[[ClientRequest], Awaitable[InferenceResult]]
InferStream = Callable[[ClientRequest], AsyncGenerator[InferenceResult | ResponseError, None]]
ModelOf = Callable[[str, str], Awaitable[ModelHandle]]
ModelFile = Callable[[str, int, str], Awaitable[bytes]]
#: Output parameters that make a step's answer unreadable by the frontend.
_WRITTEN_ELSEWHERE = ("shared_memory_region", "classification")


@dataclass(frozen=True)
class Step:
    index: int
    model: str
    version: str  # "" for the latest ready version
    inputs: dict[str, str]  # model input -> ensemble tensor
    outputs: dict[str, str]  # model output -> ensemble tensor


@dataclass
class _Tensor:
    """An ensemble tensor that exists: the request's input or a step's output."""

    value: InputTensor  # as a later step's input reads it
    batched: bool  # its first dimension is a batch dimension
    output: OutputTensor | None = None  # as a step produced it (None: a request input)


@dataclass(eq=False)
class _Iteration:
    """One pass through the steps of a decoupled ensemble's request: the request's own
    tensors (the first), or one response of a decoupled step, and what the steps run on
    those give. Its answers are released once no step reads them and no response to the
    client shows them."""

    tensors: dict[str, _Tensor] = field(default_factory=dict)
    results: list[InferenceResult] = field(default_factory=list)
    started: set[int] = field(default_factory=set)  # steps run on it
    running: int = 0  # of those, the ones not yet done
    held: int = 0  # its response to the client, until the transport released it
    answer: list[OutputTensor] | None = None  # its response, once every output is there
    # the passes in line with it (those of the responses of one decoupled step run, in
    # order; the request's own pass is alone in its line), and by step, the lines of the
    # passes its decoupled steps start
    line: collections.deque[_Iteration] = field(default_factory=collections.deque)
    lines: dict[int, collections.deque[_Iteration]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.line.append(self)

    def release_if_done(self) -> bool:
        """Release its answers if nothing needs them any more; whether it did."""
        if self.running or self.held:
            return False
        for r in self.results:
            r.release()
        self.results.clear()
        return True


def _in_order(it: _Iteration) -> list[_Iteration]:
    """The passes whose response may go now, in order: from the front of the line of
    ``it``, those with their outputs, skipping those that ended without, up to the first
    still running. Each leaves its line: it goes once."""
    going = []
    line = it.line
    while line and (line[0].answer is not None or line[0].running == 0):
        p = line.popleft()
        if p.answer is not None:
            going.append(p)
    return going


#: What a decoupled ensemble's step tells its request: one of its answers (``last``: the
#: step is done with this one), or (no answer) that it is done; or why it failed.
_StepEvent = tuple[Step, _Iteration, ModelHandle, InferenceResult | None, bool] | ServingError


def plan(spec: ModelSpec) -> list[Step]:
    steps = spec.ensemble_scheduling.steps if spec.ensemble_scheduling is not None else ()
    return [
        Step(
            i,
            s.model_name,
            "" if s.model_version < 0 else str(s.model_version),
            dict(s.input_map),
            dict(s.output_map),
        )
        for i, s in enumerate(steps)
    ]


def needed(steps: list[Step], wanted: set[str]) -> list[Step]:
    """The steps the ``wanted`` tensors depend on, in step order."""
    tensors = set(wanted)
    chosen: set[int] = set()
    changed = True
    while changed:
        changed = False
        for s in steps:
            if s.index not in chosen and tensors.intersection(s.outputs.values()):
                chosen.add(s.index)
                tensors.update(s.inputs.values())
                changed = True
    return [s for s in steps if s.index in chosen]


def _fits(shape: list[int], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, g) for d, g in zip(dims, shape, strict=True))


def _reshaped(shape: list[int], batched: bool, mbs: int, dims: tuple[int, ...]) -> list[int]:
    """Triton's ReshapeTensorDims: the shape a tensor takes for a model (``mbs``, the
    tensor's config ``dims``)."""
    if mbs == 0 and batched and shape and shape[0] == 1 and not _fits(shape, dims):
        return shape[1:]
    if mbs > 0 and not batched and _fits(shape, dims):
        return [1, *shape]
    return shape


@dataclass
class EnsembleRun:
    """One request to an ensemble."""

    handle: ModelHandle
    req: ClientRequest
    infer: Infer
    model_of: ModelOf
    # max_inflight_requests: a semaphore per step, shared by the ensemble's requests
    inflight: dict[int, asyncio.Semaphore] | None = None
    infer_stream: InferStream | None = None  # for decoupled steps (``stream``)
    # a file of a model's directory (model, version, path): the ensemble's label files
    model_file: ModelFile | None = None
    # outputs the ensemble classifies with its own labels (ensemble_labels.py): top K
    own_classes: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, _Tensor] = field(default_factory=dict)
    results: list[InferenceResult] = field(default_factory=list)
    failed: bool = False  # (``stream``) it ended with an error response

    def _release(self) -> None:
        for r in self.results:
            r.release()
        self.results.clear()

    def check(self, steps: list[Step]) -> list[Step]:
        """The steps the request needs; raises ServingError for outputs it asks in a way
        the ensemble cannot give (before anything runs: no failure in the statistics)."""
        asked = self.req.outputs
        todo = needed(steps, {o.name for o in asked} or set(self.handle.outputs))
        read_later = {t for s in todo for t in s.inputs.values()}
        for o in asked:
            if o.name in read_later and any(o.parameters.get(k) for k in _WRITTEN_ELSEWHERE):
                raise ServingError(
                    Code.UNSUPPORTED,
                    f"output '{o.name}' of ensemble '{self.handle.name}' is read by a later "
                    "step: it cannot be written to shared memory or classified",
                )
        return todo

    async def run(self, todo: list[Step]) -> InferenceResult:
        """Run ``todo`` (from ``check``); the ensemble's answer."""
        handle, req = self.handle, self.req
        batched = handle.max_batch_size > 0
        for t in req.inputs:
            self.tensors[t.name] = _Tensor(t, batched)
        asked = {o.name: o for o in req.outputs}
        wanted = list(asked) or list(handle.outputs)
        read_later = {t for s in todo for t in s.inputs.values()}
        if self.model_file is not None:
            own = {n: ensemble_labels.own_count(handle, o) for n, o in asked.items()}
            self.own_classes = {n: k for n, k in own.items() if k and n not in read_later}
        try:
            await self._steps(todo, asked, read_later)
            outputs = [self._output(name, self.tensors) for name in wanted if name in self.tensors]
            outputs = [await self._classified(o) for o in outputs]
        except BaseException:
            self._release()
            raise
        return InferenceResult(
            handle.name, str(handle.version), req.id, outputs, release=self._release
        )

    async def stream(
        self, todo: list[Step]
    ) -> AsyncGenerator[InferenceResult | ResponseError, None]:
        """Run ``todo`` (from ``check``) for an ensemble with decoupled steps: its
        responses, as Triton 2.51 sends them. Each response of a decoupled step runs the
        steps after it again, on that response's tensors (an ``_Iteration``); each pass
        that gives every wanted output answers the client once. The response sent when
        no step is left running carries the final flag; when the last step ends with no
        response (a decoupled model's final flag alone), the final flag goes alone, as an
        empty response, if the request asked for that. The first error (a step's error
        response or failure) is the last response: "in ensemble '<name>', <message>";
        the steps still running are cancelled. ``self.failed`` tells how it ended.

        Responses keep the order of the decoupled responses they come from (shoal's
        promise; Triton sends each pass's as it ends, so a post-processing model with
        several instances can reorder a stream): a pass that has its outputs waits for
        the passes of the same step's earlier responses to answer or to end without."""
        handle, req = self.handle, self.req
        asked = {o.name: o for o in req.outputs}
        wanted = list(asked) or list(handle.outputs)
        read_later = {t for s in todo for t in s.inputs.values()}
        batched = handle.max_batch_size > 0
        root = _Iteration({t.name: _Tensor(t, batched) for t in req.inputs})
        passes = {root}  # the iterations not yet released
        events: asyncio.Queue[_StepEvent] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        running = 0  # steps not yet done, over every iteration
        answered_last = False

        def settle(it: _Iteration) -> None:
            if it.release_if_done():
                passes.discard(it)

        def unhold(it: _Iteration) -> None:  # (a response's release)
            it.held -= 1
            settle(it)

        def launch(it: _Iteration) -> None:
            nonlocal running
            for step in todo:
                if step.index in it.started or not self._ready(step, it.tensors):
                    continue
                if it is not root and not it.tensors.keys() & step.inputs.values():
                    continue  # (reads only optional inputs the request left out: once)
                it.started.add(step.index)
                it.running += 1
                running += 1
                task = asyncio.ensure_future(self._run_step(step, it, asked, read_later, events))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        try:
            launch(root)
            while running:
                event = await events.get()
                if isinstance(event, ServingError):
                    self.failed = True
                    message = f"in ensemble '{handle.name}', {event.message}"
                    yield ResponseError(message, True, event.code)
                    return
                step, it, model, result, last = event
                if last:
                    it.running -= 1
                    running -= 1
                target = it
                if result is not None:
                    if model.decoupled:  # a response: the steps after it run on it again
                        line = it.lines.setdefault(step.index, collections.deque())
                        target = _Iteration(line=line)  # (at the end of its line)
                        passes.add(target)
                    target.results.append(result)
                    _record(target.tensors, step, result, model)
                    launch(target)
                    if target.answer is None and all(n in target.tensors for n in wanted):
                        target.answer = [self._output(n, target.tensors) for n in wanted]
                        target.held += 1  # (until its response is sent and released)
                going = _in_order(it) + _in_order(target)
                for i, p in enumerate(going):
                    assert p.answer is not None
                    answered_last = running == 0 and i == len(going) - 1
                    yield InferenceResult(
                        handle.name,
                        str(handle.version),
                        req.id,
                        p.answer,
                        {FINAL_FLAG: answered_last},
                        release=functools.partial(unhold, p),
                    )
                settle(it)
                settle(target)
            if not answered_last and req.parameters.get(EMPTY_FINAL) is True:
                yield InferenceResult(handle.name, "", req.id, [], {FINAL_FLAG: True})
        finally:
            # Ended (the error, or the client left): the steps still running are
            # cancelled; every answer goes, those still queued included.
            for task in tasks:
                task.cancel()
            while not events.empty():
                event = events.get_nowait()
                if not isinstance(event, ServingError) and event[3] is not None:
                    event[3].release()
            for it in passes:
                it.running = it.held = 0
                it.release_if_done()
            passes.clear()

    async def _run_step(
        self,
        step: Step,
        it: _Iteration,
        asked: dict[str, RequestedOutput],
        read_later: set[str],
        events: asyncio.Queue[_StepEvent],
    ) -> None:
        """Run ``step`` on the tensors of ``it``, its answers to ``events``."""
        try:
            model = await self.model_of(step.model, step.version)
            request = self._request(step, model, it.tensors, asked, read_later)
            async with self._turn(step):
                if not model.decoupled:
                    events.put_nowait((step, it, model, await self.infer(request), True))
                    return
                assert self.infer_stream is not None
                ended = False
                async with contextlib.aclosing(self.infer_stream(request)) as responses:
                    async for r in responses:
                        if isinstance(r, ResponseError):
                            events.put_nowait(ServingError(r.code, r.message))
                            return
                        ended = r.parameters.get(FINAL_FLAG) is True
                        events.put_nowait((step, it, model, r, ended))
                if not ended:  # the final flag alone
                    events.put_nowait((step, it, model, None, True))
        except ServingError as err:
            events.put_nowait(err)
        except Exception as exc:
            log.error("ensemble '%s': a step failed", self.handle.name, exc_info=exc)
            events.put_nowait(ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"))

    async def _classified(self, out: OutputTensor) -> OutputTensor:
        """``out``, or its top classes with the ensemble's labels where the ensemble
        classifies it itself (``own_classes``)."""
        count = self.own_classes.get(out.name, 0)
        if not count or self.model_file is None:
            return out
        handle = self.handle
        labels = await self.model_file(
            handle.name, handle.version, ensemble_labels.label_file(handle, out.name)
        )
        return ensemble_labels.classify(out, count, handle.max_batch_size > 0, labels)

    def _output(self, name: str, tensors: dict[str, _Tensor]) -> OutputTensor:
        tensor = tensors[name]
        out = tensor.output
        assert out is not None  # an ensemble output is written by a step (check_graph)
        spec = self.handle.outputs[name]
        shape = _reshaped(out.shape, tensor.batched, self.handle.max_batch_size, spec.dims)
        return OutputTensor(name, out.datatype, shape, out.data, dict(out.parameters))

    def _ready(self, step: Step, tensors: dict[str, _Tensor]) -> bool:
        optional = {n for n, s in self.handle.inputs.items() if s.optional}
        return all(t in tensors or t in optional for t in step.inputs.values())

    async def _steps(
        self, todo: list[Step], asked: dict[str, RequestedOutput], read_later: set[str]
    ) -> None:
        pending = list(todo)
        running: dict[asyncio.Task[tuple[Step, InferenceResult, ModelHandle]], Step] = {}
        failure: ServingError | None = None
        try:
            while pending or running:
                if failure is None:
                    for step in [s for s in pending if self._ready(s, self.tensors)]:
                        pending.remove(step)
                        task = asyncio.ensure_future(self._step(step, asked, read_later))
                        running[task] = step
                if not running:
                    if failure is not None:
                        break
                    raise ServingError(
                        Code.INVALID_ARG,
                        f"in ensemble '{self.handle.name}', unexpected deadlock, at least one "
                        "output is not set while no more ensemble steps can be made",
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    error = self._collect(task)
                    if error is not None:
                        failure = failure or ServingError(
                            error.code, f"in ensemble '{self.handle.name}', {error.message}"
                        )
        finally:
            # Cancelled (the client left): so are its steps. An answer already in (or one
            # that comes in spite of the cancel) is kept, so that its release frees it.
            for task in running:
                if task.done():
                    self._collect(task)
                else:
                    task.cancel()
                    task.add_done_callback(self._late)
        if failure is not None:
            raise failure

    def _collect(
        self, task: asyncio.Task[tuple[Step, InferenceResult, ModelHandle]]
    ) -> ServingError | None:
        """A finished step's answer, kept; or its error."""
        if task.cancelled():
            return ServingError(Code.CANCELLED, "Request was cancelled")
        exc = task.exception()
        if exc is None:
            self._keep(*task.result())
            return None
        if isinstance(exc, ServingError):
            return exc
        log.error("ensemble '%s': a step failed", self.handle.name, exc_info=exc)
        return ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _late(self, task: asyncio.Task[tuple[Step, InferenceResult, ModelHandle]]) -> None:
        """A step that finished after its request was abandoned: its answer goes at once."""
        if not task.cancelled() and task.exception() is None:
            task.result()[1].release()

    def _keep(self, step: Step, result: InferenceResult, model: ModelHandle) -> None:
        self.results.append(result)
        _record(self.tensors, step, result, model)

    async def _step(
        self, step: Step, asked: dict[str, RequestedOutput], read_later: set[str]
    ) -> tuple[Step, InferenceResult, ModelHandle]:
        model = await self.model_of(step.model, step.version)
        request = self._request(step, model, self.tensors, asked, read_later)
        async with self._turn(step):
            return step, await self.infer(request), model

    def _turn(self, step: Step) -> contextlib.AbstractAsyncContextManager[object]:
        """``step``'s turn under max_inflight_requests: waits while the step has its limit
        running (no wait without one)."""
        if self.inflight is None:
            return contextlib.nullcontext()
        return self.inflight[step.index]

    def _request(
        self,
        step: Step,
        model: ModelHandle,
        tensors: dict[str, _Tensor],
        asked: dict[str, RequestedOutput],
        read_later: set[str],
    ) -> ClientRequest:
        """The request ``step`` sends ``model``, reading ``tensors``."""
        inputs = []
        mapped = in_order(step.inputs, list(model.inputs))  # the model's config order
        for model_input, name in mapped:
            tensor = tensors.get(name)
            if tensor is None:  # an optional ensemble input the request left out
                continue
            spec: InputSpec | None = model.inputs.get(model_input)
            t = tensor.value
            shape = list(t.shape)
            if spec is not None:
                shape = _reshaped(shape, tensor.batched, model.max_batch_size, spec.dims)
            inputs.append(
                InputTensor(model_input, t.datatype, shape, t.data, dict(t.parameters), t.location)
            )
        outputs = []
        for model_output, name in step.outputs.items():
            params: dict[str, ParamValue] = {}
            if name in asked and name not in read_later:  # where the client wants it
                params = dict(asked[name].parameters)
                if name in self.own_classes:  # (the values: the ensemble classifies them)
                    params.pop(ensemble_labels.CLASSIFICATION, None)
            outputs.append(RequestedOutput(model_output, params))
        # (a decoupled step's final flag is the ensemble's to send, or not)
        params = {k: v for k, v in self.req.parameters.items() if k != EMPTY_FINAL}
        trace = self.req.trace.child(step.model) if self.req.trace is not None else None
        return ClientRequest(step.model, step.version, self.req.id, params, inputs, outputs, trace)


def _record(
    tensors: dict[str, _Tensor], step: Step, result: InferenceResult, model: ModelHandle
) -> None:
    """The ensemble tensors ``result`` (``step``'s answer) gives, in ``tensors``."""
    for out in result.outputs:
        name = step.outputs.get(out.name)
        if name is None:
            continue
        value = InputTensor(name, out.datatype, list(out.shape), out.data, {}, out.location)
        tensors[name] = _Tensor(value, model.max_batch_size > 0, out)


def inflight_limits(spec: ModelSpec) -> dict[int, asyncio.Semaphore] | None:
    """``max_inflight_requests`` (0: no limit) as one semaphore per step."""
    es = spec.ensemble_scheduling
    if es is None or es.max_inflight_requests <= 0:
        return None
    return {i: asyncio.Semaphore(es.max_inflight_requests) for i in range(len(es.steps))}


def done_note(handle: ModelHandle, started_ns: int, ok: bool, batch: int) -> m.EnsembleDone:
    """The broker's record of an ensemble request (its statistics)."""
    elapsed = time.perf_counter_ns() - started_ns
    return m.EnsembleDone(handle.name, handle.version, elapsed, ok, batch)
