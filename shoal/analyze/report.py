"""The report ``shoal analyze`` leaves in its folder: ``report.md`` (every point measured,
the Pareto front of throughput against p99, the summary of why the winner won),
``pareto.svg`` (the same front as a plot, drawn here: no plotting library),
``config.pbtxt`` (the recommended config, checked by shoal's own validator) and
``results.json`` (the raw numbers). Pure functions of the results, but ``write_report``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from html import escape
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from shoal.analyze.search import MARGIN, Goal, PointResult, Sample, pareto_front
from shoal.analyze.space import Point
from shoal.configs.model_config import fill_defaults, parse_config_json, parse_config_text
from shoal.configs.validation import validate


def config_pbtxt(config: dict[str, Any], model: str) -> str:
    """``config`` (Triton's JSON form) as config.pbtxt text, validated as shoal validates a
    config it loads (ConfigError when it is not valid)."""
    text = str(text_format.MessageToString(parse_config_json(json.dumps(config), model)))
    check = fill_defaults(parse_config_text(text, model), model)
    validate(check, model)
    return text


def _fmt(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def summary(results: list[PointResult], best: PointResult | None, goal: Goal) -> str:
    """Why the winner won, in a few sentences."""
    if best is None:
        return "No config met the goal: " + (
            f"every point's p99 exceeded {goal.budget_ms} ms." if goal.budget_ms else
            "every point failed."
        )  # fmt: skip
    base = results[0]
    measured = len(results)
    pruned = sum(r.pruned for r in results)
    failed = sum(bool(r.error) for r in results)
    what = (
        f"the most throughput within a p99 of {goal.budget_ms} ms"
        if goal.objective == "throughput" and goal.budget_ms
        else "the most throughput" if goal.objective == "throughput"
        else "the lowest worst-case p99 over the concurrencies"
    )  # fmt: skip
    sb, s0 = goal.score(best), goal.score(base)
    if goal.objective == "throughput":
        top = max((s for s in best.samples if goal.feasible(s)), key=lambda s: s.throughput)
        line = (f"**{best.point.label()}** gives {what}: {_fmt(top.throughput)} inferences/s "
                f"at concurrency {top.concurrency} (p99 {top.p99_ms:.2f} ms)")  # fmt: skip
    else:
        line = f"**{best.point.label()}** gives {what}: {-(sb or 0):.2f} ms"
    if best is base:
        line += "; it is the model's own config, which no neighbour beat"
    elif s0 is not None and sb is not None:
        gain = (sb - s0) / abs(s0) * 100 if s0 else 0.0
        line += f", {gain:+.0f} % against the model's own config ({base.point.label()})"
    return (
        f"{line}. {measured} points measured ({pruned} stopped early as clearly dominated, "
        f"{failed} failed); the search stopped where no neighbour of the winner (one knob "
        "one step away) did better by more than the noise margin, or at the time budget."
    )


#: How each knob reads in the explanation (Point's fields).
_KNOBS = {
    "kind": "instance kind",
    "instances": "instances",
    "max_batch_size": "max_batch_size",
    "queue_delay_us": "dynamic batching (queue delay, µs; -1: off)",
    "prefer_max": "preferring the largest batch",
    "threads": "backend threads (0: the backend's default)",
    "inter_threads": "ONNX Runtime inter-op threads (0: sequential execution)",
}


def _knob_changes(a: Point, b: Point) -> list[tuple[str, str]]:
    """The knobs on which ``b`` differs from ``a``: (knob, "a's -> b's")."""
    out = []
    for f in fields(Point):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y:
            out.append((_KNOBS[f.name], f"{x} -> {y}"))
    return out


def why(results: list[PointResult], best: PointResult, goal: Goal) -> list[str]:
    """Why ``best`` won, as list items: what it changes against the model's own config,
    and how each config one knob from it that was measured fared against it (the search
    stops at a config no such neighbour beats by more than the noise margin)."""
    base = results[0]
    unit = "inferences/s" if goal.objective == "throughput" else "ms of worst p99"
    sb = goal.score(best)
    assert sb is not None
    lines = []
    changes = _knob_changes(base.point, best.point)
    if changes:
        what = "; ".join(f"{k}: {v}" for k, v in changes)
        lines.append(f"- Against the model's own config it changes {what}.")
    else:
        lines.append("- It is the model's own config.")
    for r in results:
        diff = _knob_changes(best.point, r.point)
        if r is best or len(diff) != 1:
            continue
        knob, step = diff[0]
        score = goal.score(r)
        if score is None:
            reason = r.error or ("stopped early: clearly dominated" if r.pruned else
                                 "over the latency budget")  # fmt: skip
            lines.append(f"- {knob} {step}: not a candidate ({reason}).")
            continue
        gap = (score - sb) / abs(sb) * 100 if sb else 0.0
        value = score if goal.objective == "throughput" else -score
        noise = " (within the noise margin)" if abs(gap) <= MARGIN * 100 else ""
        lines.append(f"- {knob} {step}: {_fmt(value)} {unit}, {gap:+.0f} % against the "
                     f"winner{noise}.")  # fmt: skip
    return lines


def _table(results: list[PointResult], goal: Goal, concurrencies: list[int]) -> list[str]:
    head = "| config | " + " | ".join(f"c={c}: inf/s, p99 ms" for c in concurrencies) + " | note |"
    rows = [head, "|" + "---|" * (len(concurrencies) + 2)]
    for r in results:
        cells = []
        for c in concurrencies:
            s = r.at(c)
            cells.append(f"{_fmt(s.throughput)}, {s.p99_ms:.2f}" if s else "-")
        note = r.error or ("stopped early: dominated" if r.pruned else "")
        if goal.score(r) is None and not note:
            note = "over the latency budget"
        rows.append(f"| {r.point.label()} | " + " | ".join(cells) + f" | {note} |")
    return rows


def pareto_svg(results: list[PointResult]) -> str:
    """Throughput (x) against p99 (y) of every sample, the front joined by a line."""
    every = [s for r in results if not r.error for s in r.samples]
    front = pareto_front(results)
    w, h, pad = 640, 420, 60
    xmax = max((s.throughput for s in every), default=1.0) * 1.1 or 1.0
    ymax = max((s.p99_ms for s in every), default=1.0) * 1.1 or 1.0

    def xy(s: Sample) -> tuple[float, float]:
        return pad + s.throughput / xmax * (w - 2 * pad), h - pad - s.p99_ms / ymax * (h - 2 * pad)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">throughput (inferences/s)</text>',
        f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" '
        'text-anchor="middle">p99 latency (ms)</text>',
    ]
    for i in range(5):
        fx, fy = xmax * i / 4, ymax * i / 4
        x = pad + i / 4 * (w - 2 * pad)
        y = h - pad - i / 4 * (h - 2 * pad)
        out.append(f'<text x="{x:.0f}" y="{h - pad + 16}" text-anchor="middle">{fx:,.0f}</text>')
        out.append(f'<text x="{pad - 6}" y="{y + 4:.0f}" text-anchor="end">{fy:.2f}</text>')
    for s in every:
        x, y = xy(s)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#bbb"/>')
    pts = " ".join("{:.1f},{:.1f}".format(*xy(s)) for _, s in front)
    out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for r, s in front:
        x, y = xy(s)
        label = escape(f"{r.point.label()} c={s.concurrency}")
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#1f77b4"/>')
        out.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" font-size="10">{label}</text>')
    out.append("</svg>")
    return "\n".join(out)


def write_report(
    folder: Path,
    model: str,
    results: list[PointResult],
    best: PointResult | None,
    goal: Goal,
    concurrencies: list[int],
    recommended: str,
    load: str,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    front = pareto_front(results)
    lines = [
        f"# shoal analyze: {model}",
        "",
        f"Objective: {goal.objective}"
        + (f", p99 budget {goal.budget_ms} ms" if goal.budget_ms else "")
        + f"; concurrencies {concurrencies}; load by {load}.",
        "",
        "## Summary",
        "",
        summary(results, best, goal),
        "",
        *(["### Why it won", "", *why(results, best, goal), ""] if best is not None else []),
        "## Pareto front (throughput against p99)",
        "",
        "![Pareto front](pareto.svg)",
        "",
        "| config | concurrency | inferences/s | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.point.label()} | {s.concurrency} | {_fmt(s.throughput)} | "
            f"{s.p50_ms:.2f} | {s.p95_ms:.2f} | {s.p99_ms:.2f} |"
            for r, s in front
        ),
        "",
        "## Every point, in the order measured",
        "",
        *_table(results, goal, concurrencies),
        "",
        "## Recommended config.pbtxt",
        "",
        "```",
        recommended.rstrip() if recommended else "(none)",
        "```",
        "",
    ]
    (folder / "report.md").write_text("\n".join(lines))
    (folder / "pareto.svg").write_text(pareto_svg(results))
    if recommended:
        (folder / "config.pbtxt").write_text(recommended)
    raw = [{**asdict(r), "point": asdict(r.point), "label": r.point.label()} for r in results]
    (folder / "results.json").write_text(json.dumps(raw, indent=1))
