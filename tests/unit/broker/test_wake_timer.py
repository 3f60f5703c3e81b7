"""The broker's wake-up timer: a timerfd on time.monotonic()'s clock."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pytest

from shoal.broker.wake_timer import WakeTimer


@pytest.fixture
def timer() -> Iterator[WakeTimer]:
    t = WakeTimer()
    yield t
    t.close()


def _readable(timer: WakeTimer, wait_s: float) -> bool:
    return bool(select.select([timer], [], [], wait_s)[0])


def test_it_fires_at_the_time_and_not_before(timer: WakeTimer) -> None:
    at = time.monotonic() + 0.003  # between two milliseconds, most likely
    timer.arm(at)
    assert _readable(timer, 5.0)
    assert time.monotonic() >= at  # same clock as the router's: never early
    timer.clear()
    assert not _readable(timer, 0.0)  # consumed; one-shot


def test_a_time_already_past_fires_at_once(timer: WakeTimer) -> None:
    timer.arm(time.monotonic() - 1.0)
    assert _readable(timer, 5.0)


def test_none_disarms_and_rearming_replaces_the_time(timer: WakeTimer) -> None:
    timer.arm(time.monotonic() + 0.02)
    timer.arm(None)
    assert not _readable(timer, 0.1)  # would have fired 80 ms ago
    timer.arm(time.monotonic() + 3600.0)
    timer.arm(time.monotonic() + 0.001)  # sooner: the new time wins
    assert _readable(timer, 5.0)


def test_after_a_firing_the_same_time_arms_again(timer: WakeTimer) -> None:
    """clear() forgets the time: the loop may ask for the same deadline again (a version
    still holding work) and must be woken, not left to sleep on a disarmed timer."""
    at = time.monotonic() + 0.001
    timer.arm(at)
    assert _readable(timer, 5.0)
    timer.clear()
    timer.arm(at)
    assert _readable(timer, 5.0)
