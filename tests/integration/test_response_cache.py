"""Triton's response cache end to end (``--cache-config local,size=N`` and a model's
``response_cache { enable: true }``): repeated requests answered without running the
model, counted in the statistics and metrics as Triton counts them, over HTTP and gRPC."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.repos import write_identity
from tests.serverctl import ShoalServer, served
from tools import modelgen

CACHED = "response_cache { enable: true }\n"
# an entry of a "big" request costs 256 + 128 + 2,048 bytes: the cache holds one of them
CACHE_BYTES = 3000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("cache-repo")
    config = modelgen.SIMPLE_CONFIG.replace('name: "simple"', 'name: "addsub"') + CACHED
    modelgen.write_model(repo, "addsub", modelgen.simple_model(), config)
    write_identity(repo, "plain")
    write_identity(repo, "big", CACHED, dims="[ 512 ]")
    with served(repo, f"--cache-config=local,size={CACHE_BYTES}") as srv:
        yield srv


def _stats(url: str, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return dict(stats)


def _counts(url: str, model: str) -> dict[str, int]:
    s = _stats(url, model)
    st = s["inference_stats"]
    return {
        "success": st["success"]["count"],
        "hit": st["cache_hit"]["count"],
        "miss": st["cache_miss"]["count"],
        "inferences": s["inference_count"],
        "executions": s["execution_count"],
    }


def _addsub(client: Any, module: Any, a: int, outputs: list[str] | None = None) -> dict:
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.full((1, 16), a, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    asked = [module.InferRequestedOutput(n) for n in outputs] if outputs else None
    result = client.infer("addsub", inputs, outputs=asked)
    names = outputs or ["OUTPUT0", "OUTPUT1"]
    return {n: int(result.as_numpy(n)[0, 0]) for n in names}


def test_a_repeated_request_is_answered_without_running_the_model(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    before = _counts(server.url, "addsub")
    assert _addsub(http, httpclient, 5) == {"OUTPUT0": 6, "OUTPUT1": 4}  # a miss: it runs
    assert _addsub(http, httpclient, 5) == {"OUTPUT0": 6, "OUTPUT1": 4}  # a hit
    assert _addsub(grpc, grpcclient, 5) == {"OUTPUT0": 6, "OUTPUT1": 4}  # a hit over gRPC
    after = _counts(server.url, "addsub")
    assert {k: after[k] - before[k] for k in after} == {
        "success": 3,
        "hit": 2,
        "miss": 1,
        "inferences": 1,
        "executions": 1,
    }
    st = _stats(server.url, "addsub")["inference_stats"]
    assert st["cache_hit"]["ns"] > 0 and st["cache_miss"]["ns"] > 0


def test_asking_for_other_outputs_is_another_request(server: ShoalServer) -> None:
    """Triton keys on the inputs alone; here the outputs asked for are part of the key."""
    http = httpclient.InferenceServerClient(server.url)
    before = _counts(server.url, "addsub")
    assert _addsub(http, httpclient, 7, ["OUTPUT0"]) == {"OUTPUT0": 8}
    assert _addsub(http, httpclient, 7, ["OUTPUT1"]) == {"OUTPUT1": 6}
    assert _addsub(http, httpclient, 7, ["OUTPUT1"]) == {"OUTPUT1": 6}
    after = _counts(server.url, "addsub")
    assert (after["executions"] - before["executions"], after["hit"] - before["hit"]) == (2, 1)


def test_a_model_that_does_not_enable_it_always_runs(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    before = _counts(server.url, "plain")
    for _ in range(2):
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        http.infer("plain", [inp])
    after = _counts(server.url, "plain")
    assert (after["executions"] - before["executions"], after["hit"], after["miss"]) == (2, 0, 0)


def test_the_least_recently_used_answer_leaves_a_full_cache(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)

    def big(value: float) -> None:
        inp = httpclient.InferInput("INPUT0", [1, 512], "FP32")
        inp.set_data_from_numpy(np.full((1, 512), value, dtype=np.float32))
        out = http.infer("big", [inp]).as_numpy("OUTPUT0")
        assert float(out[0, 0]) == value and out.shape == (1, 512)

    before = _counts(server.url, "big")
    for value in (1.0, 2.0, 1.0, 1.0):  # 2 takes 1's place; 1 runs again, then hits
        big(value)
    after = _counts(server.url, "big")
    assert (after["miss"] - before["miss"], after["hit"] - before["hit"]) == (3, 1)
    with urllib.request.urlopen(f"http://{server.url}/v2/shoal/frontend", timeout=5) as r:
        status = json.loads(r.read())
    assert status["response_cache_bytes"] == CACHE_BYTES
    assert status["response_cache_used_bytes"] <= CACHE_BYTES


def test_the_metrics_show_the_cache_per_model(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    _addsub(http, httpclient, 11)
    _addsub(http, httpclient, 11)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        text = r.read().decode()
    hits = _counts(server.url, "addsub")["hit"]
    assert f'nv_cache_num_hits_per_model{{model="addsub",version="1"}} {hits}' in text
    assert "# TYPE nv_cache_miss_duration_per_model counter" in text
    assert "# TYPE nv_cache_num_entries gauge" in text  # the cache as a whole
    assert 'nv_cache_miss_duration_per_model{model="big",version="1"}' in text
    assert (
        'model="plain"'
        not in text.split("# HELP nv_cache_num_hits_per_model")[1].split(
            "# HELP nv_inference_pending_request_count"
        )[0]
    )  # as in Triton: only for the models that enable the cache


def test_without_a_server_cache_the_models_config_changes_nothing(tmp_path: Path) -> None:
    write_identity(tmp_path, "cached", CACHED)
    with served(tmp_path) as srv:
        http = httpclient.InferenceServerClient(srv.url)
        for _ in range(2):
            inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            http.infer("cached", [inp])
        assert _counts(srv.url, "cached")["executions"] == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics") as r:
            assert "nv_cache_num_hits_per_model" not in r.read().decode()
