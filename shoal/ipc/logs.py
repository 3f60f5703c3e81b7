"""Logging of every role, with tritonserver's settings: ``--log-verbose``, ``--log-info``,
``--log-warning``, ``--log-error`` and ``--log-format``.

The flags set them when a process starts. Triton's logging extension changes them while
it runs: the broker holds the server's settings and sends them to every frontend and
worker, now and in the welcome of any that (re)joins later. A process applies them to
its root logger (verbose > 0: DEBUG) and to a gate that drops whole severities.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time

import msgspec

from shoal.ipc import messages as m


class _Gate(logging.Filter):
    """Drops the severities switched off (``log_info`` false drops INFO records...)."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self.error
        if record.levelno >= logging.WARNING:
            return self.warning
        if record.levelno >= logging.INFO:
            return self.info
        return True


class _Formatter(logging.Formatter):
    """``HH:MM:SS.mmm`` (default) or ISO 8601 in UTC, as Triton's ``--log-format``."""

    iso = False

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if self.iso:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        return time.strftime("%H:%M:%S", time.localtime(record.created)) + (
            f".{int(record.msecs):03d}"
        )


def rewrite(record: logging.LogRecord, level: int, msg: str, *args: object) -> None:
    """Turn ``record`` into one line ``msg % args`` at ``level``, without its traceback:
    for a filter that tells a third-party library's noise from the server's errors."""
    record.msg = msg
    record.args = args
    record.exc_info = None
    record.exc_text = None
    record.levelno = level
    record.levelname = logging.getLevelName(level)


_gate = _Gate()
_formatter: _Formatter | None = None
_current = m.LogSettings()


def setup_logging(role: str, settings: m.LogSettings) -> None:
    """One handler for the process, its lines naming ``role`` and the pid: stderr, or the
    log file, appended to (every process of a server writes whole lines to the same
    file; O_APPEND keeps them from overwriting one another)."""
    global _formatter, _current
    _current = settings
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    failed: OSError | None = None
    if settings.file:
        try:
            # reopened when logrotate renames it (a copytruncate rotation needs nothing)
            handler = logging.handlers.WatchedFileHandler(settings.file, encoding="utf-8")
        except OSError as exc:
            failed = exc
    line = f"%(asctime)s {role}[%(process)d] %(levelname).1s %(name)s: %(message)s"
    _formatter = _Formatter(line)
    handler.setFormatter(_formatter)
    handler.addFilter(_gate)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    apply(settings)
    if failed is not None:
        logging.getLogger("shoal").error("cannot open the log file, logging to stderr: %s", failed)


def apply(settings: m.LogSettings) -> None:
    """The settings a process may change while it runs (not its log file)."""
    global _current
    logging.getLogger().setLevel(logging.DEBUG if settings.verbose > 0 else logging.INFO)
    _gate.info, _gate.warning, _gate.error = settings.info, settings.warning, settings.error
    if _formatter is not None:
        _formatter.iso = settings.format == "ISO8601"
    _current = msgspec.structs.replace(settings, file=_current.file)  # set at start only


def current() -> m.LogSettings:
    return _current
