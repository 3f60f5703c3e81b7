"""``shoal analyze``: find the config of one model that serves best on this host.

It starts a shoal server of its own (explicit model control, free loopback ports), then
searches the model's config space (space.py) with Model Analyzer's quick search
(search.py), reloading the model in place for each point. Each point is measured at every
concurrency asked, lowest first, by perf_analyzer or the built-in generator (load.py); one
clearly dominated after a concurrency is not measured at the next. Progress goes to
stderr (progress.py), the report to ``--output`` (report.py); ``--write`` puts the
recommended config.pbtxt beside the model (the old one kept as config.pbtxt.orig). Where
the host shows GPUs (``--gpu`` picks them), KIND_GPU instances are searched too.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from shoal.analyze.load import BuiltinLoad, LoadGenerator, PerfAnalyzerLoad, perf_analyzer_binary
from shoal.analyze.progress import Progress
from shoal.analyze.report import config_pbtxt, write_report
from shoal.analyze.search import Goal, PointResult, clearly_dominated, quick_search
from shoal.analyze.server import AnalysisServer
from shoal.analyze.space import Point, apply, gpu_choice, space_for, start_point
from shoal.configs import devices


def _progress(msg: str) -> None:
    print(f"[analyze] {msg}", file=sys.stderr, flush=True)


def _load_generator(args: argparse.Namespace, srv: AnalysisServer, config: dict) -> LoadGenerator:  # type: ignore[type-arg]
    binary = perf_analyzer_binary()
    if args.load == "perf_analyzer" and binary is None:
        raise RuntimeError("--load=perf_analyzer: no $PERF_ANALYZER and none on the PATH")
    if args.load != "builtin" and binary is not None:
        return PerfAnalyzerLoad(binary, srv.grpc_url, args.model)
    return BuiltinLoad(srv.grpc_url, args.model, config)


def measure_point(
    reload: Callable[[dict], None],  # type: ignore[type-arg]
    base: dict,  # type: ignore[type-arg]
    load: LoadGenerator,
    concurrencies: list[int],
    window_s: float,
    tell: Callable[[str], None] = _progress,
    gpus: tuple[int, ...] = (),
) -> Callable[[Point, PointResult | None], PointResult]:
    """The search's ``measure``: ``reload`` the model with the point's config (the server's
    load with a config override; KIND_GPU instances on ``gpus``), then measure it at each
    concurrency, lowest first."""

    def measure(p: Point, best: PointResult | None) -> PointResult:
        r = PointResult(p)
        try:
            reload(apply(base, p, gpus))
            for c in concurrencies:
                r.samples.append(s := load.run(c, window_s))
                tell(f"  {p.label()}: c={c} {s.throughput:,.0f} inf/s, p99 {s.p99_ms:.2f} ms")
                if c != concurrencies[-1] and clearly_dominated(r.samples, best):
                    r.pruned = True
                    tell(f"  {p.label()}: clearly dominated, stopped early")
                    break
        except Exception as exc:  # a point the host cannot run: noted, the search goes on
            r.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            tell(f"  {p.label()}: failed: {r.error}")
        return r

    return measure


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 with a recommendation, 1 when no config met the goal, 2 when the
    analysis could not run (bad flags; the server or the model did not start: its log's
    tail is printed)."""
    try:
        return _analyse(args)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _analyse(args: argparse.Namespace) -> int:
    concurrencies = sorted({int(c) for c in str(args.concurrency).split(",") if c.strip()})
    if not concurrencies or concurrencies[0] < 1:
        raise ValueError(f"--concurrency: positive levels, as in 1,8,32; got {args.concurrency}")
    goal = Goal(args.objective, args.latency_budget_ms)
    out = args.output or Path(f"analyze-{args.model}")
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_repository / args.model
    gpus, note = gpu_choice(args.gpu, devices.gpu_count())
    show = Progress(args.max_points, args.budget_secs)
    try:
        return _search(args, concurrencies, goal, out, model_dir, gpus, note, show)
    finally:
        show.close()


def _search(
    args: argparse.Namespace,
    concurrencies: list[int],
    goal: Goal,
    out: Path,
    model_dir: Path,
    gpus: tuple[int, ...],
    note: str,
    show: Progress,
) -> int:
    if note:
        show.note(note)
    show.note(f"starting a server for '{args.model}' (log: {out / 'server.log'})")
    with AnalysisServer(
        args.model_repository, args.model, out / "server.log", args.server_arg
    ) as srv:
        base = srv.config()
        load = _load_generator(args, srv, base)
        space, start = space_for(base, gpus=gpus), start_point(base)
        if gpus and not space.gpus:
            show.note(f"backend '{base.get('backend', '')}' runs on the CPU here: KIND_CPU only")
        elif space.gpus:
            show.note(f"KIND_GPU instances searched too, on GPU(s) {list(space.gpus)}")
        show.note(f"load by {load.name}; starting from the model's config: {start.label()}")
        measure = measure_point(
            srv.load, base, load, concurrencies, args.window_secs, show.note, space.gpus
        )
        counted = [0]
        started = time.monotonic()  # the budget is the search's: the server is up

        def keep_going() -> bool:
            return time.monotonic() - started < args.budget_secs and counted[0] < args.max_points

        seen: set[Point] = set()

        def counting(p: Point, best: PointResult | None) -> PointResult:
            counted[0] += 1
            again = " (again, to confirm a win)" if p in seen else ""
            seen.add(p)
            spent = time.monotonic() - started
            show.note(f"point {counted[0]} ({spent:.0f} s of {args.budget_secs:.0f} s): "
                      f"{p.label()}{again}")  # fmt: skip
            show.point(counted[0], spent, p.label())
            return measure(p, best)

        results, best = quick_search(space, start, goal, counting, keep_going)
        recommended = config_pbtxt(apply(base, best.point, space.gpus), args.model) if best else ""
    write_report(out, args.model, results, best, goal, concurrencies, recommended, load.name)
    show.note(f"report: {out / 'report.md'}")
    if best is None:
        return 1
    show.note(f"recommended: {best.point.label()}")
    if args.write:
        target = model_dir / "config.pbtxt"
        if target.exists():
            target.replace(model_dir / "config.pbtxt.orig")
        target.write_text(recommended)
        show.note(f"written: {target}")
    return 0
