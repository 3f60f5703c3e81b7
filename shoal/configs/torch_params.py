"""How a PyTorch model runs: the switches Triton's PyTorch backend reads from `parameters`
(src/pt/model_state.cc ParseParameters), in its order, each with Triton's ParseBoolValue
(true/on/1, false/off/0, any case; anything else fails the load with "failed to convert
'<v>' to boolean"):

- ``DISABLE_OPTIMIZED_EXECUTION`` (false): TorchScript's graph executor optimizations off;
- ``ENABLE_CACHE_CLEANING`` (false): the CUDA caching allocator emptied after each
  execution (GPU instances);
- ``INFERENCE_MODE`` (true): ``torch.inference_mode``; false runs under ``no_grad`` only;
- ``DISABLE_CUDNN`` (false);
- ``ENABLE_TENSOR_FUSER``, ``ENABLE_JIT_PROFILING``, ``ENABLE_JIT_EXECUTOR``: TorchScript's
  switches, changed only when set;
- ``ENABLE_WEIGHT_SHARING``: read, and meaningless in shoal (one instance per process).

The thread counts are shoal.configs.backend_params.torch_thread_params. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.configs.backend_params import ParamSource, bool_parameter


@dataclass(frozen=True, slots=True)
class TorchExecParams:
    optimized_execution: bool = True
    cache_cleaning: bool = False
    inference_mode: bool = True
    cudnn: bool = True
    tensor_fuser: bool | None = None  # None: leave torch's setting
    weight_sharing: bool | None = None
    jit_profiling: bool | None = None
    jit_executor: bool | None = None


def torch_exec_params(config: ParamSource) -> TorchExecParams:
    """The switches; raises ConfigError for the first value that is not a boolean."""
    disable_optimized = bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION")
    cache_cleaning = bool_parameter(config, "ENABLE_CACHE_CLEANING")
    inference_mode = bool_parameter(config, "INFERENCE_MODE")
    disable_cudnn = bool_parameter(config, "DISABLE_CUDNN")
    return TorchExecParams(
        optimized_execution=not disable_optimized,
        cache_cleaning=bool(cache_cleaning),
        inference_mode=inference_mode is not False,
        cudnn=not disable_cudnn,
        tensor_fuser=bool_parameter(config, "ENABLE_TENSOR_FUSER"),
        weight_sharing=bool_parameter(config, "ENABLE_WEIGHT_SHARING"),
        jit_profiling=bool_parameter(config, "ENABLE_JIT_PROFILING"),
        jit_executor=bool_parameter(config, "ENABLE_JIT_EXECUTOR"),
    )
