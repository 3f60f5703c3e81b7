"""Triton's trace extension (``/v2[/models/{m}]/trace/setting``, gRPC ``TraceSetting``):
an update's checks in Triton's order and words (its http_server.cc and grpc_server.cc
HandleTrace), and the settings as each protocol shows them. The settings themselves are
the broker's (shoal/configs/trace_settings.py).

Values are strings (``trace_level``: an array of them); a JSON null, or a gRPC setting
with no value, clears the field: the global value (for a model) or the flags' value
(globally) applies again.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.configs.flags.trace import stoi
from shoal.configs.trace_settings import Changes
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.messages import TraceReply

FILE_REFUSED: Final = "trace file location can not be updated through network protocol"
_UINT32_MAX: Final = 2**32 - 1
_INT32_MAX: Final = 2**31 - 1
_NUMBERS: Final = {"trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def _levels(values: list[str]) -> list[str] | None:
    """The levels of a trace_level update (None: no known level named, no change)."""
    levels: list[str] = []
    for v in values:
        if v == "OFF":
            if len(values) != 1:
                raise ServingError(
                    Code.INVALID_ARG, "Expect only one trace level 'OFF' is specified"
                )
            return []
        if v in ("TIMESTAMPS", "TENSORS") and v not in levels:
            levels.append(v)
    return sorted(levels, key=("TIMESTAMPS", "TENSORS").index) or None


def _number(key: str, text: str, grpc: bool) -> int:
    """std::stoi as Triton applies it to ``key`` (rate and log_frequency kept unsigned)."""
    low = -1 if key == "trace_count" else -(2**31)
    try:
        value = stoi(text)
    except ValueError as exc:
        if str(exc) == "invalid":
            raise ServingError(Code.INVALID_ARG, f"Unable to parse '{key}', got: {text}") from None
        bounds = f"[ {low if key == 'trace_count' else 0}, "
        bounds += f"{_INT32_MAX if key == 'trace_count' else _UINT32_MAX} ]"
        raise ServingError(
            Code.INVALID_ARG,
            f"Unable to parse '{key}', value is out of range {bounds}, got: {text}",
        ) from None
    if key == "trace_count" and value < -1:
        sep = " " if grpc else ""
        raise ServingError(
            Code.INVALID_ARG,
            f"Unable to parse '{key}'. Expecting value >= -1, got:{sep}{text}",
        )
    return value % 2**32 if key != "trace_count" else value


def http_changes(doc: dict[str, Any]) -> Changes:
    """The changes an HTTP update's JSON object asks for (unknown members ignored)."""
    if "trace_file" in doc:
        raise ServingError(Code.UNSUPPORTED, FILE_REFUSED)
    changes: Changes = {}
    if "trace_level" in doc:
        value = doc["trace_level"]
        if value is None:
            changes["levels"] = None
        else:
            if not isinstance(value, list):
                raise ServingError(Code.INTERNAL, "attempt to access JSON non-array as array")
            if not all(isinstance(v, str) for v in value):
                raise ServingError(Code.INTERNAL, "attempt to access JSON non-string as string")
            levels = _levels(value)
            if levels is not None:
                changes["levels"] = levels
    for key, field in _NUMBERS.items():
        if key in doc:
            value = doc[key]
            if value is None:
                changes[field] = None
            elif not isinstance(value, str):
                raise ServingError(Code.INTERNAL, "attempt to access JSON non-string as string")
            else:
                changes[field] = _number(key, value, grpc=False)
    return changes


def grpc_changes(settings: Any) -> Changes:
    """The changes of a TraceSettingRequest's ``settings`` map (repeated string values)."""
    if "trace_file" in settings:
        raise ServingError(Code.UNSUPPORTED, FILE_REFUSED)
    changes: Changes = {}
    if "trace_level" in settings:
        values = list(settings["trace_level"].value)
        if not values:
            changes["levels"] = None
        elif (levels := _levels(values)) is not None:
            changes["levels"] = levels
    for key, field in _NUMBERS.items():
        if key in settings:
            values = list(settings[key].value)
            if not values:
                changes[field] = None
            elif len(values) != 1:
                raise ServingError(Code.INVALID_ARG, f"expect only 1 value for '{key}'")
            else:
                changes[field] = _number(key, values[0], grpc=True)
    return changes


def as_settings(reply: TraceReply, remaining: int | None) -> dict[str, str | list[str]]:
    """The settings as Triton answers them, in its order (``remaining``: the traces the
    count still allows here, where this frontend samples under the setting)."""
    s = reply.setting
    out: dict[str, str | list[str]] = {
        "trace_level": list(s.levels) or ["OFF"],
        "trace_rate": str(s.rate),
        "trace_count": str(s.count if remaining is None else remaining),
    }
    if reply.mode == "triton":
        out["log_frequency"] = str(s.log_frequency)
        out["trace_file"] = s.file
    out["trace_mode"] = reply.mode
    for key, value in reply.options.items():
        if key not in ("file", "log-frequency"):
            out[key] = value
    return out


def grpc_settings(settings: dict[str, str | list[str]], response: Any) -> Any:
    """``settings`` into a TraceSettingResponse (each value a list of strings)."""
    for key, value in settings.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response
