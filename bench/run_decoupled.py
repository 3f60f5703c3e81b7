"""Decoupled Python models, streamed: shoal against the real Triton on the same model.py.

``tokens`` is a decoupled Python model that answers a request of N values with N
responses (one INT32 each, as a text generator streams tokens), then the final flag,
all inside ``execute``. perf_analyzer drives it over a gRPC stream (``--streaming``) at
N = 1 and N = 32 and the chosen concurrencies, on shoal and on tritonserver 2.51 (the
triton-peer build, running the very same model.py), one server at a time.

The baseline, in the same run: the same model.py run in-process by shoal's Python
backend, its responses counted by a sender that keeps nothing (the model's own cost per
response, with no server around it).

The report gives requests/s, responses/s and perf_analyzer's p50 latency (it measures a
decoupled model's latency to the first response), and the ratios shoal/Triton and
shoal/in-process in responses per second. A record, not a test.

    python bench/run_decoupled.py [--concurrency 1,8] [--responses 1,32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
from perf_analyzer import Measurement
from run import (
    _fmt,
    _ratio,
    perf_point,
    report_head,
    side_by_side_parser,
    start_run,
    write_report,
)
from run_batching import _start
from servers import REPO_ROOT, python_server

sys.path.insert(0, str(REPO_ROOT))
from tritonclient.grpc import model_config_pb2 as mc

from workers import pb_utils
from workers.python_backend import PythonBackend

MODEL = "tokens"
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


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = side_by_side_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--responses",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 32],
        help="responses per request (the request's N values)",
    )
    return p.parse_args(argv)


def _repository(tmp: Path) -> Path:
    repo = tmp / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    return repo


def in_process(repo: Path, responses: int, seconds: float = 2.0) -> float:
    """Responses per second of the model run by shoal's Python backend in this process,
    one request per execute, its responses dropped."""
    backend = PythonBackend()
    config = mc.ModelConfig(name=MODEL, backend="python")
    config.model_transaction_policy.decoupled = True
    backend.load(repo / MODEL / "1" / "model.py", config, 1, False)
    values = np.zeros(responses, np.int32)
    sent = 0

    def count(response: Any, final: bool) -> None:
        nonlocal sent
        sent += response is not None

    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < deadline:
        sender = pb_utils.InferenceResponseSender(count)
        req = pb_utils.InferenceRequest([pb_utils.Tensor("IN", values)], ["OUT"], sender=sender)
        if backend.execute_decoupled([req]) is not None:
            raise RuntimeError("the model failed in-process")
    rate = sent / (time.perf_counter() - t0)
    backend.unload()
    return rate


def _report(
    a: argparse.Namespace,
    pa: str,
    got: dict[tuple[str, int, int], Measurement],
    baseline: dict[int, float],
    load: float,
) -> str:
    lines = [
        *report_head("Decoupled Python model, streamed over gRPC: shoal vs Triton 2.51", pa, load),
        "Latency: perf_analyzer's p50 to the first response of each request. In-process: the "
        "same model.py run by shoal's Python backend in the benchmark's process.",
        "",
        "| N | c | shoal req/s | shoal resp/s | Triton resp/s | shoal/Triton resp | "
        "shoal p50 µs | Triton p50 µs | in-process resp/s | shoal/in-process |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for n in a.responses:
        for c in a.concurrency:
            s, t = got.get(("shoal", n, c)), got.get(("triton", n, c))
            sr, tr = _responses(s, n), _responses(t, n)
            notes += [f"{m.server} N={n} c={c}: {m.note}" for m in (s, t) if m and m.note]
            lines.append(
                f"| {n} | {c} | {_fmt(s.throughput if s else None, ',.0f')} | "
                f"{_fmt(sr, ',.0f')} | {_fmt(tr, ',.0f')} | {_fmt(_ratio(sr, tr), '.2f')} | "
                f"{_fmt(s.p50_us if s else None, ',.0f')} | "
                f"{_fmt(t.p50_us if t else None, ',.0f')} | "
                f"{baseline[n]:,.0f} | {_fmt(_ratio(sr, baseline[n]), '.2f')} |"
            )
    if notes:
        lines += ["", "Not settled (responses/s = requests/s x N there):", *notes]
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
    got: dict[tuple[str, int, int], Measurement] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-decoupled-") as tmp:
        repo = _repository(Path(tmp))
        baseline = {n: in_process(repo, n) for n in a.responses}
        for name in SERVERS:  # one server at a time: each has the cores
            srv = python_server(name, repo, run.raw)
            try:
                if _start(srv, a.ready_timeout, skipped) is None:
                    continue
                for n in a.responses:
                    for c in a.concurrency:
                        extra = ("--shape", f"IN:{n}", "--input-data", "zero")
                        try:
                            got[(name, n, c)] = perf_point(
                                run, a, srv.grpc_url or "", server=name, model=MODEL,
                                protocol="grpc-stream", concurrency=c,
                                name=f"{name}-n{n}-c{c}", extra=extra,
                            )  # fmt: skip
                        except (RuntimeError, OSError) as e:
                            skipped.append(f"{name} N={n} c={c}: {e}")
            except KeyboardInterrupt:
                print("[bench] interrupted: writing what was measured", file=sys.stderr)
                break
            finally:
                srv.stop()
    report = _report(a, run.pa, got, baseline, run.load)
    return write_report(a.out_dir, run.stamp, "decoupled", report, skipped)


if __name__ == "__main__":
    sys.exit(main())
