"""What ``shoal analyze`` measured, how it ranks it, and the quick search over the space.

Pure: the search is handed ``measure`` (which runs a point: reload, load generator) and
``keep_going`` (the time budget); it owns no server, socket or clock. The search is a
first-improvement hill climb from the model's own config, one rung along one knob at a
time (space.py), as Model Analyzer's quick search: it stops where no neighbour beats the
best by more than ``MARGIN``, or when the budget is spent. Unlike Model Analyzer, a
neighbour that wins is not moved to on one measurement: the best and the neighbour are
measured again, in turn, and the neighbour must win that round too and on the mean of
both (a busy host makes single windows lie). A point whose first
concurrencies are already clearly dominated by the best (``clearly_dominated``) is not
measured at the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from shoal.analyze.space import Point, Space

Objective = Literal["throughput", "latency"]
#: A neighbour must beat the best by this share to be moved to (run-to-run noise).
MARGIN = 0.03
#: Clearly dominated: under this share of the best's throughput at the same concurrency...
DOMINATED_THROUGHPUT = 0.7
#: ...and over this multiple of its p99.
DOMINATED_P99 = 1.3


@dataclass(frozen=True)
class Sample:
    """One point at one concurrency: inferences per second and latency percentiles (ms)."""

    concurrency: int
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass
class PointResult:
    point: Point
    samples: list[Sample] = field(default_factory=list)
    pruned: bool = False  # stopped early: clearly dominated
    error: str = ""  # its load or its measurement failed

    def at(self, concurrency: int) -> Sample | None:
        return next((s for s in self.samples if s.concurrency == concurrency), None)


@dataclass(frozen=True)
class Goal:
    objective: Objective = "throughput"
    budget_ms: float | None = None  # the p99 a sample may not exceed

    def feasible(self, s: Sample) -> bool:
        return self.budget_ms is None or s.p99_ms <= self.budget_ms

    def score(self, r: PointResult) -> float | None:
        """Higher is better; None: not a candidate (failed, pruned, or over the budget
        everywhere). Throughput: the most inferences/s of a sample within the budget.
        Latency: minus the worst p99 over the concurrencies (all must be within it)."""
        if r.error or r.pruned or not r.samples:
            return None
        ok = [s for s in r.samples if self.feasible(s)]
        if self.objective == "throughput":
            return max((s.throughput for s in ok), default=None)
        if len(ok) < len(r.samples):
            return None
        return -max(s.p99_ms for s in r.samples)

    def beats(self, a: PointResult, b: PointResult | None) -> bool:
        """``a`` is better than ``b`` by more than the noise margin."""
        sa = self.score(a)
        if sa is None:
            return False
        sb = None if b is None else self.score(b)
        return sb is None or sa > sb + abs(sb) * MARGIN


def clearly_dominated(partial: list[Sample], best: PointResult | None) -> bool:
    """Whether a point measured so far at ``partial`` is far behind ``best`` at one of the
    same concurrencies: much less throughput and a much longer p99 at once."""
    if best is None:
        return False
    for s in partial:
        b = best.at(s.concurrency)
        if (
            b is not None
            and s.throughput < b.throughput * DOMINATED_THROUGHPUT
            and s.p99_ms > b.p99_ms * DOMINATED_P99
        ):
            return True
    return False


def pareto_front(results: list[PointResult]) -> list[tuple[PointResult, Sample]]:
    """The samples no other sample beats on both throughput and p99, by throughput."""
    every = [(r, s) for r in results if not r.error for s in r.samples]
    front = [
        (r, s)
        for r, s in every
        if not any(
            o.throughput >= s.throughput
            and o.p99_ms <= s.p99_ms
            and (o.throughput > s.throughput or o.p99_ms < s.p99_ms)
            for _, o in every
        )
    ]
    return sorted(front, key=lambda rs: rs[1].throughput)


def merged(a: PointResult, b: PointResult) -> PointResult:
    """Two measurements of one point as one: the mean of each figure, at each concurrency
    both have."""
    samples = []
    for x in a.samples:
        y = b.at(x.concurrency)
        if y is not None:
            samples.append(
                Sample(
                    x.concurrency,
                    (x.throughput + y.throughput) / 2,
                    (x.p50_ms + y.p50_ms) / 2,
                    (x.p95_ms + y.p95_ms) / 2,
                    (x.p99_ms + y.p99_ms) / 2,
                )
            )
    return PointResult(a.point, samples, a.pruned or b.pruned, a.error or b.error)


def quick_search(
    space: Space,
    start: Point,
    goal: Goal,
    measure: Callable[[Point, PointResult | None], PointResult],
    keep_going: Callable[[], bool],
) -> tuple[list[PointResult], PointResult | None]:
    """Every point measured (in order) and the winner (None: nothing was a candidate).
    ``measure(point, best)`` runs one point, given the best so far to stop early against."""
    results: dict[Point, PointResult] = {}
    best: PointResult | None = None
    here = start
    results[here] = first = measure(here, None)
    if goal.score(first) is not None:
        best = first
    while keep_going():
        moved = False
        for q in space.neighbours(here):
            if q in results:
                continue
            if not keep_going():
                break
            results[q] = r = measure(q, best)
            if not goal.beats(r, best):
                continue
            if best is not None:  # a win is confirmed: both again, in turn (noise)
                incumbent, challenger = measure(best.point, None), measure(q, None)
                results[best.point] = best = merged(best, incumbent)
                results[q] = r = merged(r, challenger)
                if not (goal.beats(challenger, incumbent) and goal.beats(r, best)):
                    continue
            best, here, moved = r, q, True
            break
        if not moved:
            break
    return list(results.values()), best
