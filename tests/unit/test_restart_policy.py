"""The launcher's restart policy: backoff, its reset, and the crash-loop bound."""

from __future__ import annotations

from shoal.restart_policy import BROKER, WORKER, RestartPolicy, for_role


def _run(policy: RestartPolicy, runs: list[float]) -> list[float | None]:
    """The delays before each restart of a child that ran ``runs`` seconds each time."""
    delays: list[float | None] = []
    quick = 0
    for ran in runs:
        quick, delay = policy.after_exit(quick, ran)
        delays.append(delay)
    return delays


def test_quick_exits_back_off_and_a_stable_run_starts_over() -> None:
    assert _run(WORKER, [1, 1, 1, 1, 1, 1]) == [0.5, 1.0, 2.0, 5.0, 5.0, 5.0]
    assert _run(WORKER, [1, 1, 1, 60, 1]) == [0.5, 1.0, 2.0, 0.5, 1.0]


def test_a_broker_in_a_crash_loop_is_given_up_after_five_quick_exits() -> None:
    assert _run(BROKER, [1, 1, 1, 1, 1, 1]) == [0.1, 0.5, 1.0, 2.0, 5.0, None]
    # a broker killed now and then, each time after a while up, is always restarted
    assert _run(BROKER, [60.0] * 20) == [0.1] * 20


def test_only_a_worker_is_restarted_for_ever() -> None:
    assert for_role("broker") is BROKER
    assert for_role("frontend#1").give_up_after == 5
    assert for_role("worker simple/1 simple_0").give_up_after is None
    assert _run(WORKER, [0.0] * 50)[-1] == 5.0
