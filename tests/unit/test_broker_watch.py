"""The launcher's watch on a broker that has not exited but no longer answers."""

from __future__ import annotations

from shoal.broker_watch import BrokerWatch


def test_a_broker_silent_past_the_bound_once_it_answered_is_stuck() -> None:
    w = BrokerWatch(silent_s=30.0, ping_s=1.0)
    w.started()
    assert not w.stuck(1000.0)  # starting (reading the repository): not judged
    w.heard(10.0)
    assert not w.stuck(40.0)
    assert w.stuck(40.5)
    w.started()  # killed, and the next one starts
    assert not w.stuck(100.0)


def test_pings_go_once_a_second() -> None:
    w = BrokerWatch(ping_s=1.0)
    assert [w.ping_due(t) for t in (0.0, 0.5, 0.99, 1.0, 1.5, 2.2)] == [
        True, False, False, True, False, True,
    ]  # fmt: skip
