"""Decoupled Python models, streamed: shoal against the real Triton on the same model.py.

``tokens`` is a decoupled Python model that answers a request of N values with N
responses (one INT32 each, as a text generator streams tokens), then the final flag,
all inside ``execute``. ``pipeline`` is an ensemble of it and ``post`` (a Python model
that doubles each token): each of tokens' responses runs post once and answers the
client once, the shape of a streaming LLM pipeline (model, then detokenizer).
perf_analyzer drives each over a gRPC stream (``--streaming``) at N = 1 and N = 32 and
the chosen concurrencies, on shoal and on tritonserver 2.51 (the triton-peer build,
running the very same model.py files and ensemble config), one server at a time.

The baseline, in the same run: the same model.py files run in-process by shoal's Python
backend, tokens' responses counted by a sender that keeps nothing (for ``pipeline``:
that first hands each to post's ``execute``): the models' own cost per response, with no
server around them.

The report gives requests/s, responses/s and perf_analyzer's p50 latency (it measures a
decoupled model's latency to the first response), and the ratios shoal/Triton and
shoal/in-process in responses per second. A record, not a test.

    python bench/run_decoupled.py [--concurrency 1,8] [--responses 1,32] [--models tokens,pipeline]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import cpu
import numpy as np
from common import (
    fmt,
    perf_point,
    ratio,
    report_head,
    side_by_side_parser,
    start_run,
    start_server,
    write_report,
)
from perf_analyzer import Measurement
from servers import REPO_ROOT, python_server

sys.path.insert(0, str(REPO_ROOT))
from tritonclient.grpc import model_config_pb2 as mc

from shoal.workers import pb_utils
from shoal.workers.python_backend import PythonBackend

MODEL = "tokens"
MODELS = (MODEL, "pipeline")
SERVERS = ("shoal", "triton")
MODEL_PY = """
import os
import sys

# Triton's Python stub ignores $PYTHONPATH: numpy is found through it here.
sys.path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p not in sys.path]

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy():
                out = pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=FINAL)
        return None
"""
CONFIG = """
name: "tokens"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]
instance_group [{ count: 1 kind: KIND_CPU }]
"""


POST_PY = """
import os
import sys

sys.path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p not in sys.path]

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)
            ])
            for r in requests
        ]
"""
POST_CONFIG = """
name: "post"
backend: "python"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }]
instance_group [{ count: 1 kind: KIND_CPU }]
"""
PIPELINE_CONFIG = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 0
input [{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]
ensemble_scheduling { step [
  { model_name: "tokens" model_version: -1
    input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "TOKEN" } },
  { model_name: "post" model_version: -1
    input_map { key: "X" value: "TOKEN" } output_map { key: "Y" value: "OUT" } }
] }
"""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = side_by_side_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--responses",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 32],
        help="responses per request (the request's N values)",
    )
    p.add_argument(
        "--models",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(MODELS),
        help=f"which of {', '.join(MODELS)} to drive",
    )
    return p.parse_args(argv)


def _repository(tmp: Path) -> Path:
    repo = tmp / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    (repo / "post" / "1").mkdir(parents=True)
    (repo / "post" / "1" / "model.py").write_text(textwrap.dedent(POST_PY))
    (repo / "post" / "config.pbtxt").write_text(POST_CONFIG)
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(PIPELINE_CONFIG)
    return repo


def in_process(repo: Path, model: str, responses: int, seconds: float = 2.0) -> float:
    """Responses per second of ``model`` run by shoal's Python backend in this process,
    one request per execute, tokens' responses dropped, or (``pipeline``) each handed to
    post's execute first."""
    backend = PythonBackend()
    config = mc.ModelConfig(name=MODEL, backend="python")
    config.model_transaction_policy.decoupled = True
    backend.load(repo / MODEL / "1" / "model.py", config, 1, False)
    post: PythonBackend | None = None
    if model == "pipeline":
        post = PythonBackend()
        post.load(repo / "post" / "1" / "model.py", mc.ModelConfig(name="post"), 1, False)
    values = np.zeros(responses, np.int32)
    sent = 0

    def count(response: Any, final: bool) -> None:
        nonlocal sent
        if response is None:
            return
        if post is not None:
            (token,) = response.output_tensors()
            post.execute({"X": token.as_numpy()}, ["Y"])
        sent += 1

    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < deadline:
        sender = pb_utils.InferenceResponseSender(count)
        req = pb_utils.InferenceRequest([pb_utils.Tensor("IN", values)], ["OUT"], sender=sender)
        if backend.execute_decoupled([req]) is not None:
            raise RuntimeError("the model failed in-process")
    rate = sent / (time.perf_counter() - t0)
    backend.unload()
    if post is not None:
        post.unload()
    return rate


def _report(
    a: argparse.Namespace,
    pa: str,
    got: dict[tuple[str, str, int, int], Measurement],
    baseline: dict[tuple[str, int], float],
    load: float,
) -> str:
    lines = [
        *report_head("Decoupled Python model, streamed over gRPC: shoal vs Triton 2.51", pa, load),
        "Latency: perf_analyzer's p50 to the first response of each request. In-process: the "
        "same model.py files run by shoal's Python backend in the benchmark's process.",
        "",
        "| model | N | c | shoal req/s | shoal resp/s | Triton resp/s | shoal/Triton resp | "
        "shoal p50 µs | Triton p50 µs | in-process resp/s | shoal/in-process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for model in a.models:
        for n in a.responses:
            for c in a.concurrency:
                s, t = got.get(("shoal", model, n, c)), got.get(("triton", model, n, c))
                sr, tr = _responses(s, n), _responses(t, n)
                notes += [
                    f"{m.server} {model} N={n} c={c}: {m.note}" for m in (s, t) if m and m.note
                ]
                base = baseline[(model, n)]
                lines.append(
                    f"| {model} | {n} | {c} | {fmt(s.throughput if s else None, ',.0f')} | "
                    f"{fmt(sr, ',.0f')} | {fmt(tr, ',.0f')} | {fmt(ratio(sr, tr), '.2f')} | "
                    f"{fmt(s.p50_us if s else None, ',.0f')} | "
                    f"{fmt(t.p50_us if t else None, ',.0f')} | "
                    f"{base:,.0f} | {fmt(ratio(sr, base), '.2f')} |"
                )
    if notes:
        lines += ["", "Not settled (responses/s = requests/s x N there):", *notes]
    lines += cpu.cpu_table(list(got.values()))
    return "\n".join(lines) + "\n"


def _responses(m: Measurement | None, n: int) -> float | None:
    """Responses per second: perf_analyzer's, or requests/s x N for a level it did not
    settle (then it writes no CSV; every request gets its N responses)."""
    if m is None:
        return None
    return m.responses if m.responses is not None else m.throughput * n


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    run = start_run(a.out_dir, "decoupled")
    unknown = sorted(set(a.models) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown model(s): {', '.join(unknown)} (choose from {MODELS})")
    got: dict[tuple[str, str, int, int], Measurement] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-decoupled-") as tmp:
        repo = _repository(Path(tmp))
        baseline = {(m, n): in_process(repo, m, n) for m in a.models for n in a.responses}
        for name in SERVERS:  # one server at a time: each has the cores
            srv = python_server(name, repo, run.raw)
            try:
                if start_server(srv, a.ready_timeout, skipped) is None:
                    continue
                for model, n, c in itertools.product(a.models, a.responses, a.concurrency):
                    extra = ("--shape", f"IN:{n}", "--input-data", "zero")
                    try:
                        got[(name, model, n, c)] = perf_point(
                            run, a, srv.grpc_url or "", server=name, model=model,
                            protocol="grpc-stream", concurrency=c,
                            name=f"{name}-{model}-n{n}-c{c}", extra=extra,
                            srv=srv,
                        )  # fmt: skip
                    except (RuntimeError, OSError) as e:
                        skipped.append(f"{name} {model} N={n} c={c}: {e}")
            except KeyboardInterrupt:
                print("[bench] interrupted: writing what was measured", file=sys.stderr)
                break
            finally:
                srv.stop()
    report = _report(a, run.pa, got, baseline, run.load)
    return write_report(a.out_dir, run.stamp, "decoupled", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
