"""Python backend: Triton's ``model.py`` models (backend ``python``), run in the worker.

Triton runs a Python model in a stub process beside the server; shoal's worker already is
one process per instance, so the model runs right there, with the same isolation: a model
that crashes, hangs or leaks takes down its own worker alone.

As Triton's Python backend:

* ``model.py`` defines ``TritonPythonModel``. ``initialize(args)`` (if defined) gets
  Triton's ``args``: ``model_config`` (the config as JSON text), ``model_instance_kind``,
  ``model_instance_name``, ``model_instance_device_id``, ``model_repository`` (the
  model's folder), ``model_version`` and ``model_name``. ``finalize()`` runs at unload.
* ``execute(requests)`` gets the requests of a batch, each with its own tensors, and
  returns one ``InferenceResponse`` per request, in order. A response with an error
  fails its request alone; an exception, or a list of the wrong length, fails them all.
* ``import triton_python_backend_utils as pb_utils`` is shoal's own (shoal/workers/pb_utils.py).
* The config lists the model's inputs and outputs (there is no file to read them from).
* A decoupled model (``model_transaction_policy { decoupled: true }``) answers through
  each request's response sender, any number of times, and its ``execute`` returns None
  (``execute_decoupled``). The worker gives the senders (shoal/workers/streams.py).

* A config parameter ``generative_model`` names a class of ``model.py`` that shoal's
  generative engine serves in place of ``TritonPythonModel`` (in-flight batching over a
  paged KV cache: shoal/workers/generative/, docs/generative-models.md).

* A model's own requests to other models (business logic scripting,
  ``pb_utils.InferenceRequest(...).exec()``) go through shoal/workers/bls.py.

* ``TritonPythonModel.auto_complete_config(pb_utils.ModelConfig)``, a static method, runs
  before ``initialize`` when auto-complete is on (``auto_complete``): what it sets is the
  model's config (shoal/workers/pb_model_config.py says what it may set).

* ``EXECUTION_ENV_PATH`` (a conda-pack or venv tarball, or a folder): the worker runs in
  that environment's interpreter, exec'd before it connects (shoal/workers/python_env.py).
* ``TritonPythonModel.is_ready()`` (if defined; sync or async) answers each readiness
  probe of the model, and of the server under strict readiness, beside ``execute``
  (shoal/workers/readiness.py).
* ``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` (iterative
  sequences): the request runs again later (shoal/workers/rescheduling.py).
* A sequence model's implicit state: the state input is one of the request's inputs, the
  output state a tensor of its response (shoal/workers/sequence_io.py keeps it).
* ``pb_utils.MetricFamily`` / ``Metric`` (shoal/workers/pb_metrics.py), and
  ``load_model`` / ``unload_model`` / ``is_model_ready`` (shoal/workers/pb_control.py).
* Each request's inputs are the model's own copies, in host memory; a KIND_GPU instance
  whose config sets FORCE_CPU_ONLY_INPUT_TENSORS "no" keeps those a client sent in CUDA
  shared memory on its GPU (cupy arrays: ``Tensor.is_cpu()`` False). BF16 inputs are
  DLPack-only tensors, as in Triton (shoal/workers/pb_dlpack.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from shoal.configs.model_config import config_to_json, fill_preferred_batch_size, parse_config_json
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.workers import pb_utils, rescheduling
from shoal.workers.tensors import on_host

log = logging.getLogger("shoal.worker")

_CODES = {
    pb_utils.TritonError.UNKNOWN: Code.UNKNOWN,
    pb_utils.TritonError.INTERNAL: Code.INTERNAL,
    pb_utils.TritonError.NOT_FOUND: Code.NOT_FOUND,
    pb_utils.TritonError.INVALID_ARG: Code.INVALID_ARG,
    pb_utils.TritonError.UNAVAILABLE: Code.UNAVAILABLE,
    pb_utils.TritonError.UNSUPPORTED: Code.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    pb_utils.TritonError.CANCELLED: Code.CANCELLED,
}


def error_code(code: int) -> Code:
    """A pb_utils.TritonError's code as the server's."""
    return _CODES.get(code, Code.INTERNAL)


_FORCE_CPU = "FORCE_CPU_ONLY_INPUT_TENSORS"
#: The parameter that makes a model.py class a generative model shoal's engine serves.
_GENERATIVE = "generative_model"
#: What Triton's Python backend refuses in a stub's name (the model's, for its
#: auto-complete stub; the instance's): the characters a shell would act on.
_INVALID_NAME_CHARS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")


def _check_stub_name(name: str) -> None:
    """Triton's python_backend (StubLauncher::Launch) refuses a model or instance name with
    those characters; so does shoal, though its models run in the worker itself."""
    if not name or _INVALID_NAME_CHARS.intersection(name):
        raise ConfigError(name, "Invalid stub name: contains invalid characters")


class Answered(dict[str, np.ndarray]):
    """A request's outputs by name, and the parameters its response gave."""

    def __init__(self, tensors: dict[str, np.ndarray], parameters: dict[str, bool | int | str]):
        super().__init__(tensors)
        self.parameters = parameters


def rescheduled(request: Any) -> bool:
    """The model released ``request`` with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE."""
    flags = getattr(request, "release_flags", None)
    return flags is not None and bool(flags() & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


def _flags(req: m.InferRequest, iterative: bool = False) -> int:
    """The request's flags; an iterative sequence's first run has START alone (the
    broker makes each of its requests a sequence of its own), as Triton's."""
    flags = 0
    if req.sequence_start:
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    if req.sequence_end and not iterative:
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    return flags


class _EventLoop:
    """The instance's one event loop, on a daemon thread, as Triton's stub keeps one: an
    async ``execute`` runs there (a decoupled model's in the background, so that the next
    batch starts while it awaits; any other one waited for)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="async-execute", daemon=True).start()

    def run(self, coro: Any, wait: Callable[[Future[Any]], Any] | None = None) -> Any:
        """The coroutine's result, got by ``wait`` (the worker's, which reads its cancels
        meanwhile; ``Future.result`` by default)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result() if wait is None else wait(future)

    def background(self, coro: Any, done: Any) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).add_done_callback(done)


class PythonBackend:
    per_request = True  # the worker hands it requests, not a gathered batch

    def __init__(self) -> None:
        self.model: Any = None
        self.name = ""
        self.instance_name = ""
        self.decoupled = False  # its config's model_transaction_policy
        self.iterative = False  # its config's iterative_sequence: it may reschedule
        self.gpu_inputs = False  # inputs in CUDA shared memory stay on the GPU
        self.bf16_inputs: set[str] = set()  # (their tensors refuse as_numpy, as Triton's)
        # the completed config as Triton's JSON form (its /config), given to ``initialize``
        # as ``model_config``; the worker sets it before ``load``
        self.model_config: dict[str, Any] | None = None
        self._loop: _EventLoop | None = None  # made for the first async execute
        self._loop_lock = threading.Lock()
        #: How the worker's thread waits for an async execute (shoal/workers/cancels.py's
        #: ``RunningCancels.wait``: it reads the cancels meanwhile): set by the worker.
        self.wait_async: Callable[[Future[Any]], Any] | None = None
        self._cls: Any = None  # TritonPythonModel, once imported

    def _model_class(self, model_file: Path, generative: str = "") -> Any:
        """``TritonPythonModel`` of ``model.py``, imported once; with ``generative`` (the
        config's ``generative_model``), shoal's engine serving that class of it
        (shoal/workers/generative/runner.py)."""
        if self._cls is not None:
            return self._cls
        if not model_file.is_file():
            raise FileNotFoundError(f"{model_file} not found")
        # What a model imports, and where it finds its own files, as Triton's stub: the
        # version folder and the model's folder on sys.path, the module as "<version>.model".
        sys.modules["triton_python_backend_utils"] = pb_utils
        # Triton's stub embeds Python with no arguments: sys.argv is [""], not the
        # worker's command line (a model that runs unittest.main() parses it)
        sys.argv = [""]
        for folder in (model_file.parent.parent, model_file.parent):
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
        module_name = f"{model_file.parent.name}.{model_file.stem}"
        spec = importlib.util.spec_from_file_location(module_name, model_file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {model_file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # (dataclasses and pickle look it up there)
        spec.loader.exec_module(module)
        cls = getattr(module, generative or "TritonPythonModel", None)
        if cls is None:
            raise AttributeError(
                f"{model_file} defines no class {generative or 'TritonPythonModel'}"
            )
        if generative:
            from shoal.workers.generative.runner import runner_for

            cls = runner_for(cls)
        self._cls = cls
        return cls

    def auto_complete(self, model_file: Path, config: Any) -> Any:
        """The config as the model's ``auto_complete_config`` completes it (the config
        itself when it has none); its refusals (ValueError) fail the load."""
        _check_stub_name(config.name)
        generative = (
            config.parameters[_GENERATIVE].string_value if _GENERATIVE in config.parameters else ""
        )
        cls = self._model_class(model_file, generative)
        complete = getattr(cls, "auto_complete_config", None)
        if complete is None:
            return config
        given = pb_utils.ModelConfig(json.dumps(config_to_json(config)))
        result = complete(given)
        if not isinstance(result, pb_utils.ModelConfig):
            raise ConfigError(
                config.name,
                f"auto_complete_config function in model '{config.name}' must return a "
                "valid pb.ModelConfig object.",
            )
        completed = parse_config_json(json.dumps(result.as_dict()), config.name)
        # Triton normalizes the config again after a backend's auto-complete
        fill_preferred_batch_size(completed)
        return completed

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        """Import ``model.py`` and run ``initialize(args)``. ``instance_name`` and
        ``model_config`` are set by the worker first (Triton's <group>_<k>; the config's
        JSON form)."""
        self.name = config.name
        self.decoupled = config.decoupled
        sb = config.sequence_batching
        self.iterative = sb is not None and sb.iterative_sequence
        force_cpu = config.parameters.get(_FORCE_CPU, "")
        self.bf16_inputs = {i.name for i in config.inputs if i.datatype == "BF16"}
        self.gpu_inputs = gpu and force_cpu.strip().lower() in ("no", "false", "0", "off")
        _check_stub_name(self.instance_name or config.name)
        cls = self._model_class(model_file, config.parameters.get(_GENERATIVE, ""))
        self.model = cls()
        init = getattr(self.model, "initialize", None)
        if init is not None:
            init(
                {
                    "model_config": json.dumps(self.model_config or {}),
                    "model_instance_kind": "GPU" if gpu else "CPU",
                    "model_instance_name": self.instance_name or f"{config.name}_0",
                    "model_instance_device_id": "0",
                    "model_repository": str(model_file.parent.parent),
                    "model_version": model_file.parent.name,
                    "model_name": config.name,
                }
            )

    def io_spec(self) -> None:
        return None  # the config lists them

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """One request (warmup runs these): its outputs in order. A decoupled model's
        responses are dropped (it answers when it will); only its failure counts."""
        tensors = [pb_utils.Tensor(n, a) for n, a in inputs.items()]
        if self.decoupled:
            sender = pb_utils.InferenceResponseSender(lambda response, final: None)
            failure = self.execute_decoupled(
                [pb_utils.InferenceRequest(tensors, list(outputs), sender=sender)]
            )
            if failure is not None:
                raise ServingError(Code.INTERNAL, failure)
            return []
        req = pb_utils.InferenceRequest(tensors, list(outputs))
        (result,) = self.execute_requests([req])
        if isinstance(result, ServingError):
            raise result
        if not isinstance(result, dict):  # (nothing would run it again)
            raise ServingError(Code.INTERNAL, "a warmup request cannot be rescheduled")
        return [result[name] for name in outputs]

    def requests(
        self,
        items: list[tuple[m.InferRequest, dict[str, Any]]],
        senders: list[pb_utils.InferenceResponseSender] | None = None,
        cancelled: list[Callable[[], bool] | None] | None = None,
    ) -> list[Any]:
        """pb_utils requests for a batch's (request, its tensors by name); a decoupled
        model's with their response senders, another's with what says whether its client
        gave up (``cancelled``)."""
        # Each model gets its own copy of its inputs, as in Triton: they are views of
        # shared memory (a client's region, the frontend's slab), or read-only bytes.
        return [
            pb_utils.InferenceRequest(
                [self._input(n, a) for n, a in tensors.items()],
                [o.name for o in req.outputs],
                request_id=req.request_id,
                correlation_id=req.sequence_id,
                flags=_flags(req, self.iterative),
                parameters=dict(req.parameters),
                model_name=req.model,
                sender=senders[i] if senders is not None else None,
                cancelled=cancelled[i] if cancelled is not None else None,
                trace=pb_utils.InferenceTrace(req.hops.id, req.hops.context)
                if isinstance(req.hops, m.TracedWay)
                else None,
            )
            for i, (req, tensors) in enumerate(items)
        ]

    def refeed(self, request: pb_utils.InferenceRequest, tensors: dict[str, Any]) -> None:
        """A rescheduled request's inputs of these names become these (its sequence's
        controls and state for its next run)."""
        request._refeed([self._input(n, a) for n, a in tensors.items()])

    def _input(self, name: str, array: Any) -> pb_utils.Tensor:
        """The model's own copy of an input: on the GPU for a KIND_GPU instance whose
        config sets FORCE_CPU_ONLY_INPUT_TENSORS "no", where the client sent it in CUDA
        shared memory (a cupy array); in host memory otherwise."""
        bf16 = name in self.bf16_inputs
        if self.gpu_inputs and hasattr(array, "__cuda_array_interface__"):
            return pb_utils.Tensor._of(name, None, array.copy(), bf16)
        return pb_utils.Tensor._of(name, np.array(on_host(array), copy=True), None, bf16)

    def execute_decoupled(self, requests: list[Any]) -> str | None:
        """A decoupled model's ``execute``: its responses go through the requests'
        senders. Returns why the whole batch failed (an exception, a return value other
        than None), or None."""
        try:
            returned = self.model.execute(requests)
            if inspect.iscoroutine(returned):  # (it answers through the senders, later)
                self._event_loop().background(returned, self._background_done(requests))
                return None
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
        else:
            if returned is None:
                return None
            message = self._not_none()
        return self._failed(message)

    def _failed(self, message: str) -> str:
        # Triton 2.51's words (it names the instance as the model, here)
        return (
            f"Failed to process the request(s) for model '{self.instance_name}', message: {message}"
        )

    def _not_none(self) -> str:
        return (
            f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
            "function must return None."
        )

    def _background_done(self, requests: list[Any]) -> Any:
        """What ends an async decoupled ``execute`` run in the background: its exception
        (or a value other than None) is logged, as Triton's stub logs it, and ends each of
        its requests still open with the error (a client never waits for ever)."""

        def done(future: Any) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is None and future.result() is None:
                return
            if exc is not None:
                lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
                log.error("%s", "".join(lines).rstrip())
                message = self._failed(f"{type(exc).__name__}: {exc}")
            else:
                message = self._failed(self._not_none())
                log.error("%s", message)
            error = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            for request in requests:
                sender = request.get_response_sender()
                if not sender.closed:
                    with contextlib.suppress(pb_utils.TritonModelException):
                        sender.send(error, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        return done

    def _event_loop(self) -> _EventLoop:
        with self._loop_lock:  # (the readiness check's thread may ask first)
            if self._loop is None:
                self._loop = _EventLoop()
            return self._loop

    def readiness(self) -> Callable[[], Any] | None:
        """The model's ``is_ready`` (an async one run on the instance's event loop), or
        None if it has none (shoal/workers/readiness.py calls it)."""
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return None

        def call() -> Any:
            value = check()
            return self._event_loop().run(value) if inspect.iscoroutine(value) else value

        return call

    def execute_requests(
        self, requests: list[Any]
    ) -> list[dict[str, np.ndarray] | ServingError | rescheduling.Rescheduled]:
        """``TritonPythonModel.execute``: each request's outputs by name (``Answered``,
        with them, where its response has parameters), or its error, or RESCHEDULED
        (shoal/workers/rescheduling.py)."""
        try:
            responses = self.model.execute(requests)
            if inspect.iscoroutine(responses):  # an async execute, as Triton runs it
                responses = self._event_loop().run(responses, self.wait_async)
        except Exception as exc:
            return self._all_fail(f"{type(exc).__name__}: {exc}", len(requests))
        if not isinstance(responses, list):
            found = type(responses).__name__
            return self._all_fail(
                f"Expected a list in the execute return, found type '{found}'.", len(requests)
            )
        if len(responses) != len(requests):
            return self._all_fail(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, and "
                f"InferenceResponse(s) size is:{len(responses)}",
                len(requests),
            )
        again = [rescheduled(r) for r in requests]
        for resp, later in zip(responses, again, strict=True):
            if later and resp is not None:
                return self._all_fail(rescheduling.not_none(resp), len(requests))
            if not later and not isinstance(resp, pb_utils.InferenceResponse):
                return self._all_fail(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(resp).__name__}'.",
                    len(requests),
                )
        out: list[dict[str, np.ndarray] | ServingError | rescheduling.Rescheduled] = []
        for resp, later in zip(responses, again, strict=True):
            if later:
                out.append(
                    rescheduling.RESCHEDULED
                    if self.iterative
                    else ServingError(Code.INTERNAL, rescheduling.NOT_CONFIGURED)
                )
                continue
            err = resp.error()
            if err is not None:
                out.append(ServingError(error_code(err.code()), err.message()))
                continue
            tensors = {t.name(): t.data() for t in resp.output_tensors()}
            params = resp.parameter_values()
            out.append(Answered(tensors, params) if params else tensors)
        return out

    def _all_fail(self, message: str, count: int) -> list[Any]:
        error = ServingError(
            Code.INTERNAL,
            f"Failed to process the request(s) for model instance '{self.instance_name}', "
            f"message: {message}",
        )
        return [error] * count

    def unload(self) -> None:
        """``finalize()``; an exception there is logged, as Triton does, and the worker
        stops as it would have."""
        finalize = getattr(self.model, "finalize", None)
        try:
            if finalize is not None:
                finalize()
        except Exception:
            log.exception("model '%s': finalize failed", self.name)
        self.model = None
