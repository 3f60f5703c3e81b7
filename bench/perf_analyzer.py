"""Run Triton's perf_analyzer against a KServe v2 HTTP endpoint and parse its CSV report."""

from __future__ import annotations

import csv
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servers import REPO_ROOT

INSTALLER = REPO_ROOT.parent / "shared" / "tools" / "install-perf-analyzer"


@dataclass(frozen=True)
class Measurement:
    """One load level: requests per second and client-side latency percentiles in µs."""

    server: str
    model: str
    concurrency: int
    throughput: float
    p50_us: float
    p99_us: float
    note: str = ""


def perf_analyzer_path() -> str:
    """``$PERF_ANALYZER``, else whatever ``install-perf-analyzer`` prints (installs once)."""
    env = os.environ.get("PERF_ANALYZER")
    if env:
        return env
    out = subprocess.run([str(INSTALLER)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def perf_analyzer_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (out.stdout + out.stderr).strip().splitlines()[-1] if out.returncode == 0 else "?"


def run_perf_analyzer(
    binary: str,
    server: str,
    url: str,
    model: str,
    concurrencies: list[int],
    csv_path: Path,
    interval_ms: int,
    max_trials: int,
    timeout_s: float,
) -> list[Measurement]:
    """One perf_analyzer process over all concurrencies; HTTP, batch 1, binary tensors.

    perf_analyzer's HTTP client sends and requests tensors with the binary data extension by
    default. A level that never reaches ``max_trials`` stable windows is still reported,
    marked "unstable", because perf_analyzer prints the last window's numbers anyway.
    """
    lo, hi = min(concurrencies), max(concurrencies)
    step = (hi - lo) if len(concurrencies) == 2 else 1
    argv = [
        binary,
        "-m",
        model,
        "-u",
        url,
        "-i",
        "http",
        "-b",
        "1",
        "--concurrency-range",
        f"{lo}:{hi}:{max(step, 1)}",
        "--measurement-interval",
        str(interval_ms),
        "--max-trials",
        str(max_trials),
        "-f",
        str(csv_path),
    ]
    log_path = csv_path.with_suffix(".log")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        log = out.stdout + out.stderr
        failed = out.returncode != 0
    except subprocess.TimeoutExpired as e:
        log = f"timed out after {timeout_s}s\n{e.stdout or ''}"
        failed = True
    log_path.write_text(log)
    rows = _parse_csv(csv_path, server, model) if csv_path.exists() else []
    wanted = set(concurrencies)
    rows = [r for r in rows if r.concurrency in wanted]
    unstable = "unstable" if "Failed to obtain stable measurement" in log else ""
    if unstable:
        rows = [Measurement(**{**r.__dict__, "note": unstable}) for r in rows]
    if failed and not rows:
        tail = " | ".join(log.strip().splitlines()[-3:])
        raise RuntimeError(f"perf_analyzer failed on {server}/{model}: {tail}")
    return rows


def _parse_csv(path: Path, server: str, model: str) -> list[Measurement]:
    with path.open(newline="") as f:
        return [
            Measurement(
                server=server,
                model=model,
                concurrency=int(row["Concurrency"]),
                throughput=float(row["Inferences/Second"]),
                p50_us=float(row["p50 latency"]),
                p99_us=float(row["p99 latency"]),
            )
            for row in csv.DictReader(f)
        ]
