"""The broker's watch on frontends that have not exited but no longer say anything."""

from __future__ import annotations

import argparse

import pytest

from shoal.broker.frontend_watch import FrontendWatch
from shoal.configs.flags.broker import frontend_silence_flag


def _turns(w: FrontendWatch, start: float, end: float) -> list[tuple[float, bytes]]:
    """The broker's idle turns (every 0.25 s) from ``start`` to ``end``: (time, frontend)
    of each found stuck."""
    found = []
    for i in range(int((end - start) / 0.25) + 1):
        now = start + i * 0.25
        found += [(now, f) for f in w.stuck(now)]
    return found


def test_a_frontend_silent_past_the_bound_is_stuck_once() -> None:
    w = FrontendWatch(silent_s=3.0)
    w.expect(b"f-0-1", 10.0)
    w.expect(b"f-1-2", 10.0)
    for t in (10.0, 11.0, 12.0):
        w.heard(b"f-0-1", t)
        assert _turns(w, t, t + 0.75) == []
    # f-1-2 silent more than 3 s; judged once (the caller kills it)
    assert _turns(w, 13.0, 15.0) == [(13.25, b"f-1-2")]
    assert _turns(w, 15.25, 15.75) == [(15.25, b"f-0-1")]  # heard last at 12.0
    assert _turns(w, 16.0, 20.0) == []


def test_only_the_frontends_expected_are_judged() -> None:
    w = FrontendWatch(silent_s=3.0)
    w.heard(b"launcher", 0.0)  # a peer that never greeted as a frontend
    assert _turns(w, 0.0, 10.0) == []
    w.expect(b"f-0-1", 10.0)
    w.forget(b"f-0-1")  # it exited
    assert _turns(w, 10.25, 20.0) == []


def test_the_time_the_broker_did_not_listen_is_not_counted() -> None:
    w = FrontendWatch(silent_s=3.0)
    w.expect(b"f-0-1", 0.0)
    assert _turns(w, 0.0, 1.0) == []
    # the broker stopped 10 s (its next turn at 11.0): what the frontend sent meanwhile
    # is still unread, and the silence counted so far is 1 s
    assert _turns(w, 11.0, 12.75) == []
    assert _turns(w, 13.0, 14.0) == [(13.25, b"f-0-1")]


def test_a_bound_of_0_judges_none() -> None:
    w = FrontendWatch(silent_s=0.0)
    w.expect(b"f-0-1", 0.0)
    assert w.stuck(1e6) == []


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("2", 2.0), ("30.5", 30.5)])
def test_the_flag_takes_0_or_2_seconds_and_more(value: str, seconds: float) -> None:
    assert frontend_silence_flag(value) == seconds


@pytest.mark.parametrize("value", ["1", "1.9", "-1", "x", "nan"])
def test_the_flag_refuses_a_bound_that_would_kill_healthy_frontends(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="at least 2 seconds"):
        frontend_silence_flag(value)
