"""The thread and execution-mode parameters of a model config, read as Triton's backends
read them, and the thread count an instance gets from them.

ONNX Runtime: Triton's onnxruntime backend reads `execution_mode`,
`intra_op_thread_count` and `inter_op_thread_count` (in that order) from `parameters` as
C++ ints (backend_common.cc `ParseIntValue`, which is `std::stoi`) and fails the model
load when one is not an integer, or when `execution_mode` is neither 0 (ORT_SEQUENTIAL)
nor 1 (ORT_PARALLEL). shoal fails it the same way, with Triton's messages and the first
bad value in Triton's order, as a ConfigError: the worker reports it in its WorkerFailed
and the model shows UNAVAILABLE with the message as its reason.

PyTorch: Triton's pytorch backend reads the upper-case `INTRA_OP_THREAD_COUNT`, then
`INTER_OP_THREAD_COUNT`, the same way (`ParseParameter` -> `ParseIntValue`: a value that
is not an integer fails the load with the same message), and never reads the lower-case
keys. shoal reads them as Triton does; the lower-case `intra_op_thread_count` is shoal's
own extension there, read only when `INTRA_OP_THREAD_COUNT` is absent, and a value of it
that is not an integer is ignored (the caller logs a warning), as a key Triton ignores.

Integers are read exactly as `std::stoi` reads them, so that every config Triton loads
loads the same way here: leading whitespace and a sign are accepted and whatever follows
the digits is ignored ("4abc" and "4.5" are 4). A value with no leading digits fails. A
value outside the C int range also fails, with the same message; `std::stoi` raises
`std::out_of_range` there, which `ParseIntValue` does not catch.

Pure: no onnxruntime or torch import, so this is unit-tested without them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError

#: What the parameter readers take: the protobuf while it is validated (shoal.configs
#: .validation), the spec once the roles hold it.
ParamSource: TypeAlias = pb.ModelConfig | ModelSpec

INTRA_OP_THREAD_COUNT: Final = "intra_op_thread_count"
INTER_OP_THREAD_COUNT: Final = "inter_op_thread_count"
EXECUTION_MODE: Final = "execution_mode"
# Triton's onnxruntime backend's memory and session keys, read after the thread counts.
USE_DEVICE_ALLOCATOR_FOR_INITIALIZERS: Final = "session.use_device_allocator_for_initializers"
ENABLE_MEM_ARENA: Final = "enable_mem_arena"
ENABLE_MEM_PATTERN: Final = "enable_mem_pattern"
SHARE_SESSION_BETWEEN_INSTANCES: Final = "share_session_between_instances"
#: `optimization { graph { level } }` -> ONNX Runtime's graph optimization level, as
#: Triton's onnxruntime backend maps it; any other level is ORT_ENABLE_ALL.
GRAPH_LEVELS: Final = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
# shoal's older name for intra_op_thread_count, read only when that one is absent.
_INTRA_OP_ALIAS: Final = "shoal_intra_op_threads"
#: shoal's: the least compute (µs) each part of a shared batch must be expected to take
#: off the others (broker.batcher.DynamicBatcher.take_batches); 0 shares whenever
#: instances idle, -1 never.
SHARE_MIN_COMPUTE_US: Final = "shoal_share_min_compute_us"
DEFAULT_SHARE_MIN_COMPUTE_US: Final = 1000
#: shoal's: the most anonymous memory (MiB) an instance of the model may hold before the
#: broker kills it (and the launcher restarts it); 0: no limit. Unset: the server's
#: --instance-memory-limit-mb.
INSTANCE_MEMORY_LIMIT_MB: Final = "shoal_instance_memory_limit_mb"
# Triton's pytorch backend's keys.
TORCH_INTRA_OP_THREAD_COUNT: Final = "INTRA_OP_THREAD_COUNT"
TORCH_INTER_OP_THREAD_COUNT: Final = "INTER_OP_THREAD_COUNT"

# std::stoi: C-locale isspace, an optional sign, then base-10 digits up to the first
# non-digit. ASCII only: Python's \s and \d would also take Unicode spaces and digits.
_STOI_PREFIX: Final = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class OrtSessionParams:
    """How an ONNX Runtime session runs a graph's nodes.

    `parallel`: ORT_PARALLEL (independent branches run at once) instead of
    ORT_SEQUENTIAL. `intra_op_threads`: what the config asks for, None when it sets
    nothing, 0 for "the backend's default" (any value <= 0); `instance_threads` turns it
    into a count. `inter_op_threads`: the inter-op pool size, 0 for ONNX Runtime's
    default; ONNX Runtime uses that pool only in parallel mode. `graph_level`: the name
    of ONNX Runtime's GraphOptimizationLevel. `mem_arena`, `mem_pattern`: the CPU memory
    arena and memory pattern switches, None where the config leaves ORT's default.
    `device_allocator_for_initializers`: that session config entry's value, if set.
    """

    parallel: bool = False
    intra_op_threads: int | None = None
    inter_op_threads: int = 0
    graph_level: str = "ORT_ENABLE_ALL"
    mem_arena: bool | None = None
    mem_pattern: bool | None = None
    device_allocator_for_initializers: str | None = None


@dataclass(frozen=True, slots=True)
class TorchThreadParams:
    """PyTorch's thread pools, as the config asks for them.

    `intra_op_threads`: as in OrtSessionParams. `inter_op_threads`: 0 leaves torch's
    default. `ignored`: (key, value) of each lower-case value that is not an integer,
    for the caller to warn about.
    """

    intra_op_threads: int | None = None
    inter_op_threads: int = 0
    ignored: tuple[tuple[str, str], ...] = ()


def stoi(value: str) -> int | None:
    """`value` as `std::stoi` reads it; None where `std::stoi` would throw."""
    match = _STOI_PREFIX.match(value)
    if match is None:
        return None
    number = int(match.group(1))
    return number if _INT_MIN <= number <= _INT_MAX else None


def parameters(config: ParamSource) -> Mapping[str, str]:
    """The ``string_value`` of each of the config's ``parameters``."""
    if isinstance(config, ModelSpec):
        return config.parameters
    return {k: v.string_value for k, v in config.parameters.items()}


def int_parameter(config: ParamSource, key: str) -> int | None:
    """`parameters[key]` as an integer; None when the config does not set `key`.

    Raises ConfigError with Triton's "failed to convert '<v>' to integral number" when
    the value is not one.
    """
    value = parameters(config).get(key)
    if value is None:
        return None
    number = stoi(value)
    if number is None:
        raise ConfigError(config.name, f"failed to convert '{value}' to integral number")
    return number


def bool_parameter(config: ParamSource, key: str) -> bool | None:
    """`parameters[key]` as Triton's ParseBoolValue reads it (true/on/1, false/off/0, any
    case); None when the config does not set `key`. Raises ConfigError with Triton's
    "failed to convert '<v>' to boolean" otherwise."""
    value = parameters(config).get(key)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise ConfigError(config.name, f"failed to convert '{value}' to boolean")


def ort_session_params(config: ParamSource) -> OrtSessionParams:
    """The session settings Triton's onnxruntime backend reads, in its order:
    `optimization.graph.level`, `execution_mode`, `intra_op_thread_count` (or shoal's
    older name for it), `inter_op_thread_count`,
    `session.use_device_allocator_for_initializers`, `enable_mem_arena`,
    `enable_mem_pattern`, `share_session_between_instances` (checked, then moot: each
    instance is its own process, with its own session).

    Raises ConfigError for a value that is not an integer (or a boolean) and for an
    execution mode other than 0 or 1. A thread count <= 0 is 0: ONNX Runtime's default,
    as in Triton.
    """
    mode = int_parameter(config, EXECUTION_MODE) or 0
    if mode not in (0, 1):
        # Triton's text, two spaces and the detached period included.
        raise ConfigError(
            config.name,
            "Invalid configuration value provided. Expected values for "
            f" execution_mode are 0 or 1 but got {mode} .",
        )
    intra_op = None
    for key in (INTRA_OP_THREAD_COUNT, _INTRA_OP_ALIAS):
        intra_op = int_parameter(config, key)
        if intra_op is not None:
            intra_op = max(intra_op, 0)
            break
    inter_op = int_parameter(config, INTER_OP_THREAD_COUNT) or 0
    allocator = parameters(config).get(USE_DEVICE_ALLOCATOR_FOR_INITIALIZERS)
    mem_arena = bool_parameter(config, ENABLE_MEM_ARENA)
    mem_pattern = bool_parameter(config, ENABLE_MEM_PATTERN)
    bool_parameter(config, SHARE_SESSION_BETWEEN_INSTANCES)
    return OrtSessionParams(
        parallel=mode == 1,
        intra_op_threads=intra_op,
        inter_op_threads=max(inter_op, 0),
        graph_level=GRAPH_LEVELS.get(_graph_level(config), "ORT_ENABLE_ALL"),
        mem_arena=mem_arena,
        mem_pattern=mem_pattern,
        device_allocator_for_initializers=allocator,
    )


def _graph_level(config: ParamSource) -> int:
    if isinstance(config, ModelSpec):
        return config.optimization.graph_level
    return config.optimization.graph.level


def torch_thread_params(config: ParamSource) -> TorchThreadParams:
    """`INTRA_OP_THREAD_COUNT`, then `INTER_OP_THREAD_COUNT`, as Triton's pytorch backend
    reads them (raises ConfigError for a value that is not an integer); without the
    first, shoal's lenient `intra_op_thread_count` (or its older name), whose values
    that are not integers are skipped and listed in `ignored`. A count <= 0 is 0,
    torch's default (Triton leaves torch alone then).
    """
    intra_op = int_parameter(config, TORCH_INTRA_OP_THREAD_COUNT)
    ignored: list[tuple[str, str]] = []
    if intra_op is None:
        for key in (INTRA_OP_THREAD_COUNT, _INTRA_OP_ALIAS):
            value = parameters(config).get(key)
            if value is None:
                continue
            intra_op = stoi(value)
            if intra_op is not None:
                break
            ignored.append((key, value))
    inter_op = int_parameter(config, TORCH_INTER_OP_THREAD_COUNT) or 0
    return TorchThreadParams(
        intra_op_threads=None if intra_op is None else max(intra_op, 0),
        inter_op_threads=max(inter_op, 0),
        ignored=tuple(ignored),
    )


def instance_threads(requested: int | None, cores: Sequence[int]) -> int:
    """The intra-op thread count for an instance pinned to `cores` (none: not pinned,
    as a KIND_GPU instance), given what its config asks for (`intra_op_threads` above).

    Unset or 0, "the backend's default": for a pinned instance, one thread per core it
    owns, which is that default seen from inside its cores (ONNX Runtime's own would
    size the pool for the whole host and pin each thread to a core of its own, out of
    the instance's cores and onto other instances'). For an instance not pinned (KIND_GPU,
    whose CPU work is only the operators without a GPU kernel), 0: the backend picks, as
    Triton leaves it. Above 0: that many.
    """
    if requested is None or requested <= 0:
        return len(cores)
    return requested


#: A model whose files hold at least this much (its weights, mostly) computes enough per
#: sample for more intra-op threads to pay; below it a second thread costs more than it
#: brings (measured on mlp: 38 -> 53 µs of CPU a sample at batch 1 with 2 threads).
BORROW_MIN_MODEL_BYTES: Final = 16 << 20
#: A borrower's pool is at most this many times its own cores: with every instance busy
#: again, that many threads share each of its cores.
BORROW_MAX_FACTOR: Final = 4


def borrowing_threads(
    requested: int | None, cores: Sequence[int], may_use: int, model_bytes: int
) -> int:
    """``instance_threads``, or more for an instance that may borrow the cores of idle
    ones (shoal/broker/cores.py): up to ``may_use`` cores (0: it may not), when its config asks
    for no thread count and its model is large enough to use them."""
    own = instance_threads(requested, cores)
    if requested is not None or not cores or model_bytes < BORROW_MIN_MODEL_BYTES:
        return own
    return max(own, min(may_use, BORROW_MAX_FACTOR * len(cores)))


def share_min_compute_us(config: ParamSource) -> int:
    """`shoal_share_min_compute_us` (default 1000). Raises ConfigError for a value that is
    not an integer >= -1."""
    value = int_parameter(config, SHARE_MIN_COMPUTE_US)
    if value is None:
        return DEFAULT_SHARE_MIN_COMPUTE_US
    if value < -1:
        raise ConfigError(
            config.name,
            f"{SHARE_MIN_COMPUTE_US} must be -1 (never share) or >= 0 for {config.name}",
        )
    return value


def instance_memory_limit_mb(config: ParamSource) -> int | None:
    """`shoal_instance_memory_limit_mb`: None when the config does not set it, 0 for no
    limit. Raises ConfigError for a value that is not an integer >= 0."""
    value = int_parameter(config, INSTANCE_MEMORY_LIMIT_MB)
    if value is not None and value < 0:
        raise ConfigError(
            config.name,
            f"{INSTANCE_MEMORY_LIMIT_MB} must be 0 (no limit) or a number of MiB for {config.name}",
        )
    return value
