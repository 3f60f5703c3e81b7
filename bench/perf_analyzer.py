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
    concurrency: int,
    csv_path: Path,
    interval_ms: int,
    max_trials: int,
    stability_pct: int,
    timeout_s: float,
) -> Measurement:
    """One perf_analyzer process at one concurrency; HTTP, batch 1, binary tensors.

    perf_analyzer's HTTP client sends and requests tensors with the binary data extension by
    default. It reports a level only once 3 consecutive windows agree within
    ``stability_pct``; if none do within ``max_trials`` windows it reports nothing, so the
    level is measured again with a 100% tolerance and marked "unstable".
    """
    attempts = [(stability_pct, "")]
    if stability_pct < 100:
        attempts.append((100, "unstable"))
    log_path = csv_path.with_suffix(".log")
    logs = []
    for pct, note in attempts:
        csv_path.unlink(missing_ok=True)
        argv = [
            binary,
            *("-m", model, "-u", url, "-i", "http", "-b", "1"),
            *("--concurrency-range", f"{concurrency}:{concurrency}:1"),
            *("--measurement-interval", str(interval_ms)),
            *("--max-trials", str(max_trials)),
            *("--stability-percentage", str(pct)),
            *("-f", str(csv_path)),
        ]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            logs.append(" ".join(argv) + "\n" + out.stdout + out.stderr)
        except subprocess.TimeoutExpired as e:
            partial = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            logs.append(f"timed out after {timeout_s}s\n{partial}")
            continue
        log_path.write_text("\n".join(logs))
        rows = _parse_csv(csv_path, server, model, note) if csv_path.exists() else []
        if out.returncode == 0 and rows:
            return rows[0]
    log_path.write_text("\n".join(logs))
    tail = " | ".join(logs[-1].strip().splitlines()[-2:])
    raise RuntimeError(f"perf_analyzer failed on {server}/{model} c={concurrency}: {tail}")


def _parse_csv(path: Path, server: str, model: str, note: str) -> list[Measurement]:
    with path.open(newline="") as f:
        return [
            Measurement(
                server=server,
                model=model,
                concurrency=int(row["Concurrency"]),
                throughput=float(row["Inferences/Second"]),
                p50_us=float(row["p50 latency"]),
                p99_us=float(row["p99 latency"]),
                note=note,
            )
            for row in csv.DictReader(f)
        ]
