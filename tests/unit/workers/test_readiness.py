"""A model's own readiness check (shoal/workers/readiness.py): Triton's Python backend
answers, with the check's call passed in."""

from __future__ import annotations

import threading
from typing import Any

from shoal.ipc.readiness import decode, encode
from shoal.workers.readiness import NOT_BOOL, TIMED_OUT, ReadinessCheck


def test_the_checks_value_is_the_answer() -> None:
    assert ReadinessCheck(lambda: True).ask() == (True, "")
    assert ReadinessCheck(lambda: False).ask() == (False, "")


def test_an_exception_or_a_value_that_is_not_a_bool_is_not_ready() -> None:
    def fails() -> bool:
        raise RuntimeError("database unreachable")

    assert ReadinessCheck(fails).ask() == (False, "RuntimeError: database unreachable")
    assert ReadinessCheck(lambda: 1).ask() == (False, NOT_BOOL)
    assert ReadinessCheck(lambda: None).ask() == (False, NOT_BOOL)


def test_a_slow_check_is_not_ready_and_no_probe_starts_another_meanwhile() -> None:
    """Past the timeout the probe says not ready; the check goes on, and a probe that
    comes meanwhile waits for it instead of calling the model again."""
    release = threading.Event()
    calls: list[int] = []

    def slow() -> Any:
        calls.append(1)
        release.wait(10)
        return True

    check = ReadinessCheck(slow, timeout_s=0.05)
    assert check.ask() == (False, TIMED_OUT)
    assert check.ask() == (False, TIMED_OUT)
    assert len(calls) == 1  # the second probe waited for the running call
    release.set()
    check._timeout_s = 10.0
    assert check.ask() == (True, "")


def test_answers_travel_as_the_socket_writes_them() -> None:
    for answer in [(True, ""), (False, ""), (False, "RuntimeError: down")]:
        assert decode(encode(answer)) == answer
    assert decode(b"") == (False, "no answer")
