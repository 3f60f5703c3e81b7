"""TensorRT backend: a serialized engine (``platform: "tensorrt_plan"``, ``model.plan``) run
with TensorRT's Python runtime on the instance's GPU (KIND_GPU only, as in Triton).

* The runtime is TensorRT's (``tensorrt``, or ``tensorrt_bindings`` as PyPI's bindings
  wheel names it), or its lean runtime (``tensorrt_lean``, ``tensorrt_lean_bindings``: the
  one PyPI ships with its libraries as wheels), which runs version-compatible plans.
* Auto-complete as Triton's TensorRT backend (shoal.configs.trt_config): max_batch_size
  from the engine's optimization profiles, the tensors from its I/O tensors.
* Execution contexts: one per optimization profile the instance's group lists
  (``instance_group { profile: [ "0", "1" ] }``; none listed: every profile), each created with
  the ``execution_context_allocation_strategy`` parameter. Each batch runs in the context
  whose profile is nearest its input shapes (trt_config.select_profile).
* Inputs in client CUDA shared memory (cupy arrays over the client's memory, see
  shoal.workers.cuda_regions) are bound by address, with no copy; host inputs are copied up
  once. Outputs are allocated on the device, at the shapes TensorRT infers from the
  inputs; they are handed back on the device (cupy) for a batch whose inputs came on the
  device, else copied down, straight into the request's destination where the worker
  gives one (the frontend's slab, the client's system region). BF16 travels as uint16 bit
  patterns, as in the other backends.

One thread drives an instance; the backend owns its CUDA stream and contexts.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from shoal.configs import trt_config
from shoal.configs.model_spec import ModelSpec
from shoal.configs.placement import instances_of
from shoal.configs.schema import ConfigError, IOSpec
from shoal.ipc.errors import Code, ServingError, invalid_arg

log = logging.getLogger("shoal.worker")

# TensorRT's DataType names -> (V2 datatype, numpy dtype on the host)
_TYPES: Final[dict[str, tuple[str, str]]] = {
    "FLOAT": ("FP32", "<f4"), "HALF": ("FP16", "<f2"), "BF16": ("BF16", "<u2"),
    "INT8": ("INT8", "<i1"), "INT32": ("INT32", "<i4"), "INT64": ("INT64", "<i8"),
    "UINT8": ("UINT8", "<u1"), "BOOL": ("BOOL", "bool"),
}  # fmt: skip


#: TensorRT's runtime modules, the full one first: ``tensorrt`` (NVIDIA's packages and
#: images), ``tensorrt_bindings`` (what PyPI's tensorrt-cu13-bindings wheel installs; its
#: libraries come from NVIDIA's index), then the lean runtime's, which runs plans built
#: version-compatible (PyPI's tensorrt-lean-cu13-bindings and -libs wheels).
RUNTIME_MODULES: Final = (
    "tensorrt",
    "tensorrt_bindings",
    "tensorrt_lean",
    "tensorrt_lean_bindings",
)


def _runtime_module() -> Any:
    """The first of RUNTIME_MODULES that imports (with its libraries); a RuntimeError
    naming what to install."""
    for name in RUNTIME_MODULES:
        try:
            return importlib.import_module(name)
        except (ImportError, OSError):  # (OSError: bindings whose libraries are missing)
            continue
    raise RuntimeError(
        "TensorRT is not installed: install TensorRT for this host's CUDA (the tensorrt "
        "packages, whose libraries come from NVIDIA's index), or its lean runtime "
        "(tensorrt-lean-cu13-bindings and tensorrt-lean-cu13-libs), which runs plans "
        "built version-compatible"
    )


class _Logger:
    """TensorRT's logger: messages go to shoal's log; the last error is kept for the
    message of a failed call, as Triton's LastErrorMsg."""

    def __init__(self, trt: Any) -> None:
        errors = (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR)

        class Bridge(trt.ILogger):  # type: ignore[misc,name-defined]
            def __init__(inner) -> None:
                trt.ILogger.__init__(inner)

            def log(inner, severity: Any, msg: str) -> None:
                if severity in errors:
                    self.last_error = msg
                    log.error("TensorRT: %s", msg)
                elif severity == trt.ILogger.Severity.WARNING:
                    log.warning("TensorRT: %s", msg)

        self.last_error = ""
        self.trt_logger = Bridge()


def engine_info(trt: Any, engine: Any) -> trt_config.EngineInfo:
    """The engine's I/O tensors and profiles, read once (trt_config works on these)."""
    tensors = []
    profiles = engine.num_optimization_profiles
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        dtype = _TYPES.get(engine.get_tensor_dtype(name).name, ("", ""))[0]
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        shape_tensor = bool(engine.is_shape_inference_io(name))
        per_profile: tuple[tuple[tuple[int, ...], ...], ...] = ()
        if is_input and not shape_tensor and -1 in shape:
            per_profile = tuple(
                tuple(tuple(int(d) for d in s) for s in engine.get_tensor_profile_shape(name, p))
                for p in range(profiles)
            )
        elif is_input and not shape_tensor:  # static: every profile is its one shape
            per_profile = tuple((shape, shape, shape) for _ in range(profiles))
        tensors.append(
            trt_config.TrtTensor(name, is_input, dtype, shape, per_profile, shape_tensor)  # type: ignore[arg-type]
        )
    return trt_config.EngineInfo(tuple(tensors), profiles)


class TensorRtBackend:
    writes_in_place = True  # answers to host memory are copied down into their destination

    def __init__(self) -> None:
        self.instance = 0  # the worker sets its instance number (its group's profiles),
        self.instance_name = ""
        self.gpu = True  # and whether it runs on a GPU (before auto-complete reads the plan)
        self._trt: Any = None
        self._logger: _Logger | None = None
        self._runtime: Any = None
        self._engine: Any = None
        self._engine_file: Path | None = None
        self._info: trt_config.EngineInfo | None = None
        self._profiles: list[tuple[str, int]] = []
        self._contexts: list[Any] = []
        self._stream: Any = None
        self._bf16: set[str] = set()

    def _deserialize(self, model_file: Path, name: str) -> None:
        """Read the plan (once: auto-complete and load share it)."""
        if model_file.is_dir():
            model_file = model_file / "model.plan"
        if self._engine is not None and self._engine_file == model_file:
            return
        if not model_file.is_file():
            raise ConfigError(name, f"unable to find '{model_file}' for model '{name}'")
        trt = self._trt = self._trt or _runtime_module()
        self._logger = self._logger or _Logger(trt)
        self._runtime = trt.Runtime(self._logger.trt_logger)
        engine = self._runtime.deserialize_cuda_engine(model_file.read_bytes())
        if engine is None:
            raise ConfigError(
                name, f"unable to create TensorRT engine: {self._logger.last_error}".rstrip()
            )
        self._engine, self._engine_file = engine, model_file
        self._info = engine_info(trt, engine)
        for t in self._info.tensors:
            if t.shape_tensor:
                raise ConfigError(
                    name, f"model '{name}': '{t.name}' is a shape tensor, which shoal's "
                    "TensorRT backend does not serve",
                )  # fmt: skip
            if not t.datatype:
                raise ConfigError(
                    name, f"model '{name}': tensor '{t.name}' has TensorRT type "
                    f"{engine.get_tensor_dtype(t.name).name}, which Triton cannot carry",
                )  # fmt: skip

    def auto_complete(self, model_file: Path, config: Any) -> Any:
        """max_batch_size and dynamic_batching from the engine (trt_config.complete_max_batch);
        the worker completes the tensors from io_spec."""
        self._refuse_cpu(config.name, self.gpu)
        self._deserialize(model_file, config.name)
        assert self._info is not None
        return trt_config.complete_max_batch(config, self._info)

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        name = config.name
        self._refuse_cpu(name, gpu)
        instance = self.instance_name or f"{name}_{self.instance}"
        strategy = trt_config.allocation_strategy(config, instance)
        self._deserialize(model_file, name)
        assert self._info is not None
        groups = {index: group for index, group, _, _ in instances_of(name, config)}
        group = groups.get(self.instance)
        names = list(group.profiles) if group is not None else []
        self._profiles = trt_config.instance_profiles(
            names, self._info.num_profiles, name, instance
        )
        import cupy as cp

        trt = self._trt
        self._stream = cp.cuda.Stream(non_blocking=True)
        how = getattr(trt.ExecutionContextAllocationStrategy, strategy)
        for profile_name, index in self._profiles:
            context = self._engine.create_execution_context(how)
            if context is None:
                raise ConfigError(
                    name,
                    f"unable to create TensorRT context: {self._logger.last_error}",  # type: ignore[union-attr]
                )
            if index != 0 and not context.set_optimization_profile_async(index, self._stream.ptr):
                raise ConfigError(name, f"can not set optimization profile {profile_name}")
            self._contexts.append(context)
        self._stream.synchronize()
        self._bf16 = {t.name for t in self._info.tensors if t.datatype == "BF16"}
        log.info(
            "model '%s': TensorRT engine with %d profile(s); instance %s runs profiles %s",
            name, self._info.num_profiles, instance,
            ", ".join(f"{n}[{i}]" for n, i in self._profiles),
        )  # fmt: skip

    @staticmethod
    def _refuse_cpu(name: str, gpu: bool) -> None:
        if not gpu:
            raise ConfigError(
                name, f"unable to load model '{name}', TensorRT backend supports only GPU device"
            )

    def io_spec(self) -> tuple[list[IOSpec], list[IOSpec]]:
        assert self._info is not None
        return self._info.io_specs()

    def execute(
        self,
        inputs: Mapping[str, Any],
        outputs: list[str],
        destinations: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        import cupy as cp

        assert self._info is not None
        if self._logger is not None:
            self._logger.last_error = ""  # what a failed call below logs, not an earlier one
        shapes = {k: tuple(int(d) for d in v.shape) for k, v in inputs.items()}
        pos = trt_config.select_profile(self._info, self._profiles, shapes)
        if pos is None:
            raise invalid_arg(trt_config.no_profile_message(self._profiles))
        context = self._contexts[pos]
        on_device = any(hasattr(v, "__cuda_array_interface__") for v in inputs.values())
        keep: list[Any] = []  # what the engine reads and writes, alive until it is done
        with self._stream:
            for name, arr in inputs.items():
                dev = self._device_input(cp, name, arr)
                keep.append(dev)
                if not context.set_input_shape(name, shapes[name]):
                    raise invalid_arg(
                        f"request specifies invalid shape for input '{name}' for "
                        f"{self.instance_name}. Error details: {self._last_error()}"
                    )
                context.set_tensor_address(name, dev.data.ptr or _scratch(cp, keep))
            results = {}
            for t in self._info.outputs:
                shape = tuple(int(d) for d in context.get_tensor_shape(t.name))
                if any(d < 0 for d in shape):
                    raise ServingError(
                        Code.INTERNAL,
                        f"output '{t.name}' has a data-dependent shape, which shoal's "
                        "TensorRT backend does not serve",
                    )
                out = cp.empty(shape, dtype=np.dtype(_TYPES[_trt_type(self._engine, t.name)][1]))
                keep.append(out)
                context.set_tensor_address(t.name, out.data.ptr or _scratch(cp, keep))
                results[t.name] = out
            if not context.execute_async_v3(self._stream.ptr):
                raise ServingError(
                    Code.INTERNAL, f"unable to enqueue for inference: {self._last_error()}"
                )
            picked = [results[name] for name in outputs]
            if not on_device:
                picked = [
                    self._download(n, a, destinations) for n, a in zip(outputs, picked, strict=True)
                ]
        self._stream.synchronize()
        return picked

    def _download(self, name: str, arr: Any, destinations: Mapping[str, Any] | None) -> Any:
        """A device answer copied down (on the stream; valid once it is synchronized):
        straight into its destination where it has one that fits, else a new array."""
        dest = (destinations or {}).get(name)
        if (
            dest is not None
            and dest.shape == arr.shape
            and dest.dtype == arr.dtype
            and dest.flags.c_contiguous
            and dest.flags.writeable
        ):
            arr.get(stream=self._stream, out=dest)
            return dest
        return arr.get(stream=self._stream)

    def _device_input(self, cp: Any, name: str, arr: Any) -> Any:
        """The input as a C-contiguous device array of the engine's type: the client's
        device memory itself where it already is one, else a copy up."""
        if name in self._bf16:
            arr = arr.view(np.uint16)
        if hasattr(arr, "__cuda_array_interface__"):
            return cp.ascontiguousarray(arr)  # no copy for a contiguous region
        return cp.asarray(np.ascontiguousarray(arr))

    def _last_error(self) -> str:
        return self._logger.last_error if self._logger is not None else ""

    def unload(self) -> None:
        self._contexts.clear()
        self._engine = None
        self._runtime = None
        if self._stream is not None:
            self._stream.synchronize()
            self._stream = None


def _trt_type(engine: Any, name: str) -> str:
    return str(engine.get_tensor_dtype(name).name)


def _scratch(cp: Any, keep: list[Any]) -> int:
    """A valid address for an empty tensor (TensorRT refuses a null one)."""
    buf = cp.empty(1, dtype=np.uint8)
    keep.append(buf)
    return int(buf.data.ptr)
