"""Business logic scripting: a Python model that calls ``mlp`` (``exec()``), on shoal and
on the real Triton, with the same model.py.

``bls_mlp`` is a Python model whose ``execute`` sends each request's input to ``mlp``
through ``pb_utils.InferenceRequest(model_name="mlp", ...).exec()`` and answers with its
output: a request costs the client's hop, the scripting model's execution, and a second
request inside the server. Each server runs ``mlp`` and ``bls_mlp``; perf_analyzer drives
each model alone (one server at a time, each with the cores):

* shoal: ``mlp`` on its ONNX Runtime backend, ``bls_mlp`` as a Python model;
* Triton 2.51 (triton-peer's build, Python backend only): ``mlp`` as triton-peer's
  Python model running ONNX Runtime, ``bls_mlp`` the very same model.py as shoal's.

In-process ONNX Runtime on ``mlp`` at batch 1 runs in the same run. The report gives
requests/s and p50 for each, bls/direct on each server (what a scripted hop costs) and
shoal/Triton on ``bls_mlp``. A record, not a test.

    python bench/run_bls.py [--concurrency 1,8] [--protocols http,grpc]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import cpu
import ort_baseline
from common import (
    fmt,
    link_model,
    perf_point,
    ratio,
    report_head,
    side_by_side_parser,
    start_run,
    start_server,
    write_report,
)
from perf_analyzer import Measurement
from servers import TRITON_PEER, python_server

SERVERS = ("shoal", "triton")
MODELS = ("mlp", "bls_mlp")
BLS_MODEL_PY = """
import os
import sys

# Triton's Python stub ignores $PYTHONPATH: numpy is found through it here.
sys.path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p not in sys.path]

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(
                model_name="mlp",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x.as_numpy())],
            )
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
"""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    return side_by_side_parser(__doc__.splitlines()[0]).parse_args(argv)


def _repos(src: Path, tmp: Path) -> dict[str, Path]:
    shipped = (src / "mlp" / "config.pbtxt").read_text()
    as_python = shipped.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
    bls_config = as_python.replace('name: "mlp"', 'name: "bls_mlp"')
    repos = {}
    for server in SERVERS:
        repo = repos[server] = tmp / server
        link_model(src, repo, "mlp", shipped if server == "shoal" else as_python)
        if server == "triton":  # Triton's build here runs ONNX through a Python model
            shutil.copy(TRITON_PEER.parent / "model.py", repo / "mlp" / "1" / "model.py")
        (repo / "bls_mlp" / "1").mkdir(parents=True)
        (repo / "bls_mlp" / "1" / "model.py").write_text(textwrap.dedent(BLS_MODEL_PY))
        (repo / "bls_mlp" / "config.pbtxt").write_text(bls_config)
    return repos


def _report(
    a: argparse.Namespace,
    pa: str,
    got: dict[tuple[str, str, str, int], Measurement],
    ort: list[Measurement],
    load: float,
) -> str:
    lines = [
        *report_head("Business logic scripting: shoal vs Triton 2.51", pa, load, ort),
        "| protocol | c | server | mlp /s | bls_mlp /s | bls/direct | mlp p50 µs | "
        "bls_mlp p50 µs | bls_mlp shoal/Triton |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in a.protocols:
        for c in a.concurrency:
            bls = {s: got.get((s, "bls_mlp", protocol, c)) for s in SERVERS}
            for server in SERVERS:
                direct, scripted = got.get((server, "mlp", protocol, c)), bls[server]
                rate = [m.throughput if m else None for m in (direct, scripted)]
                p50 = [m.p50_us if m else None for m in (direct, scripted)]
                vs = ""
                if server == "shoal":
                    shoal, triton = bls["shoal"], bls["triton"]
                    vs = fmt(
                        ratio(shoal.throughput if shoal else None,
                               triton.throughput if triton else None), ".2f"
                    )  # fmt: skip
                lines.append(
                    f"| {protocol} | {c} | {server} | {fmt(rate[0], ',.0f')} | "
                    f"{fmt(rate[1], ',.0f')} | {fmt(ratio(rate[1], rate[0]), '.2f')} | "
                    f"{fmt(p50[0], ',.0f')} | {fmt(p50[1], ',.0f')} | {vs} |"
                )
    notes = [f"{m.server} {m.model} {m.protocol} c={m.concurrency}: {m.note}"
             for m in got.values() if m.note]  # fmt: skip
    lines += cpu.cpu_table(list(got.values()))
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    run = start_run(a.out_dir, "bls")
    got: dict[tuple[str, str, str, int], Measurement] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-bls-") as tmp:
        repos = _repos(a.repo, Path(tmp))
        for name in SERVERS:  # one server at a time: each has the cores
            srv = python_server(name, repos[name], run.raw)
            try:
                if start_server(srv, a.ready_timeout, skipped) is None:
                    continue
                for protocol in a.protocols:
                    for c in a.concurrency:
                        for model in MODELS:
                            try:
                                got[(name, model, protocol, c)] = perf_point(
                                    run, a, srv.url(protocol), server=name, model=model,
                                    protocol=protocol, concurrency=c,
                                    name=f"{name}-{model}-{protocol}-c{c}",
                                    srv=srv,
                                )  # fmt: skip
                            except (RuntimeError, OSError) as e:
                                skipped.append(f"{name} {model} {protocol} c={c}: {e}")
            except KeyboardInterrupt:
                print("[bench] interrupted: writing what was measured", file=sys.stderr)
                break
            finally:
                srv.stop()
    ort = [ort_baseline.measure(a.repo / "mlp" / "1" / "model.onnx", "mlp", 1)]
    report = _report(a, run.pa, got, ort, run.load)
    return write_report(a.out_dir, run.stamp, "bls", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
