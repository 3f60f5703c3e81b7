"""A generative instance's metrics are written at most every PUBLISH_S while it runs, at
once when forced (a request ended, the engine idles), and no latency is lost or counted
twice in between (a fake clock)."""

from __future__ import annotations

from typing import Any

from shoal.workers import pb_metrics
from shoal.workers.generative.engine import StepTimes
from shoal.workers.generative.metrics import PUBLISH_S, EngineMetrics


def test_metrics_are_written_at_most_every_publish_interval_unless_forced() -> None:
    metrics = EngineMetrics("m", "1", "m_0")
    reads: list[float] = []
    tokens = 0

    def stats() -> dict[str, int]:
        reads.append(now)
        return {"generated_tokens": tokens, "running": 1}

    def step(at: float, force: bool = False) -> None:
        nonlocal now, tokens
        now, tokens = at, tokens + 1
        metrics.update(stats, StepTimes([], [0.002]), now, force)

    now = 0.0
    step(0.0)  # (the first one writes)
    step(PUBLISH_S / 2)
    step(PUBLISH_S * 0.9)
    assert reads == [0.0]
    step(PUBLISH_S * 1.1)
    assert reads == [0.0, PUBLISH_S * 1.1]
    step(PUBLISH_S * 1.2, force=True)
    assert len(reads) == 3
    assert _sample("shoal_llm_generated_tokens_total").value == tokens == 5
    assert sum(_sample("shoal_llm_inter_token_latency_seconds").counts) == 5  # each once


def _sample(family: str) -> Any:
    (found,) = [
        sample
        for f in pb_metrics.registry.snapshot().families
        if f.name == family
        for sample in f.metrics
        if ("model", "m") in sample.labels
    ]
    return found
