"""Shared by the fault tests: the shipped models in a module's own repository, a fresh
server per test, and the inputs and metric reads they use."""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer
from tools import modelgen


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("fault-repo")
    modelgen.write_shipped_repository(repo)
    return repo


@pytest.fixture
def fresh_server(small_repo: Path) -> Iterator[ShoalServer]:
    srv = ShoalServer(small_repo)
    yield srv
    if srv.proc.poll() is None:
        srv.stop()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def simple_inputs() -> list[httpclient.InferInput]:
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return ins


def mlp_input() -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))
    return [inp]


def metric(srv: ShoalServer, sample: str) -> float:
    """One sample of the server's metrics page, by its name and labels as printed."""
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {sample}")


def write_broken(repo: Path) -> None:
    """The shipped models and ``broken``, whose config Triton refuses."""
    modelgen.write_shipped_repository(repo)
    modelgen.write_model(
        repo,
        "broken",
        modelgen.simple_model(),
        'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n',
    )
