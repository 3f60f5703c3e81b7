"""Run Triton's perf_analyzer against a KServe v2 endpoint (HTTP, gRPC or gRPC streaming)."""

from __future__ import annotations

import csv
import os
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servers import REPO_ROOT

INSTALLER = REPO_ROOT.parent / "shared" / "tools" / "install-perf-analyzer"

#: The protocols a run can ask for, and the perf_analyzer flags each means.
PROTOCOL_FLAGS = {
    "http": ("-i", "http"),
    "grpc": ("-i", "grpc"),
    "grpc-stream": ("-i", "grpc", "--streaming"),
}

_PASS = re.compile(r"Pass \[(\d+)\] throughput: ([\d.]+) infer/sec\. Avg latency: (\d+) usec")


@dataclass(frozen=True)
class Measurement:
    """One load level: requests per second and client-side latency percentiles in µs.

    ``protocol`` is ``http``, ``grpc`` or ``grpc-stream`` ('' for in-process ORT);
    ``frontends`` is shoal's ``--frontend-processes`` (None for other servers). ``p50_us``
    and ``p99_us`` are None when perf_analyzer never settled (see ``note``).
    """

    server: str
    model: str
    concurrency: int
    throughput: float
    p50_us: float | None
    p99_us: float | None
    note: str = ""
    protocol: str = ""
    frontends: int | None = None
    responses: float | None = None  # per second, a decoupled model's (any per request)
    # CPU µs per request by role over the run (bench/cpu.py PerRequest); None: not read
    cpu_us: dict[str, float] | None = None


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
    *,
    server: str,
    url: str,
    protocol: str,
    model: str,
    concurrency: int,
    csv_path: Path,
    interval_ms: int,
    max_trials: int,
    stability_pct: int,
    timeout_s: float,
    frontends: int | None = None,
    extra: tuple[str, ...] = (),
) -> Measurement:
    """One perf_analyzer process at one concurrency, batch 1, random inputs.

    Over HTTP perf_analyzer sends and requests tensors with the binary data extension by
    default; over gRPC it uses raw_input_contents. It reports a level only once 3 consecutive
    windows agree within ``stability_pct``. If none do within ``max_trials`` windows the
    level is not retried: its throughput is the mean of the last 3 windows (printed because
    of ``-v``), it has no percentiles, and ``note`` says ``unstable``.
    """
    argv = [
        binary,
        *("-m", model, "-u", url, *PROTOCOL_FLAGS[protocol], "-b", "1", "-v"),
        *("--concurrency-range", f"{concurrency}:{concurrency}:1"),
        *("--measurement-interval", str(interval_ms)),
        *("--max-trials", str(max_trials)),
        *("--stability-percentage", str(stability_pct)),
        *("-f", str(csv_path)),
        *extra,  # e.g. --sequence-length for a sequence model
    ]
    csv_path.unlink(missing_ok=True)
    log_path = csv_path.with_suffix(".log")
    what = f"{server}/{protocol}/{model} c={concurrency}"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        text = out.stdout + out.stderr
        rc = out.returncode
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        text, rc = f"timed out after {timeout_s:.0f}s\n{partial}", -1
    log_path.write_text(" ".join(argv) + "\n" + text)
    common = dict(server=server, model=model, protocol=protocol, frontends=frontends)
    if rc == 0 and csv_path.exists():
        with csv_path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if rows:
            row = rows[0]
            return Measurement(
                concurrency=int(row["Concurrency"]),
                throughput=float(row["Inferences/Second"]),
                p50_us=float(row["p50 latency"]),
                p99_us=float(row["p99 latency"]),
                responses=float(row["Response Throughput"])
                if "Response Throughput" in row
                else None,
                **common,  # type: ignore[arg-type]
            )
    passes = [(float(m[2]), float(m[3])) for m in _PASS.finditer(text)][-3:]
    if len(passes) == 3 and "stable measurement" in text:
        tput = [p[0] for p in passes]
        mean = statistics.fmean(tput)
        spread = (max(tput) - min(tput)) / mean * 100
        lat = statistics.fmean(p[1] for p in passes)
        return Measurement(
            concurrency=concurrency,
            throughput=mean,
            p50_us=None,
            p99_us=None,
            note=f"unstable: last 3 windows' mean, spread {spread:.0f}%, avg {lat:,.0f} µs",
            **common,  # type: ignore[arg-type]
        )
    tail = " | ".join(text.strip().splitlines()[-2:])
    why = f"signal {-rc}" if rc < -1 else f"exit status {rc}" if rc > 0 else "no result"
    raise RuntimeError(f"perf_analyzer failed on {what} ({why}): {tail}")
