"""ONNX Runtime's execution providers for an instance, from Triton's
``optimization { execution_accelerators { ... } }`` config, as Triton's onnxruntime backend
(src/onnxruntime.cc) reads it.

* A GPU instance: each ``gpu_execution_accelerator`` in order, "tensorrt" (ORT's TensorRT
  provider: Triton's parameters checked and renamed, the instance's device) or "cuda" (its
  parameters go to the CUDA provider), then the CUDA provider itself, with the CUDA
  options the model's ``parameters`` still may set (``cudnn_conv_algo_search``,
  ``gpu_mem_limit``, ``arena_extend_strategy``, ``do_copy_in_default_stream``: Triton's
  older way).
* Any instance: each ``cpu_execution_accelerator``, "openvino" only, then the CPU provider.
* A CPU instance does not read ``gpu_execution_accelerator`` at all: as in Triton, a GPU
  accelerator there is neither run nor refused.

Errors are Triton's (ConfigError). An accelerator this onnxruntime build lacks
(onnxruntime-openvino, a TensorRT build) is left out with a note, where a Triton built
without it refuses the model. Pure: the caller passes the providers onnxruntime has.
"""

from __future__ import annotations

from typing import Final

from shoal.configs.backend_params import stoi
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError

Provider = str | tuple[str, dict[str, str]]

_TRT_PRECISION: Final = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}  # fmt: skip  # noqa: E501
# Triton's tensorrt accelerator parameters: key -> (how its value is checked, ORT's key)
_TRT_PARAMS: Final[dict[str, tuple[str, str]]] = {
    "max_workspace_size_bytes": ("u64", "trt_max_workspace_size"),
    "int8_calibration_table_name": ("str", "trt_int8_calibration_table_name"),
    "int8_use_native_calibration_table": ("bool", "trt_int8_use_native_calibration_table"),
    **{k: ("int", k) for k in (
        "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_core",
        "trt_builder_optimization_level", "trt_auxiliary_streams", "trt_ep_context_embed_mode",
    )},
    **{k: ("bool", k) for k in (
        "trt_dla_enable", "trt_engine_cache_enable", "trt_dump_subgraphs",
        "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable",
        "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable", "trt_force_timing_cache",
        "trt_detailed_build_log", "trt_build_heuristics_enable", "trt_sparsity_enable",
        "trt_cuda_graph_enable", "trt_dump_ep_context_model",
    )},
    **{k: ("str", k) for k in (
        "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_timing_cache_path",
        "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes",
        "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_ep_context_file_path",
    )},
}  # fmt: skip
_CUDA_BOOLS: Final = ("do_copy_in_default_stream", "use_ep_level_unified_stream")
_U64_MAX: Final = 2**64 - 1


def _check(model: str, kind: str, value: str) -> None:
    """Triton's ParseBoolValue / ParseIntValue / ParseUnsignedLongLongValue."""
    if kind == "bool" and value.lower() not in ("true", "on", "1", "false", "off", "0"):
        raise ConfigError(model, f"failed to convert '{value}' to boolean")
    if kind == "int" and stoi(value) is None:
        raise ConfigError(model, f"failed to convert '{value}' to integral number")
    if kind == "u64" and not (value.isascii() and value.isdigit() and int(value) <= _U64_MAX):
        raise ConfigError(
            model, f"failed to convert '{value}' to unsigned long long integral number"
        )


def tensorrt_options(model: str, params: dict[str, str], device: int = 0) -> dict[str, str]:
    """ORT's TensorRT provider options from Triton's accelerator parameters, each checked
    as Triton checks it; the instance's device last."""
    options: dict[str, str] = {}
    for key, value in params.items():
        if key == "precision_mode":
            if value in _TRT_PRECISION:
                options[_TRT_PRECISION[value]] = "1"
            elif value != "FP32":
                raise ConfigError(model, f"unsupported precision mode '{value}' is requested")
            continue
        known = _TRT_PARAMS.get(key)
        if known is None:
            raise ConfigError(
                model, f"unknown parameter '{key}' is provided for TensorRT Execution Accelerator"
            )
        _check(model, known[0], value)
        if value:
            options[known[1]] = value
    options["device_id"] = str(device)
    return options


_ALGO_SEARCH: Final = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
_ARENA_EXTEND: Final = ("kNextPowerOfTwo", "kSameAsRequested")


def _model_cuda_options(config: ModelSpec) -> dict[str, str]:
    """The CUDA options the model's ``parameters`` set, Triton's older way (only those set:
    ONNX Runtime's defaults are Triton's)."""
    params = config.parameters
    out: dict[str, str] = {}
    for key, names in (("cudnn_conv_algo_search", _ALGO_SEARCH),
                       ("arena_extend_strategy", _ARENA_EXTEND)):  # fmt: skip
        if key in params:
            value = params[key]
            number = stoi(value)
            if number is None:
                raise ConfigError(config.name, f"failed to convert '{value}' to integral number")
            if not 0 <= number < len(names):
                raise ConfigError(config.name, f"unsupported {key} value '{number}' is requested")
            out[key] = names[number]
    for key in ("gpu_mem_limit", "do_copy_in_default_stream"):
        if key in params:
            out[key] = params[key]
    return out


def execution_providers(
    config: ModelSpec, gpu: bool, available: list[str]
) -> tuple[list[Provider], list[str]]:
    """ONNX Runtime's providers for an instance, in Triton's order, and notes to log."""
    accelerators = config.optimization
    out: list[Provider] = []
    notes: list[str] = []
    if gpu:
        cuda: dict[str, str] = _model_cuda_options(config)
        for ea in accelerators.gpu_accelerators:
            params: dict[str, str] = dict(ea.parameters)
            if ea.name == "tensorrt":
                options = tensorrt_options(config.name, params)
                if "TensorrtExecutionProvider" not in available:
                    notes.append(
                        f"model '{config.name}': this onnxruntime has no TensorRT execution "
                        "provider; the tensorrt accelerator is left out"
                    )
                    continue
                out.append(("TensorrtExecutionProvider", options))
            elif ea.name == "cuda":
                for key, value in params.items():
                    if key in _CUDA_BOOLS:
                        _check(config.name, "bool", value)
                    if value:
                        cuda[key] = value
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
