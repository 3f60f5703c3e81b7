"""Benchmark: shoal (and optionally the real Triton) under perf_analyzer, against in-process ORT.

In one run: for each frontend count start a separate ``shoal serve --frontend-processes N`` on
free loopback ports, drive each model with perf_analyzer (batch 1) over each protocol at each
concurrency, do the same for a Triton peer if asked, and time an in-process ONNX Runtime loop
on the same model files. The report goes to ``bench/results/<timestamp>.md`` with the
measurements and the ratio tables; raw CSVs and logs beside it. A record, not a test: nothing
here asserts a speed.

    python bench/run.py [--protocols http,grpc] [--streaming] [--frontends 1,2]
                        [--concurrency 1,8,32] [--models simple,mlp]
                        [--with-triton-peer | --peer-url HOST:PORT] [--no-shoal]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import cpu
import ort_baseline
from common import csv_ints, csv_list, fmt, git_commit, measured_repo, raise_interrupt, ratio
from perf_analyzer import (
    Measurement,
    perf_analyzer_path,
    perf_analyzer_version,
    run_perf_analyzer,
)
from servers import (
    REPO_ROOT,
    ServerProcess,
    noop_server,
    shoal_server,
    triton_peer_server,
    wait_ready,
)


@dataclass(frozen=True)
class Target:
    """A server to drive: its label, shoal's frontend count, and its two addresses."""

    server: str
    http: str
    grpc: str | None
    frontends: int | None = None
    pid: int | None = None  # its process, when this run started it: CPU is read per request

    def url(self, protocol: str) -> str | None:
        return self.http if protocol == "http" else self.grpc


def _plus_one(url: str) -> str:
    host, port = url.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    ap.add_argument("--models", type=csv_list, default="simple,mlp")
    ap.add_argument(
        "--no-dynamic-batching",
        dest="dynamic_batching",
        action="store_false",
        help="serve the configs as shipped (default: each gets dynamic_batching {})",
    )
    ap.add_argument("--protocols", type=csv_list, default="http,grpc", help="http, grpc")
    ap.add_argument(
        "--streaming", action="store_true", help="also perf_analyzer -i grpc --streaming"
    )
    ap.add_argument(
        "--frontends",
        type=csv_ints,
        default="1,2",
        help="shoal --frontend-processes values; one server each",
    )
    ap.add_argument("--concurrency", type=csv_ints, default="1,8,32")
    ap.add_argument("--measurement-interval", type=int, default=3000, help="ms per window")
    ap.add_argument("--max-trials", type=int, default=5, help="windows before giving up")
    ap.add_argument(
        "--stability-percentage", type=int, default=20, help="perf_analyzer's -s (default 10)"
    )
    ap.add_argument("--ort-seconds", type=float, default=2.0)
    ap.add_argument("--shoal-url", help="use a shoal already serving HTTP at HOST:PORT")
    ap.add_argument("--shoal-grpc-url", help="its gRPC address (default: HTTP port + 1)")
    ap.add_argument("--no-shoal", action="store_true", help="skip shoal (peer/ORT only)")
    peer = ap.add_mutually_exclusive_group()
    peer.add_argument("--peer-url", help="a Triton already serving HTTP at HOST:PORT")
    peer.add_argument("--with-triton-peer", action="store_true", help="start triton-peer")
    ap.add_argument("--peer-grpc-url", help="the peer's gRPC address (default: HTTP port + 1)")
    ap.add_argument(
        "--with-noop",
        action="store_true",
        help="also a no-op server of shoal's stack (bench/noop_server.py): the floor",
    )
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    bad = [p for p in args.protocols if p not in ("http", "grpc")]
    if bad:
        ap.error(f"unknown protocol(s) {bad}; --streaming adds grpc-stream")
    if args.streaming:
        args.protocols = [*args.protocols, "grpc-stream"]
    return args


def _drive(
    pa: str, target: Target, args: argparse.Namespace, raw_dir: Path, skipped: list[str]
) -> list[Measurement]:
    """Every model x concurrency x protocol against one server; protocols interleaved."""
    results: list[Measurement] = []
    # Generous bound: max_trials windows, plus slack for start-up and the final report.
    timeout_s = (args.max_trials + 2) * args.measurement_interval / 1e3 + 30
    fe = f"-{target.frontends}f" if target.frontends else ""
    failures = 0  # in a row: a server that fails twice running is given up on
    for model in args.models:
        for c in args.concurrency:
            for protocol in args.protocols:
                url = target.url(protocol)
                what = f"{target.server}{fe} {protocol} {model} c={c}"
                if url is None:
                    skipped.append(f"{what}: no gRPC address")
                    continue
                if failures >= 2:
                    skipped.append(f"{what}: not run, {target.server}{fe} failed twice running")
                    continue
                try:
                    wait_ready(target.http, 10)
                except TimeoutError as e:
                    failures += 1
                    skipped.append(f"{what}: {e}")
                    continue
                print(f"[bench] perf_analyzer {what}", flush=True)
                csv_path = raw_dir / f"{target.server}{fe}-{protocol}-{model}-c{c}.csv"
                try:
                    m = cpu.measured(
                        target.pid,
                        target.http,
                        model,
                        target.server == "shoal",
                        partial(
                            run_perf_analyzer,
                            pa,
                            server=target.server,
                            url=url,
                            protocol=protocol,
                            model=model,
                            concurrency=c,
                            csv_path=csv_path,
                            interval_ms=args.measurement_interval,
                            max_trials=args.max_trials,
                            stability_pct=args.stability_percentage,
                            timeout_s=timeout_s,
                            frontends=target.frontends,
                        ),
                    )
                except (RuntimeError, OSError) as e:
                    print(f"[bench] {e}", file=sys.stderr)
                    skipped.append(f"{what}: {e}")
                    failures += 1
                    continue
                failures = 0
                if m.note:
                    print(f"[bench]   {m.note}", flush=True)
                results.append(m)
    return results


def _with_server(
    srv: ServerProcess,
    server: str,
    pa: str,
    args: argparse.Namespace,
    raw_dir: Path,
    skipped: list[str],
) -> list[Measurement]:
    print(f"[bench] starting {srv.name}: {' '.join(srv.argv)}", flush=True)
    t0 = time.monotonic()
    try:
        srv.start(args.ready_timeout)
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"[bench] {srv.name}: {e} (log: {srv.log_path})", file=sys.stderr)
        skipped.append(f"{srv.name}: did not start ({e}); log {srv.log_path.name}")
        return []
    with srv:
        print(f"[bench] {srv.name} ready in {time.monotonic() - t0:.1f}s", flush=True)
        pid = srv.proc.pid if srv.proc is not None else None
        target = Target(server, srv.http_url, srv.grpc_url, srv.frontends, pid)
        return _drive(pa, target, args, raw_dir, skipped)


# ---------------------------------------------------------------------------------------------
# The report


def _fe(m: Measurement) -> str:
    return "—" if m.frontends is None else str(m.frontends)


class _Index:
    def __init__(self, results: Iterable[Measurement]) -> None:
        self.by = {(m.server, m.protocol, m.frontends, m.model, m.concurrency): m for m in results}

    def get(
        self, server: str, protocol: str, frontends: int | None, model: str, c: int
    ) -> Measurement | None:
        return self.by.get((server, protocol, frontends, model, c))

    def ort(self, threads: int, model: str) -> Measurement | None:
        return self.get(f"ort-{threads}t", "", None, model, 1)


def _sort_key(m: Measurement) -> tuple[object, ...]:
    order = {"http": 0, "grpc": 1, "grpc-stream": 2, "": 3}
    return (m.model, m.concurrency, m.server, order.get(m.protocol, 9), m.frontends or 0)


def render(
    results: list[Measurement], meta: dict[str, str], skipped: list[str] | None = None
) -> str:
    """The markdown report: measurements, then the ratio tables."""
    served = sorted((m for m in results if m.protocol), key=_sort_key)
    ix = _Index(results)
    shoal = [m for m in served if m.server == "shoal"]
    fes = sorted({m.frontends for m in shoal if m.frontends is not None})
    base_fe = fes[0] if fes else None

    lines = [f"# Benchmark {meta['timestamp']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "timestamp"]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in skipped]

    lines += ["", "## Measurements", ""]
    lines += [
        "| model | c | server | protocol | frontends | infer/s | p50 µs | p99 µs | note |",
        "|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for m in sorted(results, key=_sort_key):
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.server} | {m.protocol or 'in-process'} "
            f"| {_fe(m)} | {m.throughput:,.0f} | {fmt(m.p50_us, ',.0f')} "
            f"| {fmt(m.p99_us, ',.0f')} | {m.note} |"
        )

    # At a glance: one row per shoal point, every throughput ratio side by side.
    lines += ["", "## Ratios at a glance (throughput; shoal rows)", ""]
    lines += [
        "Each column divides this row's infer/s by another point of the same model and c: "
        "`/HTTP` the same server over HTTP, "
        f"`/{base_fe}f` shoal with {base_fe} frontend(s) over the same protocol, "
        "`/ORT-1t` the in-process 1-thread loop, `/Triton` the peer over the same protocol "
        "(and `/Triton p50`: p50 over the peer's p50).",
        "",
        f"| model | c | protocol | frontends | infer/s | /HTTP | /{base_fe}f | /ORT-1t "
        "| /Triton | /Triton p50 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in shoal:
        k = (m.model, m.concurrency)
        http = ix.get("shoal", "http", m.frontends, *k) if m.protocol != "http" else None
        one = ix.get("shoal", m.protocol, base_fe, *k) if m.frontends != base_fe else None
        ort1 = ix.ort(1, m.model)
        tri = ix.get("triton", m.protocol, None, *k)
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.protocol} | {_fe(m)} | {m.throughput:,.0f} "
            f"| {fmt(ratio(m.throughput, http and http.throughput), '.2f')} "
            f"| {fmt(ratio(m.throughput, one and one.throughput), '.2f')} "
            f"| {fmt(ratio(m.throughput, ort1 and ort1.throughput), '.3f')} "
            f"| {fmt(ratio(m.throughput, tri and tri.throughput), '.2f')} "
            f"| {fmt(ratio(m.p50_us, tri and tri.p50_us), '.2f')} |"
        )

    # gRPC (and streaming) over HTTP, same server, model, c, frontends.
    others = [p for p in ("grpc", "grpc-stream") if any(m.protocol == p for m in served)]
    if others and any(m.protocol == "http" for m in served):
        lines += ["", "## gRPC / HTTP (same server, model, c, frontends)", ""]
        head = "".join(f" {p}/http infer/s | {p}/http p50 |" for p in others)
        lines += [
            f"| model | c | server | frontends |{head}",
            "|---|---:|---|---:|" + "---:|" * (2 * len(others)),
        ]
        for h in (m for m in served if m.protocol == "http"):
            cells = ""
            for p in others:
                o = ix.get(h.server, p, h.frontends, h.model, h.concurrency)
                cells += f" {fmt(ratio(o and o.throughput, h.throughput), '.2f')} |"
                cells += f" {fmt(ratio(o and o.p50_us, h.p50_us), '.2f')} |"
            lines.append(f"| {h.model} | {h.concurrency} | {h.server} | {_fe(h)} |{cells}")

    # More frontends over fewer.
    if len(fes) > 1:
        lines += ["", f"## shoal N frontends / {base_fe} (same protocol, model, c)", ""]
        head = "".join(f" {f}f/{base_fe}f infer/s | {f}f/{base_fe}f p50 |" for f in fes[1:])
        lines += [
            f"| model | c | protocol |{head}",
            "|---|---:|---|" + "---:|" * (2 * len(fes[1:])),
        ]
        for b in (m for m in shoal if m.frontends == base_fe):
            cells = ""
            for f in fes[1:]:
                o = ix.get("shoal", b.protocol, f, b.model, b.concurrency)
                cells += f" {fmt(ratio(o and o.throughput, b.throughput), '.2f')} |"
                cells += f" {fmt(ratio(o and o.p50_us, b.p50_us), '.2f')} |"
            lines.append(f"| {b.model} | {b.concurrency} | {b.protocol} |{cells}")

    # Servers over the in-process ceiling.
    lines += ["", "## Server / in-process ONNX Runtime (throughput)", ""]
    lines += [
        "| model | c | server | protocol | frontends | /ORT-1t | /ORT-2t |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for m in served:
        o1, o2 = ix.ort(1, m.model), ix.ort(2, m.model)
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.server} | {m.protocol} | {_fe(m)} "
            f"| {fmt(ratio(m.throughput, o1 and o1.throughput), '.3f')} "
            f"| {fmt(ratio(m.throughput, o2 and o2.throughput), '.3f')} |"
        )

    # shoal over Triton, same protocol.
    if any(m.server == "triton" for m in served) and shoal:
        lines += ["", "## shoal / Triton (same protocol, model, c)", ""]
        lines += [
            "| model | c | protocol | frontends | infer/s | p50 | p99 |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        for m in shoal:
            t = ix.get("triton", m.protocol, None, m.model, m.concurrency)
            if t is None:
                continue
            lines.append(
                f"| {m.model} | {m.concurrency} | {m.protocol} | {_fe(m)} "
                f"| {fmt(ratio(m.throughput, t.throughput), '.2f')} "
                f"| {fmt(ratio(m.p50_us, t.p50_us), '.2f')} "
                f"| {fmt(ratio(m.p99_us, t.p99_us), '.2f')} |"
            )
    if any(m.server == "noop" for m in served) and shoal:
        lines += _over_noop(shoal, ix)
    lines += cpu.cpu_table(served)
    lines += [
        "",
        "Ratios of throughput: above 1 means the numerator is faster. Ratios of latency: "
        "below 1 means the numerator answers sooner. `—`: a side was not measured or had no "
        "stable percentile.",
    ]
    return "\n".join(lines) + "\n"


def _over_noop(shoal: list[Measurement], ix: _Index) -> list[str]:
    """shoal against the no-op server of its stack: what the broker, the worker, the model
    and the frontend's own work add to parsing a request and writing an answer."""
    lines = ["", "## shoal / no-op server of its stack (same protocol, model, c)", ""]
    lines += [
        "`noop` is bench/noop_server.py: aiohttp and grpc.aio on uvloop answering at once. "
        "CPU columns: µs per request, shoal's frontend(s) and whole server beside the "
        "no-op server's; `over` is shoal's server less the no-op's.",
        "",
        "| model | c | protocol | frontends | infer/s | p50 | noop CPU | shoal frontend "
        "| shoal server | over |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in shoal:
        n = ix.get("noop", m.protocol, None, m.model, m.concurrency)
        if n is None:
            continue
        ncpu = n.cpu_us.get("server") if n.cpu_us else None
        fe = m.cpu_us.get("frontend") if m.cpu_us else None
        srv = m.cpu_us.get("server") if m.cpu_us else None
        over = None if ncpu is None or srv is None else srv - ncpu
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.protocol} | {_fe(m)} "
            f"| {fmt(ratio(m.throughput, n.throughput), '.2f')} "
            f"| {fmt(ratio(m.p50_us, n.p50_us), '.2f')} | {fmt(ncpu, ',.0f')} "
            f"| {fmt(fe, ',.0f')} | {fmt(srv, ',.0f')} | {fmt(over, ',.0f')} |"
        )
    return lines


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)  # so the servers' context managers stop them
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    raw_dir = args.out_dir / f"{stamp}-raw"
    raw_dir.mkdir()
    pa = perf_analyzer_path()
    results: list[Measurement] = []
    skipped: list[str] = []
    started = time.monotonic()
    load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    points = len(args.models) * len(args.concurrency) * len(args.protocols)
    servers = (
        (0 if args.no_shoal else 1 if args.shoal_url else len(args.frontends))
        + (1 if args.peer_url or args.with_triton_peer else 0)
        + (1 if args.with_noop else 0)
    )
    est = points * servers * (3.4 * args.measurement_interval / 1e3 + 1)
    print(
        f"[bench] {points * servers} perf_analyzer runs, at least ~{est / 60:.1f} min",
        flush=True,
    )

    # Every server started here serves the measured models only (bench/common.measured_repo).
    tmp = tempfile.TemporaryDirectory(prefix="shoal-bench-run-")
    served = measured_repo(args.repo, Path(tmp.name), args.models, args.dynamic_batching)
    try:
        if args.shoal_url:
            grpc = args.shoal_grpc_url or _plus_one(args.shoal_url)
            results += _drive(pa, Target("shoal", args.shoal_url, grpc), args, raw_dir, skipped)
        elif not args.no_shoal:
            for fe in args.frontends:
                srv = shoal_server(served, raw_dir / f"shoal-{fe}f.log", frontends=fe)
                results += _with_server(srv, "shoal", pa, args, raw_dir, skipped)
        if args.peer_url:
            grpc = args.peer_grpc_url or _plus_one(args.peer_url)
            results += _drive(pa, Target("triton", args.peer_url, grpc), args, raw_dir, skipped)
        elif args.with_triton_peer:
            peer = triton_peer_server(served, raw_dir / "triton.log")
            results += _with_server(peer, "triton", pa, args, raw_dir, skipped)

        if args.with_noop:
            noop = noop_server(served, raw_dir / "noop.log")
            results += _with_server(noop, "noop", pa, args, raw_dir, skipped)

        print("[bench] in-process ONNX Runtime baseline", flush=True)
        results += ort_baseline.measure_repo(args.repo, args.models, seconds=args.ort_seconds)
    except KeyboardInterrupt:
        skipped.append("interrupted: the run stopped early; the rest was not measured")
    finally:
        tmp.cleanup()

    import onnxruntime

    meta = {
        "timestamp": stamp,
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "load average at start": load_at_start,
        "commit": git_commit(),
        "perf_analyzer": f"{perf_analyzer_version(pa)} ({', '.join(args.protocols)}; batch 1; "
        f"{args.measurement_interval} ms windows, max {args.max_trials} trials, "
        f"stable within {args.stability_percentage}%)",
        "shoal": (
            args.shoal_url
            or ("not run" if args.no_shoal else f"--frontend-processes {args.frontends}")
        ),
        "configs": "shipped, with dynamic_batching {} added"
        if args.dynamic_batching
        else "shipped (--no-dynamic-batching)",
        "onnxruntime": onnxruntime.__version__,
        "triton": args.peer_url or ("triton-peer" if args.with_triton_peer else "not run"),
        "load average at end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "wall time": f"{time.monotonic() - started:.0f} s",
        "raw": str(
            raw_dir.relative_to(REPO_ROOT) if raw_dir.is_relative_to(REPO_ROOT) else raw_dir
        ),
    }
    report = render(results, meta, skipped)
    out = args.out_dir / f"{stamp}.md"
    out.write_text(report)
    print(report)
    print(f"[bench] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
