"""``shoal analyze``'s flags (argparse only: the command line stays quick to build; the
analyzer itself, shoal/analyze/main.py, is imported when the command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    p = sub.add_parser(
        "analyze",
        help="search a model's config space on this host (instances, batching, threads)",
        description="Search a model's config space on this host with a shoal server of its "
        "own, and report the Pareto front of throughput against p99 (docs/analyze.md).",
    )
    p.add_argument("--model-repository", required=True, type=Path)
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    p.add_argument("--latency-budget-ms", type=float, default=None, help="p99 limit")
    p.add_argument("--objective", choices=("throughput", "latency"), default="throughput")
    p.add_argument(
        "--budget-secs",
        type=float,
        default=300.0,
        help="no new point after this long (counted once the server is up)",
    )
    p.add_argument("--window-secs", type=float, default=2.0, help="each measurement window")
    p.add_argument("--max-points", type=int, default=40)
    p.add_argument("--load", choices=("auto", "perf_analyzer", "builtin"), default="auto",
                   help="auto: perf_analyzer if $PERF_ANALYZER or the PATH has it")  # fmt: skip
    p.add_argument("--output", type=Path, default=None, help="default: ./analyze-<model>")
    p.add_argument("--write", action="store_true", help="write config.pbtxt beside the model")
    p.add_argument(
        "--gpu",
        default=None,
        help="the GPUs KIND_GPU instances may use: all (default where the host has GPUs), "
        "none, or device ids such as 0,1; on a host without GPU the search stays on KIND_CPU",
    )
    p.add_argument("--server-arg", action="append", default=[], help="a flag for shoal serve")
    return p
