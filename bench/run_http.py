"""HTTP benchmark: shoal (and optionally the real Triton) under perf_analyzer, against ORT.

In one run: start ``shoal serve`` on free ports on the shipped repository, drive each model
with perf_analyzer over HTTP (batch 1, binary tensors) at each concurrency, do the same for a
Triton peer if asked, and time an in-process ONNX Runtime loop on the same model files. The
report goes to ``bench/results/<timestamp>.md``; raw CSVs and logs beside it. A record, not a
test: nothing here asserts a speed.

    python bench/run_http.py [--with-triton-peer | --peer-url HOST:PORT] [--no-shoal]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import ort_baseline
from perf_analyzer import (
    Measurement,
    perf_analyzer_path,
    perf_analyzer_version,
    run_perf_analyzer,
)
from servers import REPO_ROOT, ServerProcess, shoal_server, triton_peer_server, wait_ready


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    ap.add_argument("--models", default="simple,mlp")
    ap.add_argument("--concurrency", default="1,8", help="comma list, e.g. 1,8")
    ap.add_argument("--measurement-interval", type=int, default=3000, help="ms per window")
    ap.add_argument("--max-trials", type=int, default=6, help="windows before giving up")
    ap.add_argument(
        "--stability-percentage", type=int, default=20, help="perf_analyzer's -s (default 10)"
    )
    ap.add_argument("--ort-seconds", type=float, default=2.0)
    ap.add_argument("--shoal-url", help="use a shoal already serving HTTP at HOST:PORT")
    ap.add_argument("--no-shoal", action="store_true", help="skip shoal (peer/ORT only)")
    peer = ap.add_mutually_exclusive_group()
    peer.add_argument("--peer-url", help="a Triton already serving HTTP at HOST:PORT")
    peer.add_argument("--with-triton-peer", action="store_true", help="start triton-peer")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return ap.parse_args(argv)


def _drive(
    pa: str,
    server: str,
    url: str,
    args: argparse.Namespace,
    raw_dir: Path,
) -> list[Measurement]:
    results: list[Measurement] = []
    # Generous bound: warm-up plus max_trials windows, plus slack for start-up.
    timeout_s = (args.max_trials + 2) * args.measurement_interval / 1e3 + 30
    for model in args.models.split(","):
        for c in (int(c) for c in args.concurrency.split(",")):
            wait_ready(url, 10)
            print(f"[bench] perf_analyzer {server} {model} c={c}", flush=True)
            try:
                results.append(
                    run_perf_analyzer(
                        pa,
                        server,
                        url,
                        model,
                        c,
                        raw_dir / f"{server}-{model}-c{c}.csv",
                        args.measurement_interval,
                        args.max_trials,
                        args.stability_percentage,
                        timeout_s,
                    )
                )
            except RuntimeError as e:
                print(f"[bench] {e}", file=sys.stderr)
    return results


def _with_server(
    srv: ServerProcess, pa: str, args: argparse.Namespace, raw_dir: Path
) -> list[Measurement]:
    print(f"[bench] starting {srv.name}: {' '.join(srv.argv)}", flush=True)
    t0 = time.monotonic()
    with srv.start(args.ready_timeout):
        print(f"[bench] {srv.name} ready in {time.monotonic() - t0:.1f}s", flush=True)
        return _drive(pa, srv.name, srv.http_url, args, raw_dir)


def _git_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "?"


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def render(results: list[Measurement], meta: dict[str, str]) -> str:
    """The markdown report: one row per model and concurrency, servers side by side."""
    lines = [f"# HTTP benchmark {meta['timestamp']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "timestamp"]
    lines += ["", "## Measurements", ""]
    lines += [
        "| model | c | server | infer/s | p50 µs | p99 µs | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for m in sorted(results, key=lambda r: (r.model, r.concurrency, r.server)):
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.server} | {m.throughput:,.0f} "
            f"| {m.p50_us:,.0f} | {m.p99_us:,.0f} | {m.note} |"
        )
    by = {(m.server, m.model, m.concurrency): m for m in results}
    keys = sorted({(m.model, m.concurrency) for m in results if not m.server.startswith("ort")})
    lines += ["", "## Ratios (throughput; latency ratio is p50 server / p50 other)", ""]
    lines += [
        "| model | c | server | /ORT-1t infer/s | /ORT-2t infer/s | /Triton infer/s "
        "| /Triton p50 |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for model, c in keys:
        ort1, ort2 = by.get(("ort-1t", model, 1)), by.get(("ort-2t", model, 1))
        tri = by.get(("triton", model, c))
        for server in ("shoal", "triton"):
            row = by.get((server, model, c))
            if row is None:
                continue
            other = tri if server != "triton" else None
            lines.append(
                f"| {model} | {c} | {server} "
                f"| {_fmt(row.throughput / ort1.throughput if ort1 else None, '.3f')} "
                f"| {_fmt(row.throughput / ort2.throughput if ort2 else None, '.3f')} "
                f"| {_fmt(row.throughput / other.throughput if other else None, '.2f')} "
                f"| {_fmt(row.p50_us / other.p50_us if other else None, '.2f')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    raw_dir = args.out_dir / f"{stamp}-raw"
    raw_dir.mkdir()
    pa = perf_analyzer_path()
    results: list[Measurement] = []
    started = time.monotonic()
    load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())

    if args.shoal_url:
        results += _drive(pa, "shoal", args.shoal_url, args, raw_dir)
    elif not args.no_shoal:
        try:
            results += _with_server(
                shoal_server(args.repo, raw_dir / "shoal.log"), pa, args, raw_dir
            )
        except (RuntimeError, TimeoutError, OSError) as e:
            print(f"[bench] shoal: {e} (log: {raw_dir / 'shoal.log'})", file=sys.stderr)
    if args.peer_url:
        results += _drive(pa, "triton", args.peer_url, args, raw_dir)
    elif args.with_triton_peer:
        peer = triton_peer_server(args.repo, raw_dir / "triton.log")
        results += _with_server(peer, pa, args, raw_dir)

    print("[bench] in-process ONNX Runtime baseline", flush=True)
    results += ort_baseline.measure_repo(
        args.repo, args.models.split(","), seconds=args.ort_seconds
    )

    import onnxruntime

    meta = {
        "timestamp": stamp,
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "load average at start": load_at_start,
        "commit": _git_commit(),
        "perf_analyzer": f"{perf_analyzer_version(pa)} (HTTP, batch 1, binary tensors, "
        f"{args.measurement_interval} ms windows, max {args.max_trials} trials, "
        f"stable within {args.stability_percentage}%)",
        "onnxruntime": onnxruntime.__version__,
        "triton": args.peer_url or ("triton-peer" if args.with_triton_peer else "not run"),
        "wall time": f"{time.monotonic() - started:.0f} s",
        "raw": str(
            raw_dir.relative_to(REPO_ROOT) if raw_dir.is_relative_to(REPO_ROOT) else raw_dir
        ),
    }
    report = render(results, meta)
    out = args.out_dir / f"{stamp}.md"
    out.write_text(report)
    print(report)
    print(f"[bench] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
