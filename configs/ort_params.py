"""The thread and execution-mode parameters of a model config, read as Triton reads them.

Triton's onnxruntime backend reads `execution_mode`, `intra_op_thread_count` and
`inter_op_thread_count` from `parameters` as C++ ints (backend_common.cc `ParseIntValue`,
which is `std::stoi`) and fails the model load when one is not an integer, or when
`execution_mode` is neither 0 (ORT_SEQUENTIAL) nor 1 (ORT_PARALLEL). shoal fails it the
same way, with Triton's messages, as a ConfigError: the worker reports it in its
WorkerFailed and the model shows UNAVAILABLE with the message as its reason.

Integers are read exactly as `std::stoi` reads them, so that every config Triton loads
loads the same way here: leading whitespace and a sign are accepted and whatever follows
the digits is ignored ("4abc" and "4.5" are 4). A value with no leading digits fails. A
value outside the C int range also fails, with the same message; `std::stoi` raises
`std::out_of_range` there, which `ParseIntValue` does not catch.

shoal reads `intra_op_thread_count` for the PyTorch backend too (as its torch thread
count); `execution_mode` and `inter_op_thread_count` concern ONNX Runtime only. Pure: no
onnxruntime import, so this is unit-tested without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from tritonclient.grpc import model_config_pb2 as pb

from configs.schema import ConfigError

INTRA_OP_THREAD_COUNT: Final = "intra_op_thread_count"
INTER_OP_THREAD_COUNT: Final = "inter_op_thread_count"
EXECUTION_MODE: Final = "execution_mode"
# shoal's older name for intra_op_thread_count, read only when that one is absent.
_INTRA_OP_ALIAS: Final = "shoal_intra_op_threads"

# std::stoi: C-locale isspace, an optional sign, then base-10 digits up to the first
# non-digit. ASCII only: Python's \s and \d would also take Unicode spaces and digits.
_STOI_PREFIX: Final = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class OrtSessionParams:
    """How an ONNX Runtime session runs a graph's nodes.

    `parallel`: ORT_PARALLEL (independent branches run at once) instead of
    ORT_SEQUENTIAL. `inter_op_threads`: the inter-op pool size, 0 for ONNX Runtime's
    default; ONNX Runtime uses that pool only in parallel mode.
    """

    parallel: bool = False
    inter_op_threads: int = 0


def stoi(value: str) -> int | None:
    """`value` as `std::stoi` reads it; None where `std::stoi` would throw."""
    match = _STOI_PREFIX.match(value)
    if match is None:
        return None
    number = int(match.group(1))
    return number if _INT_MIN <= number <= _INT_MAX else None


def int_parameter(config: pb.ModelConfig, key: str) -> int | None:
    """`parameters[key]` as an integer; None when the config does not set `key`.

    Raises ConfigError with Triton's "failed to convert '<v>' to integral number" when
    the value is not one.
    """
    if key not in config.parameters:
        return None
    value = config.parameters[key].string_value
    number = stoi(value)
    if number is None:
        raise ConfigError(config.name, f"failed to convert '{value}' to integral number")
    return number


def intra_op_threads(config: pb.ModelConfig) -> int | None:
    """The intra-op thread count the config asks for; None when it sets none.

    Any value <= 0 is 0, the backend's own default (ONNX Runtime: one thread per
    physical core; PyTorch: its own). Raises ConfigError for a value that is not an
    integer.
    """
    for key in (INTRA_OP_THREAD_COUNT, _INTRA_OP_ALIAS):
        count = int_parameter(config, key)
        if count is not None:
            return max(count, 0)
    return None


def ort_session_params(config: pb.ModelConfig) -> OrtSessionParams:
    """`execution_mode` and `inter_op_thread_count` (checked in that order, as in Triton).

    Raises ConfigError for a value that is not an integer and for an execution mode
    other than 0 or 1. An inter-op count <= 0 leaves ONNX Runtime's default, as in
    Triton.
    """
    mode = int_parameter(config, EXECUTION_MODE) or 0
    if mode not in (0, 1):
        # Triton's text, two spaces and the detached period included.
        raise ConfigError(
            config.name,
            "Invalid configuration value provided. Expected values for "
            f" execution_mode are 0 or 1 but got {mode} .",
        )
    inter_op = int_parameter(config, INTER_OP_THREAD_COUNT) or 0
    return OrtSessionParams(parallel=mode == 1, inter_op_threads=max(inter_op, 0))
