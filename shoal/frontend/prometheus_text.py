"""Prometheus' text format 0.0.4, as Triton's Prometheus library (prometheus-cpp) writes it:
the lines of ``/metrics`` (shoal/frontend/metrics.py), the Python models' own families
among them (shoal/ipc/custom_metrics.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from shoal.ipc.custom_metrics import FamilySnapshot


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(v: float) -> str:
    """Integers as integers (Triton's counters and µs figures), NaN as Prometheus spells it."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


class Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, help_: str, kind: str) -> None:
        escaped = help_.replace("\\", "\\\\").replace("\n", "\\n")
        self.lines.append(f"# HELP {name} {escaped}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(
        self,
        name: str,
        labels: Iterable[tuple[str, str]],
        value: float,
        last: tuple[str, str] | None = None,
    ) -> None:
        """One sample line; ``last``: a label written after the others (a bucket's ``le``)."""
        # (in label-name order, as Triton's Prometheus library writes them: clients that
        # match a sample's line, Triton's own QA tests among them, expect that order)
        pairs = [*sorted(labels), *([last] if last else [])]
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
        self.lines.append(
            f"{name}{{{body}}} {number(value)}" if body else f"{name} {number(value)}"
        )

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


def custom_families(t: Text, families: list[FamilySnapshot]) -> None:
    """The Python models' families (merged): histograms as ``_count``, ``_sum`` and
    cumulative ``_bucket`` lines, ``le`` last, as prometheus-cpp writes them."""
    for fam in families:
        t.family(fam.name, fam.description, fam.kind)
        for s in fam.metrics:
            if fam.kind != "histogram":
                t.sample(fam.name, s.labels, s.value)
                continue
            t.sample(f"{fam.name}_count", s.labels, sum(s.counts))
            t.sample(f"{fam.name}_sum", s.labels, s.total)
            running = 0
            for bound, count in zip([*s.buckets, math.inf], s.counts, strict=True):
                running += count
                t.sample(f"{fam.name}_bucket", s.labels, running, ("le", number(bound)))
