"""In-process ONNX Runtime baseline: a plain ``sess.run`` loop on the served model.

This is the ceiling a server's per-request path is compared against: no protocol, no
processes, one caller. Inputs follow the model's signature (dynamic dims become the batch
size), filled with random data like perf_analyzer's default.

    python bench/ort_baseline.py [--repo DIR] [--models simple,mlp] [--seconds 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from perf_analyzer import Measurement
from servers import REPO_ROOT

_NUMPY_FOR_ORT = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint64)": np.uint64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _feed(sess: object, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feed: dict[str, np.ndarray] = {}
    for arg in sess.get_inputs():  # type: ignore[attr-defined]
        shape = [d if isinstance(d, int) else batch for d in arg.shape]
        dtype = _NUMPY_FOR_ORT[arg.type]
        if np.issubdtype(dtype, np.floating):
            feed[arg.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feed[arg.name] = rng.integers(0, 100, shape).astype(dtype)
    return feed


def measure(
    model_path: Path, model: str, intra_op_threads: int, batch: int = 1, seconds: float = 2.0
) -> Measurement:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    feed = _feed(sess, batch)
    run = sess.run
    warm_until = time.perf_counter() + 0.5  # at most 200 calls or half a second
    for _ in range(200):
        run(None, feed)
        if time.perf_counter() > warm_until:
            break
    lat_ns: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    deadline = start + int(seconds * 1e9)
    now = start
    while now < deadline:
        t0 = now
        run(None, feed)
        now = clock()
        lat_ns.append(now - t0)
    elapsed = (now - start) / 1e9
    lat_us = np.asarray(lat_ns) / 1e3
    return Measurement(
        server=f"ort-{intra_op_threads}t",
        model=model,
        concurrency=1,
        throughput=len(lat_ns) * batch / elapsed,
        p50_us=float(np.percentile(lat_us, 50)),
        p99_us=float(np.percentile(lat_us, 99)),
    )


def measure_repo(
    repo: Path, models: list[str], threads: tuple[int, ...] = (1, 2), seconds: float = 2.0
) -> list[Measurement]:
    return [
        measure(repo / m / "1" / "model.onnx", m, t, seconds=seconds)
        for m in models
        for t in threads
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    ap.add_argument("--models", default="simple,mlp")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    print(f"{'model':8} {'threads':>8} {'infer/s':>10} {'p50 µs':>8} {'p99 µs':>8}")
    for m in measure_repo(args.repo, args.models.split(","), seconds=args.seconds):
        print(f"{m.model:8} {m.server:>8} {m.throughput:10.0f} {m.p50_us:8.1f} {m.p99_us:8.1f}")


if __name__ == "__main__":
    main()
