"""What the response cache buys and costs: ``mlp_large`` served three ways, side by side.

Triton's response cache answers a request it has seen from memory, without running the
model. Three shoal servers run one after the other on temporary repositories holding
``mlp_large`` (model file linked, the shipped config plus ``response_cache { enable:
true }`` where the cache is on):

* ``off``: no ``--cache-config``: every request runs the model;
* ``hits``: ``--cache-config=local,size=64MiB``. perf_analyzer sends the same random
  input in every request (its default), so after the first, every request is a hit;
* ``misses``: ``--cache-config=local,size=1``: nothing fits, so every request is hashed,
  looked up and missed, then runs the model: the price of a cache that never hits.

The baseline runs in the same run: in-process ONNX Runtime on the same model at batch 1
(1 and 2 intra-op threads). The report gives hits/off (what a hit saves), misses/off (what
a miss costs) and each over in-process ORT. A record, not a test.

    python bench/run_cache.py [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import ort_baseline
from common import (
    batching_point,
    fmt,
    link_model,
    ratio,
    report_head,
    side_by_side_parser,
    start_run,
    start_server,
    write_report,
)
from perf_analyzer import Measurement
from servers import ServerProcess, shoal_server

MODEL = "mlp_large"
MODES = {"off": None, "hits": 64 * 1024 * 1024, "misses": 1}  # --cache-config size


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    return side_by_side_parser(__doc__.splitlines()[0]).parse_args(argv)


def _server(repo: Path, mode: str, raw: Path) -> ServerProcess:
    srv = shoal_server(repo, raw / f"shoal-{mode}.log")
    size = MODES[mode]
    if size is not None:
        srv.argv.append(f"--cache-config=local,size={size}")
    srv.name = f"shoal-{mode}"
    return srv


def _report(
    a: argparse.Namespace,
    pa: str,
    results: dict[tuple[str, str, int], Measurement],
    ort: list[Measurement],
    load: float,
) -> str:
    best = max(ort, key=lambda m: m.throughput) if ort else None
    lines = [
        *report_head(f"shoal: the response cache on {MODEL}", pa, load, ort),
        "| protocol | c | off /s | hits /s | misses /s | hits/off | misses/off | "
        "hits/ORT | off p50 µs | hits p50 µs | misses p50 µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in a.protocols:
        for c in a.concurrency:
            got = [results.get((mode, protocol, c)) for mode in MODES]
            rate = [m.throughput if m else None for m in got]
            p50 = [m.p50_us if m else None for m in got]
            lines.append(
                f"| {protocol} | {c} | "
                + " | ".join(fmt(r, ",.0f") for r in rate)
                + f" | {fmt(ratio(rate[1], rate[0]), '.2f')}"
                + f" | {fmt(ratio(rate[2], rate[0]), '.2f')}"
                + f" | {fmt(ratio(rate[1], best.throughput if best else None), '.2f')} | "
                + " | ".join(fmt(x, ",.0f") for x in p50)
                + " |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    run = start_run(a.out_dir, "cache")
    stamp, load, raw, pa = run.stamp, run.load, run.raw, run.pa
    results: dict[tuple[str, str, int], Measurement] = {}
    skipped: list[str] = []
    shipped = (a.repo / MODEL / "config.pbtxt").read_text().rstrip("\n") + "\n"
    with tempfile.TemporaryDirectory(prefix="shoal-cache-") as tmp:
        for mode in MODES:  # one server at a time: the others would take its cores
            repo = Path(tmp) / mode
            extra = "" if mode == "off" else "response_cache { enable: true }\n"
            link_model(a.repo, repo, MODEL, shipped + extra)
            srv = _server(repo, mode, raw)
            try:
                if start_server(srv, a.ready_timeout, skipped) is None:
                    continue
                for c in a.concurrency:
                    for protocol in a.protocols:
                        got = batching_point(pa, srv, "shoal", mode, MODEL, c, protocol, a, raw)
                        if isinstance(got, str):
                            skipped.append(got)
                        else:
                            results[(mode, protocol, c)] = got.m
            except KeyboardInterrupt:
                print("[bench] interrupted: writing what was measured", file=sys.stderr)
                break
            finally:
                srv.stop()
    ort = [ort_baseline.measure(a.repo / MODEL / "1" / "model.onnx", MODEL, t) for t in (1, 2)]
    return write_report(a.out_dir, stamp, "cache", _report(a, pa, results, ort, load), skipped)


if __name__ == "__main__":
    sys.exit(main())
