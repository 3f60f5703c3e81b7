"""A generative instance's metrics on /metrics, through the worker's custom-metrics
registry (shoal/workers/pb_metrics.py), labelled by model, version and instance:
KV-cache blocks used and free, running and waiting sequences (gauges), preemptions,
generated tokens (tokens per second is its rate), prompt tokens and those of them found
in shared or cached blocks (counters), time to first token and inter-token latency
(histograms, seconds)."""

from __future__ import annotations

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

    def _family(self, name: str, text: str, kind: pb_metrics.MetricKind) -> pb_metrics.MetricFamily:
        family = pb_metrics.MetricFamily(name, text, kind)
        self._families.append(family)
        return family

    def update(self, stats: dict[str, int], times: StepTimes) -> None:
        """The engine's numbers after a step (one snapshot write, if any changed)."""
        changed = {k: v for k, v in stats.items() if self._last.get(k) != v}
        if not changed and not times.first_token and not times.inter_token:
            return
        with pb_metrics.batched():
            for key, value in changed.items():
                if key in _GAUGES:
                    self._metrics[key].set(value)
                else:
                    self._metrics[key].increment(value - self._last.get(key, 0))
            for seconds in times.first_token:
                self._ttft.observe(seconds)
            for seconds in times.inter_token:
                self._itl.observe(seconds)
        self._last.update(changed)
