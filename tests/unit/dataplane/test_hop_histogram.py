"""The hop histogram on /metrics (shoal/dataplane/hop_histogram.py)."""

from __future__ import annotations

from shoal.dataplane.hop_histogram import BUCKETS_US, HopHistogram


def test_buckets_are_cumulative_and_count_each_request_once() -> None:
    h = HopHistogram(("a", "b"))
    h.observe([5_000, 2_000_000])  # 5 µs, 2 ms
    h.observe([30_000, 2_000_000_000])  # 30 µs, 2 s (past the last bound)
    samples = {(suffix, tuple(labels)): v for suffix, labels, v in h.samples("0")}
    a = (("frontend", "0"), ("hop", "a"))
    assert samples[("_bucket", (*a, ("le", "10")))] == 1
    assert samples[("_bucket", (*a, ("le", "50")))] == 2
    assert samples[("_count", a)] == 2 and samples[("_sum", a)] == 35.0
    b = (("frontend", "0"), ("hop", "b"))
    assert samples[("_bucket", (*b, ("le", str(BUCKETS_US[-1]))))] == 1
    assert samples[("_bucket", (*b, ("le", "+Inf")))] == 2
    assert h.observed == 2
