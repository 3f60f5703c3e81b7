"""Each framework backend in shoal against the same framework called in-process, on the
same model and batch (as ``ort_baseline.py`` does for ONNX Runtime).

For each case a model is built at start-up into a temporary repository (one instance,
KIND_CPU, one framework thread), served by one ``shoal serve``, and measured with
perf_analyzer at ``-b <batch>`` (random inputs, batch 1 otherwise as run.py); then the
framework runs the very same model file in this process, one caller, the same batch and
thread count, in a loop: its calls/s times the batch, and its per-call latency. The
ratio shoal/in-process says what serving costs (protocol, processes, batching) per
sample. A record, not a test.

    python bench/run_backends.py [--cases fil-xgboost,fil-lightgbm] [--batch 1,64]
        [--concurrency 1] [--protocols grpc]

Cases: ``fil-xgboost`` (an XGBoost binary classifier, 32 features, 100 trees of depth 6,
``predict_proba``: XGBoost's ``inplace_predict``), ``fil-lightgbm`` (the same with
LightGBM: ``Booster.predict``), ``openvino-mlp`` (an IR of an MLP 256 -> 1024 -> 256:
OpenVINO's ``InferRequest.infer`` with ``share_inputs``), ``pt2-exported`` and ``pt2-aoti``
(the same MLP in torch, exported with a dynamic batch: an ExportedProgram's ``module()``,
an AOTInductor package's runner; building the package takes a minute), ``tf-savedmodel``
(the MLP as a SavedModel: its serving signature called), ``python-ort`` (the shipped
``mlp`` as a Python model running ONNX Runtime: that call in-process), ``onnx-mlp`` (the
shipped ``mlp`` on ONNX Runtime, the reference: what serving costs on this machine in the
same run). The Triton peer serves Python models only (no OpenVINO, TensorFlow, FIL or
PyTorch backend): run_python.py compares it with shoal on the same model.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import (
    RunStart,
    csv_ints,
    csv_list,
    fmt,
    formed_batches,
    link_model,
    model_stats,
    ratio,
    report_head,
    start_run,
    start_server,
    write_report,
)
from perf_analyzer import Measurement, run_perf_analyzer
from servers import REPO_ROOT, ServerProcess, shoal_server

sys.path.insert(0, str(REPO_ROOT))
from tools import ovgen, treegen

FEATURES = 32
Runner = Callable[[np.ndarray], object]


@dataclass(frozen=True)
class Case:
    """``build(repo, model)`` writes the model and returns the in-process runner factory:
    ``(batch) -> (inputs, call)``; ``model``: its name in the repository."""

    build: Callable[[Path, str], Callable[[int], tuple[np.ndarray, Runner]]]
    model: str


def _fil(library: str) -> Case:
    def build(repo: Path, name: str) -> Callable[[int], tuple[np.ndarray, Runner]]:
        if library == "xgboost":
            model = treegen.train_xgboost("binary", FEATURES, rows=4000, trees=100, depth=6)
            model.set_param({"nthread": 1})
            model_type = "xgboost_ubj"
        else:
            model = treegen.train_lightgbm("binary", FEATURES, rows=4000, trees=100)
            model_type = "lightgbm"
        params = {
            "model_type": model_type, "is_classifier": "true", "threshold": "0.5",
            "predict_proba": "true", "cpu_nthread": "1",
        }  # fmt: skip
        text = treegen.fil_config(name, FEATURES, [1], params, max_batch_size=1024)
        treegen.write_fil_model(repo, name, model, model_type, text)

        def runner(batch: int) -> tuple[np.ndarray, Runner]:
            x = treegen.sample(batch, FEATURES, seed=5)
            if library == "xgboost":
                return x, lambda a: model.inplace_predict(a, validate_features=False)
            return x, lambda a: model.predict(a, num_threads=1)

        return runner

    return Case(build, f"fil_{library}")


def _onnx_mlp() -> Case:
    """The shipped ``mlp`` on ONNX Runtime (1 intra-op thread in both), for reference: what
    serving costs on this machine, now, for the backend measured longest."""

    def build(repo: Path, name: str) -> Callable[[int], tuple[np.ndarray, Runner]]:
        config = (REPO_ROOT / "model_repository" / "mlp" / "config.pbtxt").read_text()
        config = config.replace("max_batch_size: 32", "max_batch_size: 64")
        config += 'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
        link_model(REPO_ROOT / "model_repository", repo, name, config)
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"), opts)

        def runner(batch: int) -> tuple[np.ndarray, Runner]:
            x = np.random.default_rng(5).standard_normal((batch, 256)).astype(np.float32)
            return x, lambda a: sess.run(None, {"INPUT0": a})

        return runner

    return Case(build, "mlp")


PYTHON_ORT_MODEL = """
import os
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        batch = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        (out,) = self.session.run(["OUTPUT0"], {"INPUT0": np.concatenate(batch)})
        parts = np.split(out, np.cumsum([len(b) for b in batch])[:-1])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", p)]) for p in parts]
"""


def _python_ort() -> Case:
    """The shipped ``mlp`` as a Python model whose ``execute`` runs ONNX Runtime (one
    intra-op thread), against that ONNX Runtime call in-process: what the Python backend
    costs beside ``onnx-mlp``'s row. (The Triton peer serving this same model.py:
    run_python.py.)"""

    def build(repo: Path, name: str) -> Callable[[int], tuple[np.ndarray, Runner]]:
        import onnxruntime as ort

        shipped = REPO_ROOT / "model_repository" / "mlp"
        config = (shipped / "config.pbtxt").read_text().replace('name: "mlp"', f'name: "{name}"')
        config = config.replace("max_batch_size: 32", "max_batch_size: 64")
        config = config.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.onnx").symlink_to((shipped / "1" / "model.onnx").resolve())
        (repo / name / "1" / "model.py").write_text(PYTHON_ORT_MODEL)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(shipped / "1" / "model.onnx"), opts)

        def runner(batch: int) -> tuple[np.ndarray, Runner]:
            x = np.random.default_rng(5).standard_normal((batch, 256)).astype(np.float32)
            return x, lambda a: sess.run(None, {"INPUT0": a})

        return runner

    return Case(build, "python_mlp")


def _openvino() -> Case:
    """An MLP (256 -> 1024 -> ReLU -> 256) as an IR; OpenVINO's defaults but one
    inference thread in both (its CPU plugin picks BF16 where the CPU has it, in both)."""

    def build(repo: Path, name: str) -> Callable[[int], tuple[np.ndarray, Runner]]:
        import openvino as ov

        config = (
            f'name: "{name}"\nbackend: "openvino"\nmax_batch_size: 64\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
            'parameters { key: "INFERENCE_NUM_THREADS" value { string_value: "1" } }\n'
        )
        xml = ovgen.write_ir(repo, name, ovgen.mlp_onnx(256, 256, hidden=1024), config)
        compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_NUM_THREADS": 1})
        request = compiled.create_infer_request()

        def runner(batch: int) -> tuple[np.ndarray, Runner]:
            x = np.random.default_rng(5).standard_normal((batch, 256)).astype(np.float32)
            return x, lambda a: request.infer({"X": a}, share_inputs=True)

        return runner

    return Case(build, "ov_mlp")


def _pt2(aoti: bool) -> Case:
    """An MLP (256 -> 1024 -> ReLU -> 256) exported with a dynamic batch, as an
    ExportedProgram archive or AOTInductor package; one intra-op thread in both."""

    def build(repo: Path, name: str) -> Callable[[int], tuple[np.ndarray, Runner]]:
        import torch

        torch.set_num_threads(1)
        mlp = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
        ).eval()
        batch = torch.export.Dim("batch", min=1, max=64)
        program = torch.export.export(mlp, (torch.ones(2, 256),), dynamic_shapes=({0: batch},))
        path = repo / name / "1" / "model.pt2"
        path.parent.mkdir(parents=True)
        if aoti:
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))
            fn = torch._inductor.aoti_load_package(str(path))
        else:
            torch.export.save(program, str(path))
            fn = torch.export.load(str(path)).module()
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "torch_aoti"\nmax_batch_size: 64\n'
            'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
            'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
            'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n'
        )

        def runner(batch: int) -> tuple[np.ndarray, Runner]:
            x = np.random.default_rng(5).standard_normal((batch, 256)).astype(np.float32)

            def call(a: np.ndarray) -> object:
                with torch.inference_mode():
                    return fn(torch.from_numpy(a)).numpy()

            return x, call

        return runner

    return Case(build, "pt2_aoti" if aoti else "pt2_exported")


def _tf() -> Case:
    """The MLP (256 -> 1024 -> ReLU -> 256) as a SavedModel; one intra-op thread in both."""

    def build(repo: Path, name: str) -> Callable[[int], tuple[np.ndarray, Runner]]:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)  # (before TensorFlow's first op)
        from tools import tfgen

        saved = tfgen.save_mlp(repo / name / "1" / "model.savedmodel")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 64\n'
            'parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "1" } }\n'
        )
        fn = tf.saved_model.load(str(saved)).signatures["serving_default"]

        def runner(batch: int) -> tuple[np.ndarray, Runner]:
            x = np.random.default_rng(5).standard_normal((batch, 256)).astype(np.float32)
            return x, lambda a: fn(X=tf.constant(a))["Y"].numpy()

        return runner

    return Case(build, "tf_mlp")


CASES: dict[str, Case] = {
    "fil-xgboost": _fil("xgboost"),
    "fil-lightgbm": _fil("lightgbm"),
    "openvino-mlp": _openvino(),
    "pt2-exported": _pt2(aoti=False),
    "pt2-aoti": _pt2(aoti=True),
    "tf-savedmodel": _tf(),
    "onnx-mlp": _onnx_mlp(),
    "python-ort": _python_ort(),
}


def in_process(name: str, x: np.ndarray, call: Runner, seconds: float) -> Measurement:
    """The framework's own call on ``x`` in a loop: samples/s and per-call latency."""
    warm_until = time.perf_counter() + 0.5
    while time.perf_counter() < warm_until:
        call(x)
    lat: list[int] = []
    clock = time.perf_counter_ns
    start = now = clock()
    deadline = start + int(seconds * 1e9)
    while now < deadline:
        t0 = now
        call(x)
        now = clock()
        lat.append(now - t0)
    us = np.asarray(lat) / 1e3
    return Measurement(
        server="in-process", model=name, concurrency=1,
        throughput=len(lat) * len(x) / ((now - start) / 1e9),
        p50_us=float(np.percentile(us, 50)), p99_us=float(np.percentile(us, 99)),
    )  # fmt: skip


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=csv_list, default=list(CASES))
    p.add_argument("--batch", type=csv_ints, default=[1, 64])
    p.add_argument("--concurrency", type=csv_ints, default=[1])
    p.add_argument("--protocols", type=csv_list, default=["grpc"])
    p.add_argument("--measurement-interval", type=int, default=3000)
    p.add_argument("--max-trials", type=int, default=5)
    p.add_argument("--stability-percentage", type=int, default=20)
    p.add_argument("--seconds", type=float, default=3.0, help="in-process loop per point")
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    run = start_run(a.out_dir, "backends")
    rows: list[Row] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-backends-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        runners = {name: CASES[name].build(repo, CASES[name].model) for name in a.cases}
        srv = shoal_server(repo, run.raw / "shoal.log")
        try:
            if start_server(srv, a.ready_timeout, skipped) is not None:
                for name in a.cases:
                    for batch in a.batch:
                        x, call = runners[name](batch)
                        base = in_process(name, x, call, a.seconds)
                        for protocol in a.protocols:
                            for c in a.concurrency:
                                model = CASES[name].model
                                m = _point(run, a, srv, model, batch, protocol, c, skipped)
                                rows.append((name, batch, protocol, c, m, base))
        except KeyboardInterrupt:
            print("[bench] interrupted: writing what was measured", file=sys.stderr)
        finally:
            srv.stop()
    return write_report(a.out_dir, run.stamp, "backends", _report(run.pa, run.load, rows), skipped)


def _point(
    run: RunStart,
    a: argparse.Namespace,
    srv: ServerProcess,
    name: str,
    batch: int,
    protocol: str,
    c: int,
    skipped: list[str],
) -> tuple[Measurement, float | None] | None:
    """One perf_analyzer point and the model's compute time per execution in it, from the
    server's statistics (None when it failed: the reason is in ``skipped``)."""
    print(f"[bench] perf_analyzer {name} -b {batch} {protocol} c={c}", flush=True)
    try:
        before = model_stats(srv.http_url, name)
        m = run_perf_analyzer(
            run.pa, server="shoal", url=srv.url(protocol), protocol=protocol, model=name,
            concurrency=c, csv_path=run.raw / f"{name}-b{batch}-{protocol}-c{c}.csv",
            interval_ms=a.measurement_interval, max_trials=a.max_trials,
            stability_pct=a.stability_percentage,
            timeout_s=(a.max_trials + 2) * a.measurement_interval / 1e3 + 30,
            extra=("-b", str(batch)),  # (after run_perf_analyzer's own -b 1: the last counts)
        )  # fmt: skip
        formed = formed_batches(before, model_stats(srv.http_url, name))
        return m, formed["infer_us"]  # type: ignore[return-value]
    except (RuntimeError, OSError) as e:
        skipped.append(f"{name} b={batch} {protocol} c={c}: {e}")
        return None


Row = tuple[str, int, str, int, tuple[Measurement, float | None] | None, Measurement]


def _report(pa: str, load: float, rows: list[Row]) -> str:
    lines = [
        *report_head("Backends in shoal vs their framework in-process", pa, load),
        "Samples/s: perf_analyzer's inferences/s (requests x batch) for shoal; calls/s x "
        "batch for the in-process loop. p50: per request (shoal, client side) and per "
        "call (in-process). shoal compute: the model's compute_infer per execution in the "
        "server's statistics (the framework's call inside the worker, with the backend's "
        "own work).",
        "",
        "| case | batch | protocol | c | shoal samples/s | in-process samples/s | "
        "shoal/in-process | shoal p50 µs | shoal compute µs | in-process p50 µs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, batch, protocol, c, point, base in rows:
        m, compute = point if point else (None, None)
        rate = m.throughput if m else None
        lines.append(
            f"| {name} | {batch} | {protocol} | {c} | {fmt(rate, ',.0f')} | "
            f"{base.throughput:,.0f} | {fmt(ratio(rate, base.throughput), '.2f')} | "
            f"{fmt(m.p50_us if m else None, ',.0f')} | {fmt(compute, ',.0f')} | "
            f"{base.p50_us:,.1f} |" + (f" {m.note}" if m and m.note else "")
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
