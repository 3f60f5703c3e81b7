"""Ragged batching end to end, through the real server and tritonclient (HTTP and gRPC):
requests of different lengths to a model with ``allow_ragged_batch`` are batched into one
execution (seen in Triton's statistics), the model gets them flattened together with its
batch inputs, and each request gets its own answer back, also from a ragged output
(``batch_output``). A batch of one request goes the same way."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer
from tools import modelgen

# Long delays: a batch forms when its preferred size is reached, never by timing.
MODELS = {
    "ragged_pair": "dynamic_batching { preferred_batch_size: [ 2 ] "
    "max_queue_delay_microseconds: 10000000 }",
    "ragged_trio": "dynamic_batching { preferred_batch_size: [ 3 ] "
    "max_queue_delay_microseconds: 10000000 }",
    "ragged_single": "",  # no scheduler: each request runs alone
}


def _write(repo: Path, name: str, extra: str) -> None:
    config = modelgen.RAGGED_SUM_CONFIG.format(name=name, extra=extra)
    modelgen.write_model(repo, name, modelgen.ragged_sum_model(), config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("ragged-repo")
    for name, extra in MODELS.items():
        _write(repo, name, extra)
    srv = ShoalServer(repo)
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _values(length: int, first: int) -> np.ndarray:
    """[1, length] of small integers: their float32 sums are exact."""
    return np.arange(first, first + length, dtype=np.float32).reshape(1, length)


def _http(srv: ShoalServer, model: str, x: np.ndarray) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer(model, [inp])
        return {n: result.as_numpy(n) for n in ("SUM", "LENGTH", "DOUBLED")}
    finally:
        client.close()  # in this thread: gevent's hub cannot close it from another


def _grpc(srv: ShoalServer, model: str, x: np.ndarray) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer(model, [inp], client_timeout=30)
        return {n: result.as_numpy(n) for n in ("SUM", "LENGTH", "DOUBLED")}
    finally:
        client.close()


Infer = Callable[[ShoalServer, str, np.ndarray], dict[str, np.ndarray]]


def _stats(srv: ShoalServer, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{srv.url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return dict(stats)


def _assert_own_answer(x: np.ndarray, out: dict[str, np.ndarray]) -> None:
    assert out["SUM"].shape == (1, 1) and out["SUM"][0, 0] == x.sum()
    assert out["LENGTH"].shape == (1, 1) and out["LENGTH"][0, 0] == x.size
    assert out["DOUBLED"].shape == x.shape  # ragged output, scattered by the input's shape
    np.testing.assert_array_equal(out["DOUBLED"], x * 2)


def _concurrent(srv: ShoalServer, infer: Infer, model: str, lengths: list[int]) -> None:
    inputs, first = [], 1
    for n in lengths:
        inputs.append(_values(n, first))
        first += n
    before = _stats(srv, model)
    with ThreadPoolExecutor(len(inputs)) as pool:
        outs = list(pool.map(lambda x: infer(srv, model, x), inputs))
    for x, out in zip(inputs, outs, strict=True):
        _assert_own_answer(x, out)
    after = _stats(srv, model)
    assert after["execution_count"] - before["execution_count"] == 1  # batched together
    assert after["inference_count"] - before["inference_count"] == len(lengths)
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sizes.get(len(lengths), 0) >= 1


@pytest.mark.parametrize(("infer", "lengths"), [(_http, [3, 5]), (_grpc, [5, 3])])
def test_two_ragged_requests_batch_together(
    server: ShoalServer, infer: Infer, lengths: list[int]
) -> None:
    _concurrent(server, infer, "ragged_pair", lengths)


@pytest.mark.parametrize("infer", [_http, _grpc])
def test_three_ragged_requests_batch_together(server: ShoalServer, infer: Infer) -> None:
    _concurrent(server, infer, "ragged_trio", [1, 7, 2])


@pytest.mark.parametrize("infer", [_http, _grpc])
def test_a_lone_ragged_request_is_flattened_too(server: ShoalServer, infer: Infer) -> None:
    before = _stats(server, "ragged_single")["execution_count"]
    for length in (4, 1, 6):
        x = _values(length, 10)
        _assert_own_answer(x, infer(server, "ragged_single", x))
    assert _stats(server, "ragged_single")["execution_count"] - before == 3


def test_model_config_shows_the_batch_inputs(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("ragged_pair")
    assert config["input"][0]["allow_ragged_batch"] is True
    assert [b["target_name"] for b in config["batch_input"]] == [["INDEX"], ["COUNT"]]
    metadata = client.get_model_metadata("ragged_pair")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0"]  # batch inputs are not asked for
