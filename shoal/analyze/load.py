"""Load for ``shoal analyze``: perf_analyzer where it is, else a built-in generator.

Both keep ``concurrency`` requests in flight over gRPC (batch 1, random inputs of the
model's shapes) for a measurement window after a short warm-up, and report inferences per
second and the p50/p95/p99 latency of the requests the window saw. perf_analyzer is
found as the tests and benchmarks find it: ``$PERF_ANALYZER``, then ``perf_analyzer`` on
the PATH.
"""

from __future__ import annotations

import asyncio
import csv
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shoal.analyze.search import Sample

_NUMPY: dict[str, Any] = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip


class LoadGenerator(Protocol):
    name: str

    def run(self, concurrency: int, window_s: float) -> Sample: ...


def perf_analyzer_binary() -> str | None:
    return os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")


def _random_inputs(config: dict[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, array) for each input of ``config``: batch 1, -1 dims as 1."""
    rng = np.random.default_rng(0)
    batch = [1] if int(config.get("max_batch_size", 0)) > 0 else []
    out = []
    for t in config.get("input", []):
        dtype = str(t["data_type"]).removeprefix("TYPE_")
        dims = [*batch, *(max(int(d), 1) for d in t.get("dims", []))]
        if dtype in ("STRING", "BYTES"):
            arr = np.full(dims, b"x", dtype=np.object_)
            dtype = "BYTES"
        else:
            arr = (rng.random(dims) * 4).astype(_NUMPY[dtype])
        out.append((t["name"], dtype, arr))
    return out


class BuiltinLoad:
    """tritonclient's asyncio gRPC client, ``concurrency`` tasks each sending its next
    request as its last is answered."""

    name = "built-in"

    def __init__(self, grpc_url: str, model: str, config: dict[str, Any]) -> None:
        self.url, self.model = grpc_url, model
        self.inputs = _random_inputs(config)

    def run(self, concurrency: int, window_s: float) -> Sample:
        return asyncio.run(self._run(concurrency, window_s))

    async def _run(self, concurrency: int, window_s: float) -> Sample:
        import tritonclient.grpc.aio as grpcclient

        client = grpcclient.InferenceServerClient(self.url)
        inputs = []
        for name, dtype, arr in self.inputs:
            inp = grpcclient.InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        start = time.perf_counter() + min(0.5, window_s / 3)  # warm-up first
        end = start + window_s
        latencies: list[float] = []

        async def loop() -> None:
            while (t0 := time.perf_counter()) < end:
                await client.infer(self.model, inputs)
                if t0 >= start:
                    latencies.append(time.perf_counter() - t0)

        try:
            await asyncio.gather(*(loop() for _ in range(concurrency)))
        finally:
            await client.close()
        return _sample(concurrency, len(latencies) / window_s, latencies)


def _sample(concurrency: int, throughput: float, latencies_s: list[float]) -> Sample:
    if not latencies_s:
        raise RuntimeError(f"no request completed in the window at concurrency {concurrency}")
    p50, p95, p99 = np.percentile(np.array(latencies_s) * 1e3, [50, 95, 99])
    return Sample(concurrency, throughput, float(p50), float(p95), float(p99))


class PerfAnalyzerLoad:
    """One perf_analyzer run per concurrency (its CSV read back). Its stability check is
    off (3 windows, any spread): the search compares points with its own noise margin, and
    a short window on a busy host would otherwise never settle."""

    name = "perf_analyzer"

    def __init__(self, binary: str, grpc_url: str, model: str) -> None:
        self.binary, self.url, self.model = binary, grpc_url, model

    def run(self, concurrency: int, window_s: float) -> Sample:
        with tempfile.TemporaryDirectory(prefix="shoal-analyze-pa-") as tmp:
            csv_path = Path(tmp) / "pa.csv"
            argv = [
                self.binary,
                *("-m", self.model, "-u", self.url, "-i", "grpc", "-b", "1"),
                *("--concurrency-range", f"{concurrency}:{concurrency}:1"),
                *("--measurement-interval", str(max(100, int(window_s * 1000)))),
                *("--max-trials", "3", "--stability-percentage", "1000"),
                *("-f", str(csv_path)),
            ]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if out.returncode != 0 or not csv_path.exists():
                tail = (out.stdout + out.stderr).strip().splitlines()[-3:]
                raise RuntimeError(f"perf_analyzer failed ({out.returncode}): {' | '.join(tail)}")
            with csv_path.open() as f:
                row = next(csv.DictReader(f))
        us = {k: float(row[f"{k} latency"]) / 1e3 for k in ("p50", "p95", "p99")}
        return Sample(concurrency, float(row["Inferences/Second"]), us["p50"], us["p95"], us["p99"])
