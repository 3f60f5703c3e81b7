"""Flag parsers and flags every process takes (tritonserver's spellings): booleans, sizes,
seconds and counts, and the logging flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from shoal.ipc.messages import LOG_FORMATS, LogSettings

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def bool_flag(value: str) -> bool:
    """tritonserver booleans: true/false/1/0 (case-insensitive)."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/1/0), got '{value}'")


def mib_flag(value: str) -> int:
    """A whole number of MiB, 0 or more (0: no limit)."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB (0: none), got '{value}'")
    return number


def checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that refuses what ``parse`` refuses and keeps the text."""

    def check(value: str) -> str:
        try:
            parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return check


def dest(flag: str) -> str:
    """argparse's attribute for ``--a-flag``: ``a_flag``."""
    return flag.lstrip("-").replace("-", "_")


def seconds_flag(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got '{value}'")
    return number


def count_flag(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got '{value}'")
    return number


def add_log_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's logging flags, for ``shoal serve`` and each role process."""
    p.add_argument("--log-verbose", default=0, type=int)
    p.add_argument("--log-info", type=bool_flag, default=True)
    p.add_argument("--log-warning", type=bool_flag, default=True)
    p.add_argument("--log-error", type=bool_flag, default=True)
    p.add_argument("--log-format", choices=LOG_FORMATS, default="default")
    p.add_argument("--log-file", default="", help="append the log here, not to stderr")


def log_settings(args: argparse.Namespace) -> LogSettings:
    return LogSettings(
        args.log_info,
        args.log_warning,
        args.log_error,
        max(args.log_verbose, 0),
        args.log_format,
        args.log_file,
    )


def log_flags(s: LogSettings) -> list[str]:
    """The flags that give a role process these settings."""
    return [
        f"--log-verbose={s.verbose}",
        f"--log-info={str(s.info).lower()}",
        f"--log-warning={str(s.warning).lower()}",
        f"--log-error={str(s.error).lower()}",
        f"--log-format={s.format}",
        f"--log-file={s.file}",
    ]
