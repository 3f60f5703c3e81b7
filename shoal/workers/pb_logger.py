"""``pb_utils.Logger``: a Python model's lines into its worker's log, at Triton's levels."""

from __future__ import annotations

import enum
import logging

from shoal.workers.pb_errors import expect

_log = logging.getLogger("shoal.worker.model")


class _Level(enum.Enum):
    """Triton's ``pb_utils.Logger.LogLevel`` (an enum, not numbers: ``log`` refuses 1)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    _Level.INFO: logging.INFO,
    _Level.WARNING: logging.WARNING,
    _Level.ERROR: logging.ERROR,
    _Level.VERBOSE: logging.DEBUG,
}


class Logger:
    """Lines into the worker's log, at Triton's levels."""

    LogLevel = _Level  # (Triton's Logger.LogLevel)
    INFO, WARNING = _Level.INFO, _Level.WARNING
    ERROR, VERBOSE = _Level.ERROR, _Level.VERBOSE

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, _Level.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, _Level.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, _Level.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, _Level.VERBOSE)

    @staticmethod
    def log(message: str, level: _Level = _Level.INFO) -> None:
        expect("Logger.log()", "message", message, str)
        expect("Logger.log()", "level", level, _Level)
        _log.log(_LEVELS[level], "%s", message)
