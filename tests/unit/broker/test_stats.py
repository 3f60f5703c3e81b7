"""Latency windows for the metrics' summaries, and the counting of reruns (pure)."""

from __future__ import annotations

import math

from shoal.broker.stats import SUMMARY_WINDOW_S, VersionStats, _Window
from shoal.ipc import messages as m


def test_quantiles_are_nearest_rank_over_the_window() -> None:
    w = _Window()
    for us in range(1, 101):  # 1..100 µs
        w.add(0.0, us)
    assert w.quantiles([0.5, 0.9, 0.99, 1.0, 0.0], 1.0) == [50, 90, 99, 100, 1]


def test_observations_older_than_the_window_drop_out() -> None:
    w = _Window()
    w.add(0.0, 1000)
    w.add(30.0, 10)
    assert w.quantiles([0.5], 30.0) == [10]  # ranks 1 of 2
    assert w.quantiles([1.0], SUMMARY_WINDOW_S + 1) == [10]  # the first has expired
    (q,) = w.quantiles([0.5], 30.0 + SUMMARY_WINDOW_S + 1)
    assert math.isnan(q)  # nothing in the last minute


def test_a_quantile_outside_zero_to_one_is_nan_not_an_error() -> None:
    w = _Window()
    w.add(0.0, 5)
    got = w.quantiles([math.nan, 1.5, -0.1, math.inf, 0.5], 0.0)
    assert [math.isnan(v) for v in got] == [True, True, True, True, False]
    assert got[-1] == 5


def test_cache_hits_and_misses_count_as_tritons_and_feed_their_windows() -> None:
    from shoal.broker.stats import VersionStats

    stats = VersionStats("m", 1)
    stats.keep_windows()
    stats.cache_hit(request_ns=50_000, hit_ns=20_000, now=1.0)
    stats.cache_missed(lookup_ns=30_000, now=1.0)
    st = stats.snapshot().inference_stats
    assert (st.success.count, st.success.ns, st.queue.count, st.queue.ns) == (1, 80_000, 1, 0)
    assert (st.cache_hit.count, st.cache_hit.ns) == (1, 20_000)
    assert (st.cache_miss.count, st.cache_miss.ns) == (1, 30_000)
    assert stats.snapshot().inference_count == 0 and stats.snapshot().execution_count == 0
    got = stats.summaries([0.5], 1.0)
    assert (got["cache_hit"], got["cache_miss"], got["request"]) == ([20], [30], [50])


def test_each_run_of_rescheduled_requests_counts_as_tritons() -> None:
    """Each run: a request each (its time the run's, no queue time), an inference per
    sample, one execution; a failed one counts as a failure only."""
    st = VersionStats("m", 1)
    done = m.BatchDone(-1, 3, 1000, 5000, 500)
    st.reran(m.RerunDone(done, ok=2, ok_samples=2, failed=1), now=1.0)
    s = st.snapshot()
    assert (s.execution_count, s.inference_count) == (1, 2)
    inference = s.inference_stats
    assert (inference.success.count, inference.success.ns) == (2, 13000)
    assert (inference.queue.count, inference.queue.ns) == (2, 0)
    assert (inference.fail.count, st.failures["BACKEND"]) == (1, 1)
    assert [b.batch_size for b in s.batch_stats] == [3]
