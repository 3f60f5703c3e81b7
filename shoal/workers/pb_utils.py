"""``triton_python_backend_utils`` for Python models served by shoal
(shoal/workers/python_backend.py).

A Triton Python model does ``import triton_python_backend_utils as pb_utils``; the worker
that runs it registers this module under that name first. It gives what such models use
of Triton's: Tensor, InferenceRequest and InferenceResponse, TritonError and
TritonModelException, the by-name getters, the type converters, the request flags, and
Logger (into the worker's log), and ModelConfig for ``auto_complete_config``
(shoal/workers/pb_model_config.py). Tensors live in the worker's memory as numpy arrays
(BYTES as object arrays of ``bytes``, as Triton's Python backend gives them), or on the
GPU as cupy arrays (``Tensor`` says which).

A decoupled model's requests carry response senders (``get_response_sender()``): the
worker gives each request one (``InferenceResponseSender``) that sends each response as it
is given, from any thread. A model's own ``InferenceRequest(model_name=..., ...).exec()``
(business logic scripting) goes through the worker's ``scripting`` (shoal/workers/bls.py), and
so do ``load_model``, ``unload_model`` and ``is_model_ready``. ``MetricFamily`` and ``Metric``
are shoal/workers/pb_metrics.py's; DLPack (``Tensor.from_dlpack``, ``to_dlpack``) is
shoal/workers/pb_dlpack.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from shoal.workers import pb_dlpack
from shoal.workers.pb_control import is_model_ready, load_model, unload_model
from shoal.workers.pb_errors import TritonError, TritonModelException, expect
from shoal.workers.pb_logger import Logger
from shoal.workers.pb_metrics import Metric, MetricFamily
from shoal.workers.pb_model_config import ModelConfig
from shoal.workers.pb_types import (
    TRITON_STRING_TO_NUMPY,
    as_bytes,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

# Triton's names, defined beside (the rest is used by name, as Triton's module is)
__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
]

_log = logging.getLogger("shoal.worker.model")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
#: ``request.set_release_flags(...)``: run the request again, in a later batch (a model
#: with ``sequence_batching { iterative_sequence: true }``; shoal/workers/rescheduling.py)
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class Tensor:
    """A tensor of a request or response: a numpy array in host memory, or (``from_dlpack``
    of GPU memory, a KIND_GPU instance's inputs that stay on the GPU) a cupy array in
    device memory, for which ``is_cpu()`` is False and ``as_numpy()`` refuses."""

    _device: Any = None  # the cupy array of a tensor in GPU memory
    _bf16 = False  # its arrays hold BF16 bits as uint16 (numpy has no bfloat16)

    def __init__(self, name: str, data: Any) -> None:
        expect("Tensor()", "name", name, str)
        if data is None:
            raise TypeError("Tensor(): 'data' cannot be NoneType")
        if not name:
            raise TritonModelException("Tensor name must be a non-empty string")
        if isinstance(data, Tensor) or not isinstance(data, np.ndarray | list | tuple):
            raise TritonModelException(
                f"Tensor '{name}' data must be a numpy array, not {type(data).__name__}"
            )
        array = np.asarray(data)
        if array.dtype.kind in "US":  # text or bytes: BYTES, as Triton keeps them
            array = np.array([as_bytes(v) for v in array.reshape(-1)], dtype=object).reshape(
                array.shape
            )
        self._name = name
        self._array: np.ndarray | None = array

    @classmethod
    def _of(cls, name: str, host: np.ndarray | None, on_device: Any, bf16: bool) -> Tensor:
        """A tensor over a numpy or a cupy array (the worker's, and ``from_dlpack``'s);
        ``bf16``: the array holds BF16 bits as uint16."""
        tensor = cls(name, host) if host is not None else cls.__new__(cls)
        tensor._name, tensor._array, tensor._device = name, host, on_device
        tensor._bf16 = bf16
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._array is None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._bf16:
            raise TritonModelException(pb_dlpack.BF16_TO_NUMPY)
        return self._array

    def data(self) -> Any:
        """The numpy array, or the cupy array of a tensor in GPU memory (the worker's)."""
        return self._array if self._array is not None else self._device

    def shape(self) -> list[int]:
        return list(self.data().shape)

    def triton_dtype(self) -> int | None:
        return 14 if self._bf16 else numpy_to_triton_type(self.data().dtype)  # (TYPE_BF16)

    def is_cpu(self) -> bool:
        return self._array is not None

    def to_dlpack(self) -> Any:
        """A DLPack capsule of this tensor's memory (no copy)."""
        try:
            return pb_dlpack.exported(self._array, self._device, self._bf16)
        except ValueError as exc:
            raise TritonModelException(str(exc)) from None

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._array is not None:
            return (pb_dlpack.KDL_CPU, 0)
        return (pb_dlpack.KDL_CUDA, int(self._device.device.id))

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor over a DLPack capsule's memory, or a ``__dlpack__`` object's (torch,
        cupy, numpy...), with no copy: C-contiguous ones only, as Triton takes them."""
        expect("Tensor.from_dlpack()", "name", name, str)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        try:
            host, on_device, bf16 = pb_dlpack.imported(capsule)
        except ValueError as exc:
            raise TritonModelException(str(exc)) from None
        return Tensor._of(name, host, on_device, bf16)


class MemoryType(enum.Enum):
    """Where a scripted request's outputs should be (``PreferredMemory``)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """``InferenceRequest(..., preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_GPU, 0))``:
    the answer's outputs on that GPU (cupy arrays), BYTES on the host; by default, and
    for TRITONSERVER_MEMORY_CPU, on the host."""

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        expect("PreferredMemory()", "preferred_memory_type", preferred_memory_type, MemoryType)
        expect("PreferredMemory()", "preferred_device_id", preferred_device_id, int)
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace, as ``request.trace()`` gives it: handed to a BLS request
    (``InferenceRequest(..., trace=request.trace())``), it makes that request's trace a
    child of this one (shoal/workers/bls.py). ``trace_id`` 0: the request is not traced.
    ``get_context()``: for a request traced in opentelemetry mode, its W3C context as
    Triton gives it (a JSON object: ``traceparent``, the span of the request's model),
    else None."""

    def __init__(self, trace_id: int = 0, context: str = "") -> None:
        self.trace_id = trace_id
        self._context = context

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        return json.dumps({"traceparent": self._context}) if self._context else None


class InferenceRequest:
    """A request as a Python model's ``execute`` receives it."""

    def __init__(
        self,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        parameters: dict[str, Any] | str | None = None,
        model_name: str = "",
        sender: InferenceResponseSender | None = None,
        model_version: int = -1,
        timeout: int = 0,
        cancelled: Callable[[], bool] | None = None,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        **_: Any,
    ) -> None:
        where = "InferenceRequest()"
        # (pybind11 takes bytes for a std::string too: a name read from a BYTES tensor)
        if isinstance(model_name, bytes):
            model_name = model_name.decode()
        if isinstance(request_id, bytes):
            request_id = request_id.decode()
        expect(where, "inputs", inputs, list)
        expect(where, "requested_output_names", requested_output_names, list)
        for name in requested_output_names or []:
            expect(where, "requested_output_names", name, str)
        if any(t is None for t in inputs or []):  # (Triton's check of its tensors)
            raise TritonModelException("InferenceRequest inputs must be pb_utils.Tensor objects")
        expect(where, "request_id", request_id, str)
        expect(where, "correlation_id", correlation_id, (int, str))
        expect(where, "model_name", model_name, str)
        expect(where, "model_version", model_version, int)
        expect(where, "flags", flags, int)
        expect(where, "timeout", timeout, int)
        expect(where, "preferred_memory", preferred_memory, (PreferredMemory, type(None)))
        self._preferred = preferred_memory
        if isinstance(parameters, str):  # Triton takes a JSON object's text too
            parameters = json.loads(parameters) if parameters else {}
            if not isinstance(parameters, dict):
                raise TritonModelException("request parameters must be a JSON object")
        self._sender = sender
        self._cancelled = cancelled  # (the worker's, for a model that is not decoupled)
        self._model_version = model_version
        self._timeout = timeout
        self._inputs = list(inputs or [])
        self._outputs = list(requested_output_names or [])
        self._id = request_id
        self._corrid = correlation_id
        self._flags = flags
        self._parameters = parameters or {}
        self._model_name = model_name
        self._trace = trace if trace is not None else InferenceTrace()
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def trace(self) -> InferenceTrace:
        """Its trace (given to a BLS request, that request's trace is its child)."""
        return self._trace

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._corrid

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        expect("set_flags()", "flags", flags, int)
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def model_name(self) -> str:
        return self._model_name

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: run this request again, in a later
        batch, once this ``execute`` is done (its response then None)."""
        expect("set_release_flags()", "flags", flags, int)
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def _rerun(self) -> None:
        """The worker runs it again (rescheduled): no flags, released in full unless
        the model reschedules it again."""
        self._flags = 0
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def _refeed(self, tensors: list[Tensor]) -> None:
        """Its inputs of those names (a sequence's controls and state) become these."""
        fresh = {t.name(): t for t in tensors}
        self._inputs = [fresh.pop(t.name(), t) for t in self._inputs] + list(fresh.values())

    def is_cancelled(self) -> bool:
        """Whether the request's client gave up (shoal/workers/cancels.py)."""
        if self._sender is not None:
            return self._sender.is_cancelled()
        return self._cancelled is not None and self._cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "Unable to get response sender: the model does not use the decoupled "
                "transaction policy"
            )
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model (business logic scripting, shoal/workers/bls.py): its
        response, with its error if it failed; a decoupled model's responses, as an
        iterator, with ``decoupled=True``."""
        return _scripting().exec(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        client = _scripting()
        if decoupled:  # (as Triton's: once its first response is in, off the event loop)
            responses = client.exec(self, True)
            return await asyncio.get_running_loop().run_in_executor(None, responses.first)
        return await asyncio.wrap_future(client.submit(self))

    def bls_model_version(self) -> int:
        return self._model_version

    def bls_parameters(self) -> dict[str, Any]:
        return self._parameters

    def bls_gpu(self) -> int | None:
        """The GPU its answer's outputs should be on (PreferredMemory), or None: the host."""
        p = self._preferred
        if p is None or p.preferred_memory_type is not MemoryType.TRITONSERVER_MEMORY_GPU:
            return None
        return p.preferred_device_id


def response_parameters(parameters: Any) -> dict[str, bool | int | str]:
    """A response's ``parameters`` as Triton's Python backend checks them: None or a
    dict, with str keys and bool, int or str values; TritonModelException otherwise, in
    its words."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters)


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | tuple[()] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        expect("InferenceResponse()", "output_tensors", output_tensors, (list, tuple))
        tensors = list(output_tensors)
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, "
                    f"not {type(t).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            what = type(error).__name__
            raise TritonModelException(
                f"InferenceResponse error must be a pb_utils.TritonError, not {what}"
            )
        self._outputs = tensors
        self._error = error
        self._parameters = response_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def parameters(self) -> str:
        """The response's parameters as the JSON text of an object, as in Triton."""
        return json.dumps(self._parameters)

    def parameter_values(self) -> dict[str, bool | int | str]:
        """The response's parameters (the worker's: they go to the client)."""
        return self._parameters

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


#: The worker's client for a model's own requests (shoal/workers/bls.py); None outside one.
scripting: Any = None


def _scripting() -> Any:
    if scripting is None:
        raise TritonModelException("business logic scripting is not available outside a worker")
    return scripting


class InferenceResponseSender:
    """A decoupled model's way to answer one request: any number of responses, then the
    final flag (with the last response or alone), from any thread, during ``execute`` or
    after it returned. ``deliver(response, final)`` is the worker's; ``cancelled()``
    whether the request's client gave up."""

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False
        self._lock = threading.Lock()  # two threads' final flags: one goes, one raises

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is not "
                "equal to TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send expects an InferenceResponse, not {type(response).__name__}"
            )
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if final:
                self._closed = True
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    @property
    def closed(self) -> bool:
        """The final flag went out."""
        return self._closed

    def close(self) -> None:
        """The final flag, if it has not gone out yet (the worker's, not the model's)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._deliver(None, True)

    def __del__(self) -> None:
        # A request the model let go of without its final flag would keep its client
        # waiting for ever: it ends here, with the flag alone.
        if not self._closed:
            _log.warning("a response sender was dropped before its final flag: request ended")
            with contextlib.suppress(Exception):  # the worker is stopping: no one to tell
                self.close()


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t.get("name") == name), None)
