"""How long each hop of a request's way between the processes took, as a Prometheus
histogram (``shoal_hop_duration_us`` on /metrics): the cost of the process design seen in
production. Fed by the requests whose way is measured (traced ones, or all under
SHOAL_HOP_TIMING=1: shoal/dataplane/broker_client.py); pure."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Final

FAMILY: Final = "shoal_hop_duration_us"
HELP: Final = (
    "Time between a request's message leaving one process and its handling by the next "
    "(frontend_to_broker, broker_to_worker, worker_to_frontend) or inside one (in_broker, "
    "in_worker), in microseconds, of the requests whose way is measured (traced ones)"
)
#: upper bounds, µs: a hop on an idle host is tens of µs; a loaded one, milliseconds
BUCKETS_US: Final = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


class HopHistogram:
    """Per hop: observations per bucket (not cumulative), their sum and count."""

    def __init__(self, hops: tuple[str, ...]) -> None:
        self.hops = hops
        self._buckets = {h: [0] * (len(BUCKETS_US) + 1) for h in hops}
        self._sum_us = dict.fromkeys(hops, 0.0)
        self.observed = 0  # requests measured

    def observe(self, durations_ns: list[int]) -> None:
        """One request's hop durations, in ``hops`` order."""
        self.observed += 1
        for hop, ns in zip(self.hops, durations_ns, strict=False):
            us = ns / 1000
            self._buckets[hop][bisect.bisect_left(BUCKETS_US, us)] += 1
            self._sum_us[hop] += us

    def samples(self, frontend: str) -> Iterator[tuple[str, list[tuple[str, str]], float]]:
        """(name suffix, labels, value) of each sample, Prometheus's cumulative buckets."""
        for hop in self.hops:
            labels = [("frontend", frontend), ("hop", hop)]
            total = 0
            for bound, n in zip((*map(str, BUCKETS_US), "+Inf"), self._buckets[hop], strict=True):
                total += n
                yield "_bucket", [*labels, ("le", bound)], total
            yield "_sum", labels, self._sum_us[hop]
            yield "_count", labels, total
