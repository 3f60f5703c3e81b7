"""The analyzer's pure parts: the config space, scoring, the quick search, the Pareto front
and the report (shoal/analyze/space.py, search.py, report.py), with made-up measurements."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from shoal.analyze.main import measure_point
from shoal.analyze.report import config_pbtxt, pareto_svg, summary
from shoal.analyze.search import (
    Goal,
    PointResult,
    Sample,
    clearly_dominated,
    pareto_front,
    quick_search,
)
from shoal.analyze.space import Point, apply, space_for, start_point
from shoal.configs.schema import ConfigError

CONFIG: dict[str, Any] = {
    "name": "m",
    "platform": "onnxruntime_onnx",
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "instance_group": [{"name": "m_0", "kind": "KIND_CPU", "count": 1}],
}


def sample(c: int, tput: float, p99: float) -> Sample:
    return Sample(c, tput, p99 / 2, p99 * 0.9, p99)


def test_the_space_and_the_start_follow_the_model() -> None:
    space = space_for(CONFIG, cpus=4)
    assert space.instances == (1, 2, 4)
    assert space.max_batch_size == (1, 2, 4, 8)
    assert space.threads == (0, 1, 2, 4)
    start = start_point(CONFIG)
    assert start == Point(1, 8, -1, False, 0)
    assert set(space.neighbours(start)) == {
        Point(2, 8),
        Point(1, 4),
        Point(1, 8, 0),
        Point(1, 8, -1, False, 1),
        Point(1, 8, -1, False, 0, 1),  # ONNX Runtime's parallel mode, one inter-op thread
    }  # prefer_max needs the dynamic batcher: not a neighbour without it
    no_batch = space_for({**CONFIG, "max_batch_size": 0, "backend": "python"}, cpus=1)
    assert no_batch.neighbours(start_point({**CONFIG, "max_batch_size": 0})) == []


def test_a_point_becomes_a_config_the_validator_accepts() -> None:
    p = Point(instances=2, max_batch_size=4, queue_delay_us=100, prefer_max=True, threads=2)
    cfg = apply(CONFIG, p)
    assert CONFIG["instance_group"][0]["count"] == 1  # not changed
    assert cfg["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
    assert cfg["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100,
        "preferred_batch_size": [4],
    }
    assert cfg["parameters"] == {"intra_op_thread_count": {"string_value": "2"}}
    assert start_point(cfg) == p
    text = config_pbtxt(cfg, "m")
    assert "preferred_batch_size: 4" in text and "count: 2" in text
    with pytest.raises(ConfigError):  # a preferred size over max_batch_size
        config_pbtxt({**cfg, "dynamic_batching": {"preferred_batch_size": [16]}}, "m")


def test_scores_follow_the_objective_and_the_budget() -> None:
    r = PointResult(Point(), [sample(1, 100, 2.0), sample(8, 400, 9.0)])
    assert Goal("throughput").score(r) == 400
    assert Goal("throughput", budget_ms=5.0).score(r) == 100
    assert Goal("throughput", budget_ms=1.0).score(r) is None
    assert Goal("latency").score(r) == -9.0
    assert Goal("latency", budget_ms=5.0).score(r) is None
    assert Goal().score(PointResult(Point(), r.samples, pruned=True)) is None
    worse = PointResult(Point(2), [sample(1, 100, 2.0), sample(8, 410, 9.0)])
    assert not Goal().beats(worse, r)  # within the noise margin


def test_a_point_far_behind_on_both_axes_is_clearly_dominated() -> None:
    best = PointResult(Point(), [sample(1, 100, 2.0), sample(8, 400, 9.0)])
    assert clearly_dominated([sample(1, 50, 3.0)], best)
    assert not clearly_dominated([sample(1, 50, 2.2)], best)  # p99 not much worse
    assert not clearly_dominated([sample(1, 90, 9.0)], best)  # throughput not much less
    assert not clearly_dominated([sample(1, 10, 9.0)], None)


def test_the_quick_search_climbs_to_the_best_without_the_whole_grid() -> None:
    """Throughput grows with instances up to 4 and with batch size; the climb finds the
    peak measuring a fraction of the 3*4*5*2*4 grid."""
    space = space_for(CONFIG, cpus=8)
    seen: list[Point] = []

    def measure(p: Point, best: PointResult | None) -> PointResult:
        seen.append(p)
        tput = 100.0 * min(p.instances, 4) * (1 + p.max_batch_size / 8) - 10 * p.threads
        return PointResult(p, [sample(1, tput, 1000 / tput)])

    results, best = quick_search(space, start_point(CONFIG), Goal(), measure, lambda: True)
    assert best is not None and best.point.instances == 4 and best.point.max_batch_size == 8
    assert best.point.threads == 0
    assert len(set(seen)) == len(results) < 30
    assert len(seen) == len(results) + 2 * 2  # two moves, each confirmed by two measurements
    stops = iter([True, True, False])
    _, cut = quick_search(space, start_point(CONFIG), Goal(), measure, lambda: next(stops))
    assert cut is not None and cut.point.instances == 2  # the budget ran out there


def test_a_lucky_window_does_not_move_the_search() -> None:
    """Two instances measure well once (a quiet moment), then as they are: worse."""
    space = space_for(CONFIG, cpus=2)
    turns: dict[Point, int] = {}

    def measure(p: Point, best: PointResult | None) -> PointResult:
        turns[p] = turns.get(p, 0) + 1
        tput = 500.0 if p.instances == 1 else (900.0 if turns[p] == 1 else 300.0)
        return PointResult(p, [sample(4, tput, 4000 / tput)])

    results, best = quick_search(space, start_point(CONFIG), Goal(), measure, lambda: True)
    assert best is not None and best.point == start_point(CONFIG)
    two = next(r for r in results if r.point.instances == 2)
    assert two.samples[0].throughput == 600.0  # the mean of its two windows


def test_the_pareto_front_and_its_plot() -> None:
    a = PointResult(Point(1), [sample(1, 100, 1.0), sample(8, 300, 5.0)])
    b = PointResult(Point(2), [sample(1, 150, 2.0), sample(8, 250, 6.0)])
    failed = PointResult(Point(4), [sample(1, 999, 0.1)], error="boom")
    front = pareto_front([a, b, failed])
    assert [(r.point.instances, s.concurrency) for r, s in front] == [(1, 1), (2, 1), (1, 8)]
    svg = ET.fromstring(pareto_svg([a, b]))
    assert len(svg.findall("{http://www.w3.org/2000/svg}polyline")) == 1
    assert "exceeded 0.5 ms" in summary([a, b], None, Goal(budget_ms=0.5))
    text = summary([b, a], a, Goal())
    assert "300.0 inferences/s at concurrency 8" in text and "+20 %" in text


def test_a_point_is_reloaded_then_measured_lowest_concurrency_first_and_cut_short() -> None:
    """``measure_point`` with the reload and the load generator handed in: a point far
    behind the best at concurrency 1 is not measured at 8; one that fails to load is
    noted, and the search goes on."""
    reloaded: list[dict[str, Any]] = []
    asked: list[int] = []

    class Load:
        name = "made-up"

        def run(self, concurrency: int, window_s: float) -> Sample:
            asked.append(concurrency)
            return sample(concurrency, 10.0 * concurrency, 50.0)

    def reload(config: dict[str, Any]) -> None:
        if config["instance_group"][0]["count"] == 4:
            raise RuntimeError("no room for 4 instances\nmore")
        reloaded.append(config)

    measure = measure_point(reload, CONFIG, Load(), [1, 8], 0.1, tell=lambda _: None)
    best = PointResult(Point(), [sample(1, 100, 2.0), sample(8, 400, 9.0)])
    r = measure(Point(2, 8), best)
    assert r.pruned and asked == [1] and [s.concurrency for s in r.samples] == [1]
    assert reloaded[-1]["instance_group"][0]["count"] == 2
    full = measure(Point(2, 8), None)
    assert not full.pruned and asked == [1, 1, 8]
    failed = measure(Point(4, 8), best)
    assert failed.error == "RuntimeError: no room for 4 instances" and not failed.samples
