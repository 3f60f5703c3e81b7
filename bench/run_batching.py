"""Benchmark of the broker's scheduler: dynamic batching and instance groups, in one run.

For each model, shoal servers are started side by side on free loopback ports, each on a
temporary repository holding that model only (model file linked, config edited; one model
per server, since shoal divides the cores among all instances of a repository):

* ``batching``: ``mlp_large`` as shipped (dynamic batching, 2 ms delay, 1 instance), or ``mlp``
  with ``dynamic_batching {}`` added;
* ``no-batching``: the config without its ``dynamic_batching`` block (``mlp`` as shipped);
* ``2-instances`` (``mlp_large`` only): dynamic batching and ``instance_group { count: 2 }``;
* ``2-instances-no-batching``: ``count: 2`` without ``dynamic_batching``. Without a batcher,
  requests run in parallel only across instances, and one instance idles while the broker
  hands it its next request; with a batcher, one instance with all the cores may serve more.

For each model and concurrency the configurations (and protocols) are driven one after the
other with perf_analyzer (batch-1 requests), so drift hits them alike; the servers not being
driven sit idle. Around each perf_analyzer run the server's ``/v2/models/<m>/stats`` is read,
and the difference gives the batches it formed (average size, most common sizes, mean queue
time). Then an in-process ONNX Runtime loop runs the same ``model.onnx`` at the batch sizes
formed and at 1, 8, 32, 64 with 1 and 2 intra-op threads: the ceiling each point is compared
with at its own batch size. ``--with-triton-peer`` adds the real Triton on ``mlp_large`` with
the shipped config. A record, not a test: nothing here asserts a speed.

    python bench/run_batching.py [--protocols grpc,http] [--concurrency 1,8,32,64]
                                 [--models mlp_large,mlp] [--with-triton-peer]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import cpu
import ort_baseline
from common import (
    Point,
    batching_point,
    csv_ints,
    csv_list,
    fmt,
    git_commit,
    link_model,
    raise_interrupt,
    ratio,
    start_server,
    with_batching,
)
from perf_analyzer import Measurement, perf_analyzer_path, perf_analyzer_version
from servers import REPO_ROOT, ServerProcess, shoal_server, triton_peer_server

LARGE, SMALL = "mlp_large", "mlp"
#: The 70% target: shoal on mlp_large with batching at c=32 over in-process ORT at that batch.
TARGET = (LARGE, "batching", 32, 0.70)
CONFIGS = (
    "batching",
    "no-batching",
    "2-instances",
    "2-instances-no-batching",
    "beside-idle",
    "beside-idle-no-lending",
)
#: mlp_large beside an idle mlp (one instance each): the share of in-process ORT's best
#: (any batch, 1 or 2 threads) it should reach when it may borrow the idle one's core.
BESIDE_IDLE_TARGET = 0.6


# ---------------------------------------------------------------------------------------------
# Repositories


def _no_batching(text: str) -> str:
    return re.sub(r"dynamic_batching\s*\{[^}]*\}\s*", "", text)


def _instances(text: str, count: int) -> str:
    new, n = re.subn(r"count:\s*\d+", f"count: {count}", text)
    if n != 1:
        raise ValueError("expected one instance_group count in the config")
    return new


def _two_without_batching(text: str) -> str:
    return _instances(_no_batching(text), 2)


def build_repos(src: Path, tmp: Path, model: str) -> dict[str, Path]:
    """One temporary repository per configuration of ``model``, holding that model only.

    One model per server: shoal divides the machine's cores among every instance of its
    repository, so an idle neighbour model would take cores from the one being measured.
    """
    shipped = (src / model / "config.pbtxt").read_text()
    edits = {
        LARGE: {
            "batching": lambda t: t,
            "no-batching": _no_batching,
            "2-instances": lambda t: _instances(t, 2),
            "2-instances-no-batching": _two_without_batching,
            "peer": lambda t: t,  # Triton, with the shipped config
        },
        SMALL: {
            "batching": with_batching,
            "no-batching": _no_batching,
            "2-instances-no-batching": _two_without_batching,
        },
    }[model]
    repos: dict[str, Path] = {}
    for config, edit in edits.items():
        repo = tmp / model / config
        link_model(src, repo, model, edit(shipped))
        repos[config] = repo
    if model == LARGE:
        # The one exception to one model a server: the idle neighbour is the point.
        for config in ("beside-idle", "beside-idle-no-lending"):
            repo = tmp / model / config
            link_model(src, repo, LARGE, shipped)
            link_model(src, repo, SMALL, (src / SMALL / "config.pbtxt").read_text())
            repos[config] = repo
    return repos


# ---------------------------------------------------------------------------------------------
# Statistics


# ---------------------------------------------------------------------------------------------
# The run


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    ap.add_argument("--models", type=csv_list, default=f"{LARGE},{SMALL}")
    ap.add_argument("--protocols", type=csv_list, default="grpc", help="grpc, http")
    ap.add_argument("--concurrency", type=csv_ints, default="1,8,32,64")
    ap.add_argument("--measurement-interval", type=int, default=2000, help="ms per window")
    ap.add_argument("--max-trials", type=int, default=5, help="windows before giving up")
    ap.add_argument("--stability-percentage", type=int, default=20)
    ap.add_argument("--ort-seconds", type=float, default=1.5, help="per ORT pass")
    ap.add_argument("--ort-repeats", type=int, default=2, help="ORT passes; the best is kept")
    ap.add_argument("--with-triton-peer", action="store_true", help="+ Triton on mlp_large")
    ap.add_argument(
        "--configs", type=csv_list, default=",".join(CONFIGS), help="which of them to run"
    )
    ap.add_argument("--ready-timeout", type=float, default=180.0)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    bad = [p for p in args.protocols if p not in ("http", "grpc")]
    if bad:
        ap.error(f"unknown protocol(s) {bad}")
    if not set(args.models) <= {LARGE, SMALL}:
        ap.error(f"--models takes {LARGE} and/or {SMALL}")
    return args


def _ensure_large_model(repo: Path) -> None:
    if not (repo / LARGE / "1" / "model.onnx").exists():
        print(f"[bench] writing {repo / LARGE} (python -m tools.modelgen)", flush=True)
        sys.path.insert(0, str(REPO_ROOT))
        from tools import modelgen

        modelgen.write_shipped_repository(repo, (LARGE,), missing_only=True)


def _placement(srv: ServerProcess, model: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{srv.http_url}/v2/shoal/models/{model}") as r:
            doc = json.loads(r.read())
    except (OSError, ValueError):
        return "?"
    insts = [i for v in doc.get("versions", []) for i in v.get("instances", [])]
    return ", ".join(f"cores {i.get('cores') or 'any'}" for i in insts) or "?"


_CORES = len(os.sched_getaffinity(0))


def _cpu_bound(p: Point, ort: dict[tuple, Measurement]) -> tuple[float, float, float] | None:
    """(side µs of CPU per request, model µs of CPU per sample, the most samples/s the
    machine's cores could serve at those costs) for a point with CPU usage: what the
    in-process target leaves out. The model's cost is its cheapest in-process loop at
    the point's batch (threads x seconds per sample, the loop keeping its threads busy)."""
    if p.cores is None or not p.m.throughput:
        return None
    b = _round_batch(p.avg_batch)
    costs = [t / o.throughput for t in (1, 2) if (o := ort.get((p.m.model, b, t)))]
    if not costs:
        return None
    side = p.cores.side_cores / p.m.throughput
    return side * 1e6, min(costs) * 1e6, _CORES / (side + min(costs))


def _side_load(p: Point) -> float | None:
    """The cores a shoal ``batching`` point's model shared with the rest, to 0.1 core."""
    if p.m.server != "shoal" or p.config != "batching" or p.cores is None:
        return None
    return round(p.cores.side_cores, 1)


def _ort(
    repo: Path, results: list[Point], args: argparse.Namespace
) -> tuple[dict[tuple, Measurement], dict[tuple, Measurement]]:
    """In-process ORT at 1, 8, 32, 64 (up to max_batch_size) and every formed average; then,
    for each shoal ``batching`` point, ORT at its batch with its side load running beside
    (``cpu.CpuLoad``): keys ``(model, batch, threads)`` and ``(model, batch, threads, load)``.

    Each loop is timed ``--ort-repeats`` times, the passes interleaved, and the fastest pass
    kept: a ceiling, so a pass slowed by other work on the CPUs should not count.
    """
    out: dict[tuple, Measurement] = {}
    shared: dict[tuple, Measurement] = {}
    for model in args.models:
        text = (repo / model / "config.pbtxt").read_text()
        found = re.search(r"max_batch_size:\s*(\d+)", text)
        mbs = int(found[1]) if found else 64
        sizes = {b for b in (1, 8, 32, 64) if b <= mbs}
        sizes |= {_round_batch(p.avg_batch) for p in results if p.m.model == model}
        path = repo / model / "1" / "model.onnx"
        print(
            f"[bench] in-process ORT {model} at batch {sorted(sizes)}, 2 and 1 threads", flush=True
        )
        for _ in range(args.ort_repeats):
            for b in sorted(sizes):
                for t in (2, 1):
                    o = ort_baseline.measure(path, model, t, b, args.ort_seconds)
                    _keep_best(out, (model, b, t), o)
        loads = sorted(
            {(_round_batch(p.avg_batch), load) for p in results
             if p.m.model == model and (load := _side_load(p)) is not None}
        )  # fmt: skip
        if loads:
            print(f"[bench] in-process ORT {model} sharing the cores: (batch, cores) {loads}")
        for _ in range(args.ort_repeats):
            for b, load in loads:
                with cpu.CpuLoad(load):
                    for t in (2, 1):
                        o = ort_baseline.measure(path, model, t, b, args.ort_seconds)
                        _keep_best(shared, (model, b, t, load), o)
    return out, shared


def _keep_best(into: dict[tuple, Measurement], key: tuple, o: Measurement) -> None:
    prev = into.get(key)
    if prev is None or o.throughput > prev.throughput:
        into[key] = o


def _round_batch(avg: float | None) -> int:
    return max(1, round(avg)) if avg else 1


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    raw = args.out_dir / f"{stamp}-batching-raw"
    raw.mkdir()
    if LARGE in args.models:
        _ensure_large_model(args.repo)
    pa = perf_analyzer_path()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.monotonic()
    n_large = 5 if LARGE in args.models else 0
    n_small = 2 if SMALL in args.models else 0
    runs = (
        (n_large + n_small + (1 if args.with_triton_peer and n_large else 0))
        * len(args.concurrency)
        * len(args.protocols)
    )
    est = runs * (3.4 * args.measurement_interval / 1e3 + 1.5) + 60
    print(f"[bench] {runs} perf_analyzer runs, at least ~{est / 60:.1f} min", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-batching-"))
    points: list[Point] = []
    skipped: list[str] = []
    placement: dict[str, str] = {}
    ort: dict[tuple, Measurement] = {}
    shared: dict[tuple, Measurement] = {}
    started_servers: list[ServerProcess] = []
    try:
        for model in args.models:
            repos = build_repos(args.repo, tmp, model)
            servers: dict[str, tuple[ServerProcess, str]] = {}  # config -> (server, label)
            try:
                for config in CONFIGS:
                    if config not in repos or config not in args.configs:
                        continue
                    no_lending = ("--cpu-lending=false",) if config.endswith("no-lending") else ()
                    srv = shoal_server(
                        repos[config], raw / f"shoal-{model}-{config}.log", extra=no_lending
                    )
                    srv.name = f"shoal-{model}-{config}"
                    started_servers.append(srv)
                    if start_server(srv, args.ready_timeout, skipped):
                        servers[config] = (srv, "shoal")
                        placement[f"{model} {config}"] = _placement(srv, model)
                if args.with_triton_peer and "peer" in repos:
                    peer = triton_peer_server(repos["peer"], raw / "triton.log", tmpdir=tmp)
                    started_servers.append(peer)
                    if start_server(peer, args.ready_timeout, skipped):
                        servers["peer"] = (peer, "triton")
                for c in args.concurrency:
                    for config, (srv, label) in servers.items():
                        for protocol in args.protocols:
                            p = batching_point(
                                pa, srv, label, config, model, c, protocol, args, raw
                            )
                            if isinstance(p, str):
                                skipped.append(p)
                            else:
                                points.append(p)
            finally:
                for srv, _ in servers.values():
                    srv.stop()
    except KeyboardInterrupt:
        skipped.append("interrupted: the run stopped early; the rest was not measured")
    finally:
        for srv in started_servers:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    leftovers = sorted(
        str(f)
        for srv in started_servers
        if srv.proc is not None
        for f in Path("/dev/shm").glob(f"shoal-{srv.proc.pid}-*")
    )
    try:
        ort, shared = _ort(args.repo, points, args)
    except KeyboardInterrupt:
        skipped.append("interrupted during the ONNX Runtime baseline")

    import onnxruntime

    meta = {
        "timestamp": stamp,
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "load average at start": load_start,
        "load average at end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "commit": git_commit(),
        "perf_analyzer": f"{perf_analyzer_version(pa)} ({', '.join(args.protocols)}; batch 1; "
        f"{args.measurement_interval} ms windows, max {args.max_trials} trials, "
        f"stable within {args.stability_percentage}%)",
        "onnxruntime": onnxruntime.__version__,
        "placement": "; ".join(f"{k}: {v}" for k, v in placement.items()) or "—",
        "triton": "triton-peer (mlp_large, shipped config)"
        if any(x.name == "triton" for x in started_servers)
        else "not run",
        "wall time": f"{time.monotonic() - started:.0f} s",
        "left behind": ", ".join(leftovers) or "nothing in /dev/shm",
        "raw": str(raw.relative_to(REPO_ROOT) if raw.is_relative_to(REPO_ROOT) else raw),
    }
    report = render(points, ort, meta, skipped, shared)
    out = args.out_dir / f"{stamp}-batching.md"
    out.write_text(report)
    print(report)
    print(f"[bench] wrote {out}")
    return 0


# ---------------------------------------------------------------------------------------------
# The report


def _sizes(p: Point, top: int = 3) -> str:
    if not p.sizes:
        return "—"
    total = sum(n for _, n in p.sizes)
    head = ", ".join(f"{s}x{n}" for s, n in p.sizes[:top])
    return head + (f" (+{total - sum(n for _, n in p.sizes[:top])})" if len(p.sizes) > top else "")


def render(
    points: list[Point],
    ort: dict[tuple, Measurement],
    meta: dict[str, str],
    skipped: list[str] | None = None,
    shared: dict[tuple, Measurement] | None = None,
) -> str:
    shared = shared or {}
    order = {c: i for i, c in enumerate(CONFIGS)}
    points = sorted(
        points,
        key=lambda p: (p.m.model != LARGE, p.m.concurrency, p.m.server != "shoal",
                       order.get(p.config, 9), p.m.protocol),
    )  # fmt: skip
    ix = {(p.m.server, p.config, p.m.protocol, p.m.model, p.m.concurrency): p for p in points}

    def shoal(config: str, p: Point) -> Point | None:
        return ix.get(("shoal", config, p.m.protocol, p.m.model, p.m.concurrency))

    lines = [f"# Batching benchmark {meta['timestamp']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "timestamp"]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in skipped]

    lines += ["", "## Measurements (perf_analyzer, batch-1 requests)", ""]
    lines += [
        "`avg batch`: inference_count / execution_count added during the run "
        "(`/v2/models/<m>/stats`); `sizes`: most common batch sizes x executions; "
        "`queue µs`: mean time a request waited in the broker; `infer µs`: mean "
        "compute_infer per execution.",
        "",
        "| model | c | server | config | protocol | infer/s | p50 µs | p99 µs | avg batch "
        "| sizes | queue µs | infer µs | note |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for p in points:
        m = p.m
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.server} | {p.config} | {m.protocol} "
            f"| {m.throughput:,.0f} | {fmt(m.p50_us, ',.0f')} | {fmt(m.p99_us, ',.0f')} "
            f"| {fmt(p.avg_batch, '.1f')} | {_sizes(p)} | {fmt(p.queue_us, ',.0f')} "
            f"| {fmt(p.infer_us, ',.0f')} | {m.note} |"
        )

    lines += ["", "## In-process ONNX Runtime (one caller, `sess.run` at a fixed batch)", ""]
    lines += ["| model | batch | threads | samples/s | p50 µs per call | p99 µs |"]
    lines += ["|---|---:|---:|---:|---:|---:|"]
    for (model, b, t), o in sorted(ort.items(), key=lambda kv: (kv[0][0] != LARGE, kv[0][1:])):
        lines.append(
            f"| {model} | {b} | {t} | {o.throughput:,.0f} | {fmt(o.p50_us, ',.0f')} "
            f"| {fmt(o.p99_us, ',.0f')} |"
        )

    lines += ["", "## Server / in-process ORT at the same batch size (samples/s)", ""]
    lines += [
        "The ORT batch is the point's average batch rounded; `/best` divides by the faster "
        "of the 1- and 2-thread loops.",
        "",
        "| model | c | server | config | protocol | avg batch | infer/s | ORT-2t | ORT-1t "
        "| /ORT-2t | /ORT-1t | /best |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        b = _round_batch(p.avg_batch)
        o2, o1 = ort.get((p.m.model, b, 2)), ort.get((p.m.model, b, 1))
        best = max((o.throughput for o in (o1, o2) if o), default=None)
        lines.append(
            f"| {p.m.model} | {p.m.concurrency} | {p.m.server} | {p.config} | {p.m.protocol} "
            f"| {b} | {p.m.throughput:,.0f} | {fmt(o2 and o2.throughput, ',.0f')} "
            f"| {fmt(o1 and o1.throughput, ',.0f')} "
            f"| {fmt(ratio(p.m.throughput, o2 and o2.throughput), '.2f')} "
            f"| {fmt(ratio(p.m.throughput, o1 and o1.throughput), '.2f')} "
            f"| {fmt(ratio(p.m.throughput, best), '.2f')} |"
        )

    rows = []
    for p in points:
        load = _side_load(p)
        if load is None or p.cores is None:
            continue
        b = _round_batch(p.avg_batch)
        s2, s1 = shared.get((p.m.model, b, 2, load)), shared.get((p.m.model, b, 1, load))
        best_shared = max((o.throughput for o in (s1, s2) if o), default=None)
        best_idle = max(
            (o.throughput for t in (1, 2) if (o := ort.get((p.m.model, b, t)))), default=None
        )
        rows.append(
            f"| {p.m.model} | {p.m.concurrency} | {p.m.protocol} | {b} "
            f"| {p.m.throughput:,.0f} | {p.cores.model_cores:.2f} | {p.cores.side_cores:.2f} "
            f"| {fmt(s2 and s2.throughput, ',.0f')} | {fmt(s1 and s1.throughput, ',.0f')} "
            f"| {fmt(ratio(p.m.throughput, best_shared), '.2f')} "
            f"| {fmt(ratio(p.m.throughput, best_idle), '.2f')} |"
        )
    if rows:
        lines += ["", "## Sharing the cores: shoal / in-process ORT beside the same load", ""]
        lines += [
            "`model cores`: CPU time of shoal's model workers during the point; `side cores`: "
            "the rest of the machine's busy time (perf_analyzer, shoal's frontend and broker), "
            "both averaged over the perf_analyzer run. The `shared` ORT loops ran at the "
            "point's batch with `side cores` of spinning load beside them (`bench/cpu.py`, "
            "an emulation): the ceiling for a model that leaves the client and the protocol "
            "that much of the machine. `/idle` repeats `/best` from the table above.",
            "",
            "| model | c | protocol | avg batch | infer/s | model cores | side cores "
            "| ORT-2t shared | ORT-1t shared | /shared | /idle |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += rows

    def pair_table(title: str, num: str, den: str, models: tuple[str, ...]) -> None:
        rows = []
        for p in points:
            if p.m.server != "shoal" or p.config != den or p.m.model not in models:
                continue
            q = shoal(num, p)
            if q is None:
                continue
            rows.append(
                f"| {p.m.model} | {p.m.concurrency} | {p.m.protocol} "
                f"| {fmt(ratio(q.m.throughput, p.m.throughput), '.2f')} "
                f"| {fmt(ratio(q.m.p50_us, p.m.p50_us), '.2f')} "
                f"| {fmt(ratio(q.m.p99_us, p.m.p99_us), '.2f')} "
                f"| {fmt(q.avg_batch, '.1f')} / {fmt(p.avg_batch, '.1f')} |"
            )
        if rows:
            lines.extend(["", f"## {title}", ""])
            lines.append("| model | c | protocol | infer/s | p50 | p99 | avg batch (num / den) |")
            lines.append("|---|---:|---|---:|---:|---:|---|")
            lines.extend(rows)

    pair_table("batching / no batching (1 instance)", "batching", "no-batching", (LARGE, SMALL))
    pair_table("2 instances / 1 (both batching)", "2-instances", "batching", (LARGE,))
    pair_table(
        "2 instances / 1 (neither batching)",
        "2-instances-no-batching",
        "no-batching",
        (LARGE, SMALL),
    )

    ort_best = max((o.throughput for (mod, _, _), o in ort.items() if mod == LARGE), default=None)
    beside = [p for p in points if p.config.startswith("beside-idle")]
    if beside and ort_best:
        lines += ["", f"## {LARGE} beside an idle {SMALL} / in-process ORT's best", ""]
        lines += [
            f"One instance of each in one server; `{LARGE}` under load, `{SMALL}` idle. "
            f"`/best` divides by the fastest in-process loop of any batch and thread count "
            f"above ({ort_best:,.0f} samples/s); target {BESIDE_IDLE_TARGET} with lending.",
            "",
            "| c | protocol | config | infer/s | avg batch | /best | target |",
            "|---:|---|---|---:|---:|---:|---|",
        ]
        for p in beside:
            r = p.m.throughput / ort_best
            verdict = "—" if "no-lending" in p.config else (
                "met" if r >= BESIDE_IDLE_TARGET else "NOT met")  # fmt: skip
            lines.append(
                f"| {p.m.concurrency} | {p.m.protocol} | {p.config} | {p.m.throughput:,.0f} "
                f"| {fmt(p.avg_batch, '.1f')} | {r:.2f} | {verdict} |"
            )

    tri = [p for p in points if p.m.server == "triton"]
    if tri:
        lines += ["", "## shoal / Triton (mlp_large, batching, 1 instance)", ""]
        lines += ["| c | protocol | infer/s | p50 | p99 | avg batch shoal / triton |"]
        lines += ["|---:|---|---:|---:|---:|---|"]
        for t in tri:
            s = shoal("batching", t)
            if s is None:
                continue
            lines.append(
                f"| {t.m.concurrency} | {t.m.protocol} "
                f"| {fmt(ratio(s.m.throughput, t.m.throughput), '.2f')} "
                f"| {fmt(ratio(s.m.p50_us, t.m.p50_us), '.2f')} "
                f"| {fmt(ratio(s.m.p99_us, t.m.p99_us), '.2f')} "
                f"| {fmt(s.avg_batch, '.1f')} / {fmt(t.avg_batch, '.1f')} |"
            )

    model, config, c, share = TARGET
    lines += ["", "## Target", ""]
    for p in points:
        if (p.m.server, p.m.model, p.config, p.m.concurrency) != ("shoal", model, config, c):
            continue
        b = _round_batch(p.avg_batch)
        outs = [o for o in (ort.get((model, b, 1)), ort.get((model, b, 2))) if o]
        if not outs:
            continue
        best = max(outs, key=lambda o: o.throughput)
        r = p.m.throughput / best.throughput
        lines.append(
            f"- {model}, batching, c={c}, {p.m.protocol}: {p.m.throughput:,.0f}/s at avg batch "
            f"{fmt(p.avg_batch, '.1f')} vs in-process {best.throughput:,.0f} samples/s "
            f"(batch {b}, {best.server}): {r:.2f} of it, target {share:.2f}: "
            f"{'met' if r >= share else 'NOT met'}"
        )
        load = _side_load(p)
        outs = [o for t in (1, 2) if (o := shared.get((model, b, t, load)))]
        if outs:
            best = max(outs, key=lambda o: o.throughput)
            lines.append(
                f"  - beside {load:.1f} cores of load, as the model had in that run: "
                f"in-process {best.throughput:,.0f} samples/s ({best.server}); shoal "
                f"served {p.m.throughput / best.throughput:.2f} of it"
            )
        bound = _cpu_bound(p, ort)
        if bound is not None:
            side_us, model_us, ceiling = bound
            ideal = max(o.throughput for o in (ort.get((model, b, 1)), ort.get((model, b, 2))) if o)
            lines.append(
                f"  - CPU bound: the rest of the machine (client, frontend, broker) spent "
                f"{side_us:,.0f} µs of CPU per request, and the model at its in-process speed "
                f"needs {model_us:,.0f} µs of CPU per sample: {_CORES} cores serve at most "
                f"{ceiling:,.0f}/s, {ceiling / ideal:.2f} of in-process, even if sharing the "
                f"cores cost the model nothing"
            )
    lines += cpu.cpu_table([p.m for p in points])
    lines += [
        "",
        "Throughput ratios above 1: the numerator is faster; latency ratios below 1: it answers "
        "sooner. `—`: not measured, or no stable percentile.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
