"""Triton's logging extension (``/v2/logging``, gRPC ``LogSettings``): the settings as
each protocol shows them, and an update's checks in Triton 2.51's order and words
(compared with triton-peer): the log file first, then each value's type, then the format.

One deliberate difference: an update is applied whole or not at all. Triton 2.51 checks
the format's value last, after applying the other settings of the same update, so a
refused update can still change the verbose level; shoal refuses before changing
anything, and answers a bad format 400 over HTTP (Triton: 503, a retryable status).
"""

from __future__ import annotations

from typing import Any, Final

from shoal.ipc.errors import Code, ServingError
from shoal.ipc.messages import LOG_FORMATS, LogSettings

FILE_REFUSED: Final = "log file location can not be updated through network protocol"
_SWITCHES: Final = {"log_info": "info", "log_warning": "warning", "log_error": "error"}

Changes = dict[str, bool | int | str]


def as_json(s: LogSettings) -> dict[str, Any]:
    """The settings as Triton's HTTP answer shows them, in its order."""
    return {
        "log_file": s.file,
        "log_info": s.info,
        "log_warning": s.warning,
        "log_error": s.error,
        "log_verbose_level": s.verbose,
        "log_format": s.format,
    }


def _format(value: str, flag: str) -> str:
    if value not in LOG_FORMATS:
        raise ServingError(Code.INVALID_ARG, f"invalid argument for {flag}, got: {value}")
    return value


def http_changes(doc: dict[str, Any]) -> Changes:
    """The changes an HTTP update's JSON object asks for (other members, and members
    that are null, are ignored, as by Triton)."""
    doc = {k: v for k, v in doc.items() if v is not None}
    if "log_file" in doc:
        raise ServingError(Code.UNSUPPORTED, FILE_REFUSED)
    changes: Changes = {}
    for key, field in _SWITCHES.items():
        if key in doc:
            if type(doc[key]) is not bool:
                raise ServingError(Code.INTERNAL, "attempt to access JSON non-boolean as boolean")
            changes[field] = doc[key]
    if "log_verbose_level" in doc:
        level = doc["log_verbose_level"]
        if type(level) is not int or not 0 <= level < 2**64:
            raise ServingError(
                Code.INTERNAL, "attempt to access JSON non-unsigned-integer as unsigned-integer"
            )
        changes["verbose"] = min(level, 2**32 - 1)
    if "log_format" in doc:
        if not isinstance(doc["log_format"], str):
            raise ServingError(Code.INTERNAL, "attempt to access JSON non-string as string")
        changes["format"] = _format(doc["log_format"], "--log_format")
    return changes


def grpc_changes(settings: Any) -> Changes:
    """The changes of a LogSettingsRequest's ``settings`` map (SettingValue oneofs)."""
    if "log_file" in settings:
        raise ServingError(Code.UNSUPPORTED, FILE_REFUSED)

    def value(key: str, choice: str, kind: str) -> Any:
        v = settings[key]
        if v.WhichOneof("parameter_choice") != choice:
            raise ServingError(Code.INVALID_ARG, f"expect {kind} for '{key}'")
        return getattr(v, choice)

    changes: Changes = {}
    for key, field in _SWITCHES.items():
        if key in settings:
            changes[field] = value(key, "bool_param", "boolean")
    if "log_verbose_level" in settings:
        changes["verbose"] = value("log_verbose_level", "uint32_param", "int32")
    if "log_format" in settings:
        changes["format"] = _format(value("log_format", "string_param", "string"), "log_format")
    return changes


def grpc_settings(s: LogSettings, response: Any) -> Any:
    """Fill a LogSettingsResponse's ``settings`` map."""
    out = response.settings
    out["log_file"].string_param = s.file
    out["log_info"].bool_param = s.info
    out["log_warning"].bool_param = s.warning
    out["log_error"].bool_param = s.error
    out["log_verbose_level"].uint32_param = s.verbose
    out["log_format"].string_param = s.format
    return response
