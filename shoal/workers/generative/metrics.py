"""A generative instance's metrics on /metrics, through the worker's custom-metrics
registry (shoal/workers/pb_metrics.py), labelled by model, version and instance:
KV-cache blocks used and free, running and waiting sequences (gauges), preemptions,
generated tokens (tokens per second is its rate), prompt tokens and those of them found
in shared or cached blocks (counters), time to first token and inter-token latency
(histograms, seconds).

Each write is a snapshot of every family (a file the frontends read), so they are not
written after every step: ``update`` keeps a step's latencies and writes at most every
``PUBLISH_S`` while the engine runs, and at once when asked (a request got its first
token or ended, the engine is idle): a request a client sees start or end is on /metrics
as such by the time the client sees it.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.workers import pb_metrics
from shoal.workers.generative.engine import StepTimes

_GAUGES = {
    "blocks_used": ("shoal_llm_kv_blocks_used", "KV-cache blocks held by sequences"),
    "blocks_free": ("shoal_llm_kv_blocks_free", "KV-cache blocks free"),
    "running": ("shoal_llm_running_sequences", "Sequences being generated"),
    "waiting": ("shoal_llm_waiting_sequences", "Sequences waiting for KV-cache blocks"),
}
_COUNTERS = {
    "preemptions": ("shoal_llm_preemptions_total", "Sequences preempted (to be recomputed)"),
    "generated_tokens": ("shoal_llm_generated_tokens_total", "Tokens generated"),
    "prompt_tokens": ("shoal_llm_prompt_tokens_total", "Prompt tokens of the requests admitted"),
    "prefix_hit_tokens": (
        "shoal_llm_prefix_cache_hit_tokens_total",
        "Prompt tokens whose KV came from shared or cached blocks",
    ),
}
_TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
_ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
PUBLISH_S = 0.05


class EngineMetrics:
    def __init__(self, model: str, version: str, instance: str) -> None:
        labels = {"model": model, "version": version, "instance": instance}
        kinds = pb_metrics.MetricKind
        self._families: list[pb_metrics.MetricFamily] = []
        self._metrics: dict[str, pb_metrics.Metric] = {}
        for key, (name, text) in _GAUGES.items():
            self._metrics[key] = self._family(name, text, kinds.GAUGE).Metric(labels)
        for key, (name, text) in _COUNTERS.items():
            self._metrics[key] = self._family(name, text, kinds.COUNTER).Metric(labels)
        hist = kinds.HISTOGRAM
        ttft = self._family("shoal_llm_time_to_first_token_seconds", "Time to first token", hist)
        itl = self._family("shoal_llm_inter_token_latency_seconds", "Time between tokens", hist)
        self._ttft = ttft.Metric(labels, buckets=_TTFT_BUCKETS)
        self._itl = itl.Metric(labels, buckets=_ITL_BUCKETS)
        self._last: dict[str, int] = {}
        self._first: list[float] = []  # latencies not written yet
        self._inter: list[float] = []
        self._published = float("-inf")

    def _family(self, name: str, text: str, kind: pb_metrics.MetricKind) -> pb_metrics.MetricFamily:
        family = pb_metrics.MetricFamily(name, text, kind)
        self._families.append(family)
        return family

    def update(
        self,
        stats: Callable[[], dict[str, int]],
        times: StepTimes,
        now: float,
        force: bool = False,
    ) -> None:
        """After a step: keep its latencies (``times``); write them with the engine's
        ``stats()`` if ``force`` or ``PUBLISH_S`` passed since the last write (``now``:
        monotonic seconds). Not thread-safe: the engine's thread calls it."""
        self._first += times.first_token
        self._inter += times.inter_token
        if not force and now - self._published < PUBLISH_S:
            return
        self._published = now
        current = stats()
        changed = {k: v for k, v in current.items() if self._last.get(k) != v}
        if not changed and not self._first and not self._inter:
            return
        with pb_metrics.batched():
            for key, value in changed.items():
                if key in _GAUGES:
                    self._metrics[key].set(value)
                else:
                    self._metrics[key].increment(value - self._last.get(key, 0))
            for seconds in self._first:
                self._ttft.observe(seconds)
            for seconds in self._inter:
                self._itl.observe(seconds)
        self._first, self._inter = [], []
        self._last.update(changed)
