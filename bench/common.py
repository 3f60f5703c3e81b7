"""What the benchmarks share: number formatting, run set-up and reports, perf_analyzer
points with the server's CPU per request, temporary repositories, and server start-up.

Each ``run_*.py`` imports what it needs from here; none imports another's private names.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import cpu
from perf_analyzer import Measurement, perf_analyzer_path, perf_analyzer_version, run_perf_analyzer
from servers import REPO_ROOT, ServerProcess, wait_ready


def csv_ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def csv_list(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def git_commit() -> str:
    def git(*a: str) -> str:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), *a], capture_output=True, text=True)
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    return commit + (" + uncommitted changes" if git("status", "--porcelain") else "")


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def side_by_side_parser(description: str) -> argparse.ArgumentParser:
    """The flags of a run that drives shoal servers one after the other with
    perf_analyzer (run_cache.py, run_many_models.py); the caller adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--concurrency", type=csv_ints, default=[1, 8])
    p.add_argument("--protocols", type=csv_list, default=["http", "grpc"])
    p.add_argument("--measurement-interval", type=int, default=3000)
    p.add_argument("--max-trials", type=int, default=5)
    p.add_argument("--stability-percentage", type=int, default=20)
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return p


def report_head(
    title: str, pa: str, load: float, ort: list[Measurement] | None = None
) -> list[str]:
    """The first lines of a side-by-side run's report: its title and time, the commit,
    perf_analyzer's version, the load at start and the cores; then the in-process ONNX
    Runtime baselines, if given."""
    lines = [
        f"# {title} ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"commit {git_commit()}; perf_analyzer {perf_analyzer_version(pa)}; "
        f"load average at start {load:.2f}; {len(os.sched_getaffinity(0))} cores",
        "",
    ]
    if ort is not None:
        baselines = (f"{m.server} {m.throughput:,.0f}/s (p50 {m.p50_us:,.0f} µs)" for m in ort)
        lines += ["In-process ONNX Runtime, batch 1: " + ", ".join(baselines), ""]
    return lines


def write_report(out_dir: Path, stamp: str, tag: str, report: str, skipped: list[str]) -> int:
    """Write ``<stamp>-<tag>.md`` (the points skipped after it), print it; exit status 0."""
    out = out_dir / f"{stamp}-{tag}.md"
    out.write_text(report + "".join(f"\n{s}" for s in skipped))
    print(out.read_text())
    print(f"[bench] wrote {out}")
    return 0


@dataclass(frozen=True)
class RunStart:
    stamp: str  # names the run's files
    load: float  # the load average when it began
    raw: Path  # its folder for perf_analyzer's CSVs and the servers' logs
    pa: str  # the perf_analyzer binary


def perf_point(
    run: RunStart,
    a: argparse.Namespace,
    url: str,
    *,
    server: str,
    model: str,
    protocol: str,
    concurrency: int,
    name: str,
    extra: tuple[str, ...] = (),
    srv: ServerProcess | None = None,
) -> Measurement:
    """One perf_analyzer point of a side-by-side run (``side_by_side_parser``'s flags),
    its CSV and log in the run's raw folder as ``<name>.csv``/``.log``; with the CPU per
    request of ``srv``'s processes when given (a server this run started)."""
    pid = srv.proc.pid if srv is not None and srv.proc is not None else None
    http = srv.http_url if srv is not None else url
    return cpu.measured(pid, http, model, server != "triton", partial(
        run_perf_analyzer,
        run.pa,
        server=server,
        url=url,
        protocol=protocol,
        model=model,
        concurrency=concurrency,
        csv_path=run.raw / f"{name}.csv",
        interval_ms=a.measurement_interval,
        max_trials=a.max_trials,
        stability_pct=a.stability_percentage,
        timeout_s=(a.max_trials + 2) * a.measurement_interval / 1e3 + 30,
        extra=extra,
    ))  # fmt: skip


def start_run(out_dir: Path, tag: str) -> RunStart:
    """Begin a benchmark run: SIGTERM stops it as Ctrl-C does (the servers are stopped),
    and its raw folder ``<stamp>-<tag>-raw`` is made."""
    signal.signal(signal.SIGTERM, raise_interrupt)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw = out_dir / f"{stamp}-{tag}-raw"
    raw.mkdir(parents=True, exist_ok=True)
    return RunStart(stamp, os.getloadavg()[0], raw, perf_analyzer_path())


@dataclass
class Point:
    """One perf_analyzer run plus what the server's statistics say it formed."""

    m: Measurement
    config: str
    avg_batch: float | None = None
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (batch size, executions)
    queue_us: float | None = None
    infer_us: float | None = None  # compute_infer per execution
    cores: cpu.Usage | None = None  # shoal only: the model's workers vs everything else


def with_batching(text: str) -> str:
    """A config's text with ``dynamic_batching {}`` added unless it has a batcher already."""
    return text if "dynamic_batching" in text else text.rstrip("\n") + "\ndynamic_batching {}\n"


def measured_repo(src_repo: Path, dst_repo: Path, models: list[str], batching: bool) -> Path:
    """``dst_repo`` holding only ``models`` from ``src_repo`` (links to their ``model.onnx``).

    A server measures what it serves and nothing else: an idle neighbour takes cores from the
    measured model in shoal, and a model the Triton peer cannot load (anything not ONNX) keeps
    it from starting. ``batching`` adds ``dynamic_batching {}`` to each config.
    """
    for model in models:
        text = (src_repo / model / "config.pbtxt").read_text()
        link_model(src_repo, dst_repo, model, with_batching(text) if batching else text)
    return dst_repo


def link_model(src_repo: Path, dst_repo: Path, model: str, config_text: str) -> None:
    """``dst_repo/model`` with ``config_text`` and a symlink to the shipped ``model.onnx``."""
    (dst_repo / model / "1").mkdir(parents=True)
    (dst_repo / model / "config.pbtxt").write_text(config_text)
    (dst_repo / model / "1" / "model.onnx").symlink_to(
        (src_repo / model / "1" / "model.onnx").resolve()
    )


def model_stats(http: str, model: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
        doc = json.loads(r.read())
    inf = exe = q_n = q_ns = 0
    batches: dict[int, tuple[int, int]] = {}  # size -> (executions, compute_infer ns)
    for s in doc.get("model_stats", []):
        inf += int(s.get("inference_count", 0))
        exe += int(s.get("execution_count", 0))
        q = s.get("inference_stats", {}).get("queue", {})
        q_n += int(q.get("count", 0))
        q_ns += int(q.get("ns", 0))
        for b in s.get("batch_stats", []):
            ci = b.get("compute_infer", {})
            n0, ns0 = batches.get(int(b["batch_size"]), (0, 0))
            batches[int(b["batch_size"])] = (
                n0 + int(ci.get("count", 0)),
                ns0 + int(ci.get("ns", 0)),
            )
    return {"inf": inf, "exe": exe, "q_n": q_n, "q_ns": q_ns, "batches": batches}


def formed_batches(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    d_inf = int(after["inf"]) - int(before["inf"])  # type: ignore[call-overload]
    d_exe = int(after["exe"]) - int(before["exe"])  # type: ignore[call-overload]
    d_qn = int(after["q_n"]) - int(before["q_n"])  # type: ignore[call-overload]
    d_qns = int(after["q_ns"]) - int(before["q_ns"])  # type: ignore[call-overload]
    b0: dict[int, tuple[int, int]] = before["batches"]  # type: ignore[assignment]
    b1: dict[int, tuple[int, int]] = after["batches"]  # type: ignore[assignment]
    sizes = []
    infer_n = infer_ns = 0
    for size, (n, ns) in b1.items():
        n0, ns0 = b0.get(size, (0, 0))
        if n - n0 > 0:
            sizes.append((size, n - n0))
            infer_n += n - n0
            infer_ns += ns - ns0
    sizes.sort(key=lambda x: -x[1])
    return {
        "avg_batch": d_inf / d_exe if d_exe else None,
        "sizes": sizes,
        "queue_us": d_qns / d_qn / 1e3 if d_qn else None,
        "infer_us": infer_ns / infer_n / 1e3 if infer_n else None,
    }


def start_server(srv: ServerProcess, timeout: float, skipped: list[str]) -> ServerProcess | None:
    print(f"[bench] starting {srv.name}: {' '.join(srv.argv)}", flush=True)
    t0 = time.monotonic()
    try:
        srv.start(timeout)
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"[bench] {srv.name}: {e} (log: {srv.log_path})", file=sys.stderr)
        skipped.append(f"{srv.name}: did not start ({e}); log {srv.log_path.name}")
        return None
    print(f"[bench] {srv.name} ready in {time.monotonic() - t0:.1f}s", flush=True)
    return srv


def measure_batching(
    pa: str,
    srv: ServerProcess,
    server: str,
    config: str,
    model: str,
    c: int,
    protocol: str,
    args: argparse.Namespace,
    raw: Path,
) -> Point:
    wait_ready(srv.http_url, 10)
    before = model_stats(srv.http_url, model)
    workers = cpu.worker_pids(srv.proc.pid) if server == "shoal" and srv.proc else []
    cpu_before = cpu.Snapshot.take(workers)
    root = srv.proc.pid if srv.proc is not None else None
    m = cpu.measured(root, srv.http_url, model, server == "shoal", partial(
        run_perf_analyzer,
        pa,
        server=server,
        url=srv.url(protocol),
        protocol=protocol,
        model=model,
        concurrency=c,
        csv_path=raw / f"{server}-{config}-{protocol}-{model}-c{c}.csv",
        interval_ms=args.measurement_interval,
        max_trials=args.max_trials,
        stability_pct=args.stability_percentage,
        timeout_s=(args.max_trials + 2) * args.measurement_interval / 1e3 + 30,
    ))  # fmt: skip
    cores = cpu.usage(cpu_before, cpu.Snapshot.take(workers)) if workers else None
    formed = formed_batches(before, model_stats(srv.http_url, model))
    return Point(m, config, cores=cores, **formed)  # type: ignore[arg-type]


def batching_point(
    pa: str,
    srv: ServerProcess,
    label: str,
    config: str,
    model: str,
    c: int,
    protocol: str,
    args: argparse.Namespace,
    raw: Path,
) -> Point | str:
    """One measured point, or why it was skipped."""
    what = f"{label}/{config} {protocol} {model} c={c}"
    print(f"[bench] perf_analyzer {what}", flush=True)
    try:
        p = measure_batching(pa, srv, label, config, model, c, protocol, args, raw)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"[bench] {what}: {e}", file=sys.stderr)
        return f"{what}: {e}"
    if label == "triton":
        p.config = "batching"
    avg = fmt(p.avg_batch, ".1f")
    print(f"[bench]   {p.m.throughput:,.0f}/s, avg batch {avg} {p.m.note}", flush=True)
    return p
