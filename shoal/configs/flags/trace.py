"""tritonserver's trace flags, parsed as it parses them (its command_line_parser.cc):
``--trace-config [triton,|opentelemetry,]<setting>=<value>`` (repeatable) and the
deprecated ``--trace-file``, ``--trace-level`` (repeatable), ``--trace-rate``,
``--trace-count`` and ``--trace-log-frequency``, which --trace-config overrides.

``shoal serve`` checks them (a bad value stops it with Triton's message) and passes them
on, as given, to the broker, which keeps the server's trace settings
(shoal/configs/trace_settings.py)."""

from __future__ import annotations

import argparse
import os
import re
from typing import Final

from shoal.configs.trace_settings import TraceSettings
from shoal.ipc.messages import TraceSetting

FLAGS: Final = (
    "--trace-config",
    "--trace-file",
    "--trace-level",
    "--trace-rate",
    "--trace-count",
    "--trace-log-frequency",
)
_REPEATABLE: Final = ("--trace-config", "--trace-level")
_INT32: Final = 2**31
_UINT32: Final = 2**32
_STOI = re.compile(r"\s*([+-]?\d+)")
#: OpenTelemetry's batch span processor settings and the variables that set their defaults
BSP_DEFAULTS: Final = {
    "bsp_max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
    "bsp_schedule_delay": ("OTEL_BSP_SCHEDULE_DELAY", "5000"),
    "bsp_max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
}
DEFAULT_OTLP_URL: Final = "http://localhost:4318/v1/traces"


def stoi(text: str, low: int = -_INT32, high: int = _INT32 - 1) -> int:
    """C++'s std::stoi: the leading integer of ``text`` (what follows is ignored);
    ValueError("invalid") without one, ValueError("range") outside [low, high]."""
    match = _STOI.match(text)
    if match is None:
        raise ValueError("invalid")
    number = int(match.group(1))
    if not low <= number <= high:
        raise ValueError("range")
    return number


def _option(text: str, low: int = -_INT32, high: int = _INT32 - 1) -> int:
    """tritonserver's ParseOption: its two messages."""
    try:
        return stoi(text, low, high)
    except ValueError as exc:
        if str(exc) == "invalid":
            raise ValueError(f"Invalid option value. Got {text}") from None
        raise ValueError(f"Provided option value is out of bound. Got {text}") from None


def _level(text: str) -> int:
    """A level's bits (0: OFF, 1: TIMESTAMPS, 2: TENSORS), as ParseTraceLevelOption."""
    v = text.lower()
    if v in ("false", "off"):
        return 0
    if v in ("true", "on", "min", "max", "timestamps"):
        return 1
    if v == "tensors":
        return 2
    raise ValueError(f"invalid value for trace level option: {text}")


def _mode(text: str) -> str:
    if text.lower() in ("triton", "opentelemetry"):
        return text.lower()
    raise ValueError(
        f'invalid value for trace mode option: {text.lower()}. Available options are "triton" '
        'and "opentelemetry"'
    )


def _switch(text: str) -> str:
    """An on/off option (``true``/``false``, ``on``/``off``, ``1``/``0``) as ``true`` or
    ``false``."""
    v = text.lower()
    if v in ("true", "on", "1", "false", "off", "0"):
        return "true" if v in ("true", "on", "1") else "false"
    raise ValueError(f"Invalid option value. Got {text}")


def _config_entry(arg: str) -> tuple[str, str, str]:
    """One --trace-config value: (mode or "" for global, setting, value)."""
    mode, comma, rest = arg.partition(",")
    if not comma:
        mode, rest = "", arg
    elif not mode:
        raise ValueError(
            "No trace mode specified. --trace-config option format is <trace mode>,"
            f"<setting>=<value> or <setting>=<value>. Got {arg}"
        )
    else:
        mode = _mode(mode)
    setting, eq, value = rest.partition("=")
    if not eq or not setting or not value:
        raise ValueError(
            f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}"
        )
    return mode, setting, value


def add_trace_flags(p: argparse.ArgumentParser) -> None:
    """The trace flags, kept as given (``trace_settings`` reads them)."""
    for flag in FLAGS:
        repeat = flag in _REPEATABLE
        p.add_argument(flag, action="append" if repeat else "store", default=None)


def trace_flags(args: argparse.Namespace) -> list[str]:
    """The trace flags ``args`` gives, as ``--flag=value`` arguments (for the broker)."""
    out = []
    for flag in FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            out.append(f"{flag}={v}")
    return out


def _bad(flag: str, exc: ValueError) -> ValueError:
    return ValueError(f'Bad option: "{flag}".\n{exc}')


def _deprecated(args: argparse.Namespace) -> tuple[dict[str, object], int, bool]:
    """The deprecated flags' fields, their level bits and whether one said OFF."""
    fields: dict[str, object] = {}
    bits, off = 0, False
    if args.trace_file is not None:
        fields["file"] = args.trace_file
    for flag, name in (("rate", "rate"), ("count", "count"), ("log_frequency", "log_frequency")):
        value = getattr(args, f"trace_{flag}")
        if value is not None:
            try:
                fields[name] = _option(value)
            except ValueError as exc:
                raise _bad("--trace-" + flag.replace("_", "-"), exc) from None
    for text in args.trace_level or []:
        try:
            b = _level(text)
        except ValueError as exc:
            raise _bad("--trace-level", exc) from None
        off |= b == 0
        bits |= b
    return fields, bits, off


def trace_settings(args: argparse.Namespace) -> TraceSettings:
    """The server's trace settings from its flags; ValueError: Triton's message."""
    fields, bits, off = _deprecated(args)
    entries: list[tuple[str, str, str]] = []
    for arg in args.trace_config or []:
        try:
            entries.append(_config_entry(arg))
        except ValueError as exc:
            raise _bad("--trace-config", exc) from None
    mode = "triton"
    for where, setting, value in entries:
        if where:
            continue
        try:
            if setting == "rate":
                fields["rate"] = _option(value)
            elif setting == "count":
                fields["count"] = _option(value)
            elif setting == "level":
                b = _level(value)
                off |= b == 0
                bits |= b
            elif setting == "mode":
                mode = _mode(value)
        except ValueError as exc:
            raise _bad(f"--trace-config {setting}", exc) from None
    options = _mode_options(mode, [(s, v) for w, s, v in entries if w == mode], fields)
    levels = () if off else tuple(n for b, n in ((1, "TIMESTAMPS"), (2, "TENSORS")) if bits & b)
    for name in ("rate", "log_frequency"):  # (unsigned in Triton: a negative one wraps)
        if name in fields:
            fields[name] = int(fields[name]) % _UINT32  # type: ignore[call-overload]
    defaults = TraceSetting(levels=levels, **fields)  # type: ignore[arg-type]
    return TraceSettings(defaults, mode, options)


def _mode_options(
    mode: str, entries: list[tuple[str, str]], fields: dict[str, object]
) -> dict[str, str]:
    """The mode's own settings: triton's file and log-frequency go into ``fields``; the
    others are kept (as GET /v2/trace/setting shows them), opentelemetry's with its batch
    span processor's defaults."""
    options: dict[str, str] = {}
    for setting, value in entries:
        try:
            if mode == "triton" and setting == "file":
                fields["file"] = value
            elif mode == "triton" and setting == "log-frequency":
                fields["log_frequency"] = _option(value)
            elif setting in BSP_DEFAULTS:
                options[setting] = str(_option(value, 0, 2**64 - 1) % _UINT32)
            elif mode == "opentelemetry" and setting == "hop_spans":  # (shoal's own)
                options[setting] = _switch(value)
            elif setting == "resource" and "resource" in options:
                options["resource"] += "," + value
            else:
                options[setting] = value
        except ValueError as exc:
            raise _bad(f"--trace-config {mode},{setting}", exc) from None
    if mode == "opentelemetry":
        fields.pop("file", None)  # (Triton ignores the deprecated file flags here)
        fields.pop("log_frequency", None)
        for setting, (env, default) in BSP_DEFAULTS.items():
            if setting not in options:
                value = os.environ.get(env, default)
                try:
                    options[setting] = str(_option(value, 0, 2**64 - 1) % _UINT32)
                except ValueError as exc:
                    raise _bad(env, exc) from None
    return options
