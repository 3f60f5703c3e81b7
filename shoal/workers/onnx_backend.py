"""ONNX Runtime backend (CPU execution provider).

Inputs arrive as numpy views straight over shared memory; ONNX Runtime reads them in
place. An output the worker knows the place of (a lone request's output of a fixed shape,
wanted in its client's region or the frontend's slab) is written there by ONNX Runtime
itself, through IOBinding. BF16 has no numpy dtype: it goes in and out as uint16 bit
patterns wrapped in OrtValues typed bfloat16.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnxruntime as ort

from shoal.configs.backend_params import USE_DEVICE_ALLOCATOR_FOR_INITIALIZERS, ort_session_params
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError, IOSpec
from shoal.ipc.errors import invalid_arg
from shoal.workers.tensors import on_host

log = logging.getLogger("shoal.worker")

_ORT_TYPES: Final[dict[str, str]] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}
_ONNX_BFLOAT16: Final[int] = 16
_NUMPY_OF_ORT: Final[dict[str, str]] = {
    "tensor(bool)": "bool", "tensor(uint8)": "<u1", "tensor(uint16)": "<u2",
    "tensor(uint32)": "<u4", "tensor(uint64)": "<u8", "tensor(int8)": "<i1",
    "tensor(int16)": "<i2", "tensor(int32)": "<i4", "tensor(int64)": "<i8",
    "tensor(float16)": "<f2", "tensor(float)": "<f4", "tensor(double)": "<f8",
}  # fmt: skip
_NUMPY_OF_ORT_DEVICE: Final[dict[str, str]] = {**_NUMPY_OF_ORT, "tensor(bfloat16)": "<u2"}


def _spec(arg: ort.NodeArg) -> IOSpec:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise ValueError(f"tensor '{arg.name}' has type {arg.type}, which Triton cannot carry")
    shape = [d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or [])]
    return IOSpec(name=arg.name, datatype=dtype, shape=shape)


def _session_options(config: ModelSpec, threads: int) -> ort.SessionOptions:
    """Session options for `threads` intra-op threads and what the config sets that
    Triton's onnxruntime backend reads into its session (shoal.configs.backend_params
    ort_session_params; model_operations' libraries); raises ConfigError for bad values.

    `threads` 0 is ONNX Runtime's default, which in a sequential session also pins each
    pool thread to a core of the host: the worker gives 0 only to an instance not pinned
    to cores (configs.backend_params.instance_threads)."""
    params = ort_session_params(config)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    # Idle pool threads must not spin: the cores are shared with the frontend, the
    # broker and other instances, which need them between executions.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if params.parallel:
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        # ONNX Runtime's default (0) sizes this pool for the host, however few cores the
        # instance is pinned to: on a 64-core host, 64 threads on one core. For a pinned
        # instance "the default" is its own core count; one not pinned keeps ORT's.
        so.inter_op_num_threads = params.inter_op_threads or _pinned_core_count()
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    else:
        so.inter_op_num_threads = 1  # a sequential session has no inter-op pool to size
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, params.graph_level)
    if params.mem_arena is not None:
        so.enable_cpu_mem_arena = params.mem_arena
    if params.mem_pattern is not None:
        so.enable_mem_pattern = params.mem_pattern
    if params.device_allocator_for_initializers is not None:
        so.add_session_config_entry(
            USE_DEVICE_ALLOCATOR_FOR_INITIALIZERS, params.device_allocator_for_initializers
        )
    # Custom operations (onnxruntime-extensions, a model's own), as Triton registers them.
    for library in config.op_library_filenames:
        try:
            so.register_custom_ops_library(library)
        except Exception as exc:  # ORT's Fail: the library cannot be loaded
            raise ConfigError(
                config.name,
                f"failed to register the custom operations in '{library}': {exc}",
            ) from None
    so.log_severity_level = 3
    return so


Provider = str | tuple[str, dict[str, str]]

# Triton's tensorrt accelerator parameters that ONNX Runtime's TensorRT provider takes
# under another name (the rest of Triton's trt_* keys are the provider's own names).
_TRT_KEYS: Final = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_TRT_PRECISION: Final = {
    "FP16": "trt_fp16_enable",
    "BF16": "trt_bf16_enable",
    "INT8": "trt_int8_enable",
}


def execution_providers(
    config: ModelSpec, gpu: bool, available: list[str]
) -> tuple[list[Provider], list[str]]:
    """ONNX Runtime's providers for an instance, in Triton's order, and warnings.

    As Triton's onnxruntime backend reads ``optimization.execution_accelerators``: on a
    GPU instance, ``gpu_execution_accelerator`` "tensorrt" (ORT's TensorRT provider,
    with Triton's parameters) and "cuda" (its parameters as the CUDA provider's
    options) before the CUDA provider; on any instance, ``cpu_execution_accelerator``
    "openvino" before ONNX Runtime's CPU provider. Any other name fails the load with
    Triton's "unknown Execution Accelerator '<name>' is requested" (ConfigError). One
    this onnxruntime lacks (onnxruntime-openvino, a TensorRT build) is left out with a
    warning and the model runs without it, where a Triton built without it refuses the
    model."""
    accelerators = config.optimization
    out: list[Provider] = []
    notes: list[str] = []
    cuda: dict[str, str] = {}
    if gpu:
        for ea in accelerators.gpu_accelerators:
            params: dict[str, str] = dict(ea.parameters)
            if ea.name == "tensorrt":
                if "TensorrtExecutionProvider" not in available:
                    notes.append(
                        f"model '{config.name}': this onnxruntime has no TensorRT execution "
                        "provider; the tensorrt accelerator is left out"
                    )
                    continue
                options = {"device_id": "0"}
                for key, value in params.items():
                    if key == "precision_mode":
                        if value in _TRT_PRECISION:
                            options[_TRT_PRECISION[value]] = "True"
                        elif value != "FP32":
                            raise ConfigError(
                                config.name, f"unsupported precision mode '{value}' is requested"
                            )
                    else:
                        options[_TRT_KEYS.get(key, key)] = value
                out.append(("TensorrtExecutionProvider", options))
            elif ea.name == "cuda":
                cuda.update(params)
            else:
                raise ConfigError(
                    config.name, f"unknown Execution Accelerator '{ea.name}' is requested"
                )
        out.append(("CUDAExecutionProvider", cuda) if cuda else "CUDAExecutionProvider")
    for ea in accelerators.cpu_accelerators:
        if ea.name != "openvino":
            raise ConfigError(
                config.name, f"unknown Execution Accelerator '{ea.name}' is requested"
            )
        if "OpenVINOExecutionProvider" not in available:
            notes.append(
                f"model '{config.name}': this onnxruntime has no OpenVINO execution provider "
                "(onnxruntime-openvino); the openvino accelerator is left out"
            )
            continue
        out.append(("OpenVINOExecutionProvider", {"device_type": "CPU"}))
    out.append("CPUExecutionProvider")
    return out, notes


def _pinned_core_count() -> int:
    """The cores this process is confined to, 0 when it may run on all of the host's."""
    allowed = len(os.sched_getaffinity(0))
    return allowed if allowed < (os.cpu_count() or allowed) else 0


class OnnxRuntimeBackend:
    writes_in_place = True  # see execute's destinations

    def __init__(self) -> None:
        self._sess: ort.InferenceSession | None = None
        self._bf16_in: set[str] = set()
        self._bf16_out: set[str] = set()
        self._string_in: set[str] = set()
        self._has_strings = False  # a string input or output: IOBinding cannot bind it
        self._cpu_only = False
        self._unbindable: set[str] = set()  # outputs whose shape the model does not keep
        self._quiet = ort.RunOptions()
        self._quiet.log_severity_level = 4  # a failed in-place run is retried plainly

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        if model_file.is_dir():
            model_file = model_file / "model.onnx"
        so = _session_options(config, threads)
        available = ort.get_available_providers()
        if gpu:
            if "CUDAExecutionProvider" not in available:
                raise RuntimeError(
                    "KIND_GPU instance, but this onnxruntime has no CUDAExecutionProvider "
                    "(install onnxruntime-gpu)"
                )
            if hasattr(ort, "preload_dlls"):  # ORT >= 1.21: CUDA/cuDNN from nvidia-* wheels
                ort.preload_dlls()
        providers, notes = execution_providers(config, gpu, available)
        for note in notes:
            log.warning("%s", note)
        self._sess = ort.InferenceSession(str(model_file), so, providers=providers)
        self._cpu_only = self._sess.get_providers() == ["CPUExecutionProvider"]
        if gpu and "CUDAExecutionProvider" not in self._sess.get_providers():
            # ONNX Runtime falls back to the CPU, with only a log line, when the CUDA
            # provider cannot load (CUDA or cuDNN libraries missing).
            raise RuntimeError(
                "KIND_GPU instance, but ONNX Runtime could not create its "
                "CUDAExecutionProvider (are the CUDA and cuDNN libraries it needs installed?)"
            )
        ins, outs = self.io_spec()
        self._bf16_in = {s.name for s in ins if s.datatype == "BF16"}
        self._bf16_out = {s.name for s in outs if s.datatype == "BF16"}
        self._string_in = {s.name for s in ins if s.datatype == "BYTES"}
        self._has_strings = any(s.datatype == "BYTES" for s in (*ins, *outs))

    def io_spec(self) -> tuple[list[IOSpec], list[IOSpec]]:
        assert self._sess is not None
        return (
            [_spec(a) for a in self._sess.get_inputs()],
            [_spec(a) for a in self._sess.get_outputs()],
        )

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        assert self._sess is not None
        if any(hasattr(a, "__cuda_array_interface__") for a in inputs.values()):
            if not self._has_strings:
                return self._execute_device(inputs, outputs)
            # ONNX Runtime's IOBinding binds no string tensor ("Only binding non-string
            # Tensors is currently supported"): such a model runs from host copies.
            inputs = {k: on_host(v) for k, v in inputs.items()}
        if self._bf16_in or self._bf16_out:
            return self._execute_ort_values(inputs, outputs)
        bound = {k: v for k, v in (destinations or {}).items() if k not in self._unbindable}
        if bound and self._cpu_only and not self._string_in:
            try:
                return self._execute_into(inputs, outputs, bound)
            except Exception as exc:
                # The model disagreed with the config on an output's shape (a stale shape
                # in the model file, say), or failed: the plain run below gives its own
                # result or error. Those outputs are not bound again: one extra run each.
                self._unbindable |= bound.keys()
                log.info("outputs %s are not written in place from now on (%s)", sorted(bound), exc)
        feeds: dict[str, np.ndarray] = {}
        for name, arr in inputs.items():
            feeds[name] = _as_text(name, arr) if name in self._string_in else arr
        return list(self._sess.run(outputs, feeds))

    def _execute_into(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray],
    ) -> list[np.ndarray]:
        """IOBinding on the CPU: the inputs bound where they lie (the frontend's slab or
        the client's region), each output with a destination bound to it, so ONNX Runtime
        writes it in place; the other outputs are allocated by ONNX Runtime as usual."""
        assert self._sess is not None
        io = self._sess.io_binding()
        for name, arr in inputs.items():
            io.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name in outputs:
            dest = destinations.get(name)
            if dest is None:
                io.bind_output(name, "cpu")
            else:
                io.bind_output(name, "cpu", 0, dest.dtype, list(dest.shape), dest.ctypes.data)
        self._sess.run_with_iobinding(io, self._quiet)
        out = []
        for name, value in zip(outputs, io.get_outputs(), strict=True):
            dest = destinations.get(name)
            # A graph output that is a graph input comes back as that input's value, not
            # written into the bound buffer: then it is returned (and copied) as usual.
            out.append(
                dest if dest is not None and value.data_ptr() == dest.ctypes.data else value.numpy()
            )
        return out

    def _execute_ort_values(
        self, inputs: Mapping[str, np.ndarray], outputs: list[str]
    ) -> list[np.ndarray]:
        assert self._sess is not None
        feeds = {}
        for name, arr in inputs.items():
            if name in self._bf16_in:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(arr), _ONNX_BFLOAT16
                )
            else:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))
        results = self._sess.run_with_ort_values(outputs, feeds)
        out: list[np.ndarray] = []
        for name, value in zip(outputs, results, strict=True):
            if name in self._bf16_out:
                out.append(_bf16_bits(value))
            else:
                out.append(value.numpy())
        return out

    def _execute_device(self, inputs: Mapping[str, Any], outputs: list[str]) -> list[Any]:
        """Inputs already in device memory (client CUDA shared memory): bound in place
        with IOBinding; outputs stay on the device and come back as cupy arrays."""
        import cupy as cp

        assert self._sess is not None
        io = self._sess.io_binding()
        for name, arr in inputs.items():
            bf16 = name in self._bf16_in  # bound by ONNX type: numpy has no bfloat16
            if hasattr(arr, "__cuda_array_interface__"):
                etype = _ONNX_BFLOAT16 if bf16 else arr.dtype
                io.bind_input(name, "cuda", 0, etype, list(arr.shape), arr.data.ptr)
            elif bf16:
                value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(arr), _ONNX_BFLOAT16
                )
                io.bind_ortvalue_input(name, value)
            else:
                io.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name in outputs:
            io.bind_output(name, "cuda")
        self._sess.run_with_iobinding(io)
        out = []
        for value in io.get_outputs():
            # Copied out (a memcpy, no kernel): the OrtValue's memory goes back to ONNX
            # Runtime's arena when the binding goes.
            dest = cp.empty(value.shape(), dtype=np.dtype(_NUMPY_OF_ORT_DEVICE[value.data_type()]))
            if dest.nbytes:
                mem = cp.cuda.UnownedMemory(value.data_ptr(), dest.nbytes, value, 0)
                dest.data.copy_from_device(cp.cuda.MemoryPointer(mem, 0), dest.nbytes)
            out.append(dest)
        cp.cuda.runtime.deviceSynchronize()  # done before ONNX Runtime may reuse that memory
        return out

    def unload(self) -> None:
        self._sess = None


def _as_text(name: str, arr: np.ndarray) -> np.ndarray:
    """ONNX Runtime's Python API holds string tensors as UTF-8 text (NUL bytes pass). A
    sequence's implicit state is text already: ONNX Runtime's output fed back as is."""
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    try:
        for i, b in enumerate(arr.reshape(-1)):
            flat[i] = b if isinstance(b, str) else b.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_arg(
            f"BYTES input '{name}' element {i} is not valid UTF-8, which ONNX Runtime "
            "string tensors require"
        ) from None
    return out


def _bf16_bits(value: ort.OrtValue) -> np.ndarray:
    """The uint16 bit patterns of a bfloat16 OrtValue."""
    shape = value.shape()
    n = int(np.prod(shape)) if shape else 1
    raw = (ctypes.c_uint16 * n).from_address(value.data_ptr())
    return np.array(np.ctypeslib.as_array(raw), dtype=np.uint16).reshape(shape)
