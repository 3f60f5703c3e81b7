"""A wake-up to the microsecond for the broker's poll: a Linux timerfd.

zmq_poll counts its timeout in whole milliseconds, so a queue delay of 100 µs (the
example in Triton's own documentation) slept 1 ms, and every delay and queue timeout ran
up to 1 ms late. The broker arms this timer at the router's next deadline, on
``time.monotonic()``'s clock (CLOCK_MONOTONIC) as an absolute time, and polls its
descriptor beside its sockets: the poll returns when the deadline passes, whatever the
millisecond timeout says.

Python has ``os.timerfd_create`` from 3.13 only; this calls the C library, as it does.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from typing import Final

_CLOCK_MONOTONIC: Final = 1
_TFD_NONBLOCK: Final = os.O_NONBLOCK
_TFD_CLOEXEC: Final = os.O_CLOEXEC
_TFD_TIMER_ABSTIME: Final = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.timerfd_create.restype = ctypes.c_int
_libc.timerfd_settime.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(_Itimerspec),
    ctypes.POINTER(_Itimerspec),
]
_libc.timerfd_settime.restype = ctypes.c_int


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


class WakeTimer:
    """One-shot: readable from ``arm(at)``'s time until ``clear``; arming again (or with
    None, which disarms) replaces the previous time."""

    def __init__(self) -> None:
        self._fd = _check(_libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        self._at: float | None = None

    def fileno(self) -> int:
        return self._fd

    def arm(self, at: float | None) -> None:
        """Fire at ``at`` (seconds on time.monotonic()'s clock); None: never. Arming the
        time already set costs no system call."""
        if at == self._at:
            return
        spec = _Itimerspec()
        if at is not None:
            ns = max(int(at * 1e9), 1)  # 0 would disarm: a time long past fires at once
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        _check(_libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None))
        self._at = at

    def clear(self) -> None:
        """Consume a firing (the descriptor is readable until then); the timer is disarmed
        after it fired, so the next ``arm`` sets it whatever the time."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        self._at = None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
