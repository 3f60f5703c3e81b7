"""Python models, shoal against Triton on the very same ``model.py``: the Triton peer's.

The Triton peer here (``../shared/tools/triton-peer``) can run ONNX models only through its
Python backend, with a ``model.py`` that runs ONNX Runtime. shoal's Python backend runs
that same file unchanged, so the two servers run identical model code (ONNX Runtime, one
intra-op thread, the peer's default) behind their own protocol, scheduling and process
hops. Three servers, one after the other, each alone on the cores:

* ``shoal-python``: ``mlp`` as a Python model (``backend: "python"``, the peer's
  ``model.py`` beside the shipped ``model.onnx``);
* ``triton-python``: the peer serving ``mlp`` (it builds the same Python model);
* ``shoal-onnx``: ``mlp`` on shoal's ONNX Runtime backend, for reference.

In-process ONNX Runtime at batch 1 (1 and 2 intra-op threads) runs in the same run.
The report gives shoal-python / triton-python (same model code: the servers alone),
shoal-onnx / shoal-python (what the Python layer costs) and each over ORT. A record,
not a test.

    python bench/run_python.py [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import cpu
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
from servers import TRITON_PEER, ServerProcess, shoal_server, triton_peer_server

MODEL = "mlp"
SERVERS = ("shoal-python", "triton-python", "shoal-onnx")
PEER_MODEL_PY = TRITON_PEER.parent / "model.py"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    return side_by_side_parser(__doc__.splitlines()[0]).parse_args(argv)


def _repos(src: Path, tmp: Path) -> dict[str, Path]:
    shipped = (src / MODEL / "config.pbtxt").read_text()
    onnx, python = tmp / "onnx", tmp / "python"
    link_model(src, onnx, MODEL, shipped)
    as_python = shipped.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
    link_model(src, python, MODEL, as_python)
    shutil.copy(PEER_MODEL_PY, python / MODEL / "1" / "model.py")
    return {"shoal-python": python, "triton-python": onnx, "shoal-onnx": onnx}


def _server(name: str, repo: Path, raw: Path, tmp: Path) -> ServerProcess:
    if name == "triton-python":
        return triton_peer_server(repo, raw / f"{name}.log", tmp)
    srv = shoal_server(repo, raw / f"{name}.log")
    srv.name = name
    return srv


def _report(
    a: argparse.Namespace,
    pa: str,
    got: dict[tuple[str, str, int], Measurement],
    ort: list[Measurement],
    load: float,
) -> str:
    best = max((m.throughput for m in ort), default=None)
    lines = [
        *report_head("shoal vs Triton on the same Python model", pa, load, ort),
        "| protocol | c | shoal-python /s | triton-python /s | shoal-onnx /s | "
        "shoal-py/triton-py | onnx/python | shoal-py p50 µs | triton-py p50 µs | "
        "shoal-py/ORT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in a.protocols:
        for c in a.concurrency:
            ms = [got.get((name, protocol, c)) for name in SERVERS]
            rate = [m.throughput if m else None for m in ms]
            p50 = [m.p50_us if m else None for m in ms]
            lines.append(
                f"| {protocol} | {c} | "
                + " | ".join(fmt(r, ",.0f") for r in rate)
                + f" | {fmt(ratio(rate[0], rate[1]), '.2f')}"
                + f" | {fmt(ratio(rate[2], rate[0]), '.2f')}"
                + f" | {fmt(p50[0], ',.0f')} | {fmt(p50[1], ',.0f')}"
                + f" | {fmt(ratio(rate[0], best), '.2f')} |"
            )
    lines += cpu.cpu_table(list(got.values()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    if not PEER_MODEL_PY.is_file():
        print(f"[bench] the Triton peer's model.py is not at {PEER_MODEL_PY}", file=sys.stderr)
        return 2
    run = start_run(a.out_dir, "python")
    got: dict[tuple[str, str, int], Measurement] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-python-") as tmp:
        repos = _repos(a.repo, Path(tmp))
        for name in SERVERS:  # one server at a time: each has the cores
            srv = _server(name, repos[name], run.raw, Path(tmp))
            label = "triton" if name.startswith("triton") else "shoal"
            try:
                if start_server(srv, a.ready_timeout, skipped) is None:
                    continue
                for c in a.concurrency:
                    for protocol in a.protocols:
                        p = batching_point(run.pa, srv, label, name, MODEL, c, protocol, a, run.raw)
                        if isinstance(p, str):
                            skipped.append(p)
                        else:
                            got[(name, protocol, c)] = p.m
            except KeyboardInterrupt:
                print("[bench] interrupted: writing what was measured", file=sys.stderr)
                break
            finally:
                srv.stop()
    ort = [ort_baseline.measure(a.repo / MODEL / "1" / "model.onnx", MODEL, t) for t in (1, 2)]
    report = _report(a, run.pa, got, ort, run.load)
    return write_report(a.out_dir, run.stamp, "python", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
