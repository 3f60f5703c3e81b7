"""Triton's ensembles end to end: a frontend runs the steps as requests to the composing
models, through the real broker and workers; tritonclient over HTTP and gRPC, its
shared-memory utilities, and the repository index for the ensembles that cannot load.

The composing model is ``simple`` (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1).
``ens`` runs it twice: SUM, DIFF = simple(IN0, IN1); OUT, OUT2 = simple(SUM, DIFF), so
OUT = 2 x IN0 and OUT2 = 2 x IN1, and SUM is both an output and a later step's input."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.repos import write_identity
from tests.serverctl import ShoalServer, served
from tools import modelgen

_IO = '{{ name: "{0}" data_type: {1} dims: [ {2} ] }}'


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def _ensemble(
    repo: Path,
    name: str,
    steps: list[str],
    inputs: tuple[str, ...] = ("IN0", "IN1"),
    outputs: tuple[str, ...] = ("SUM", "OUT", "OUT2"),
    dims: str = "16",
    dtype: str = "TYPE_INT32",
    mbs: int = 8,
    scheduling: str = "",
    out: tuple[str, str] = ("TYPE_INT32", "16"),  # the outputs' data type and dims
) -> None:
    (repo / name / "1").mkdir(parents=True)
    ins = ", ".join(_IO.format(n, dtype, dims) for n in inputs)
    outs = ", ".join(_IO.format(n, *out) for n in outputs)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\n'
        f"input [ {ins} ]\noutput [ {outs} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] {scheduling} }}\n"
    )


_TWICE = [
    _step("simple", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
    _step("simple", {"INPUT0": "SUM", "INPUT1": "DIFF"}, {"OUTPUT0": "OUT", "OUTPUT1": "OUT2"}),
]


_ONCE = _step("simple", {"INPUT0": "IN0", "INPUT1": "IN1"}, {"OUTPUT0": "SUM"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("ensemble-repo")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    _ensemble(repo, "ens", _TWICE)
    # dims [-1]: any length passes the ensemble's checks, and simple's refuse what it is not
    _ensemble(repo, "ens_var", _TWICE, dims="-1")
    nested = _step("ens", {"IN0": "A", "IN1": "B"}, {"OUT": "X", "OUT2": "Y"})
    _ensemble(repo, "ens_nested", [nested], inputs=("A", "B"), outputs=("X", "Y"))
    # those that cannot load, each for its own reason
    _ensemble(repo, "ens_missing", [_ONCE.replace('"simple"', '"nope"')], outputs=("SUM",))
    wrong = _ONCE.replace('"INPUT1"', '"INPUTX"')
    _ensemble(repo, "ens_bad_map", [wrong], outputs=("SUM",))
    _ensemble(repo, "ens_type", [_ONCE], outputs=("SUM",), dtype="TYPE_FP32")
    _ensemble(repo, "ens_unwritten", [_ONCE], outputs=("SUM", "NEVER"))
    write_identity(repo, "big", dims="[ 8192 ]")  # 32 KiB a request: in the frontend's slab
    through = [
        _step("big", {"INPUT0": "X"}, {"OUTPUT0": "MID"}),
        _step("big", {"INPUT0": "MID"}, {"OUTPUT0": "Y"}),
    ]
    big = ("TYPE_FP32", "8192")
    _ensemble(repo, "ens_big", through, ("X",), ("Y",), "8192", "TYPE_FP32", out=big)
    serial = "max_inflight_requests: 1"
    _ensemble(repo, "ens_serial", [_ONCE], outputs=("SUM",), scheduling=serial)
    loop_a = _step("ens_loop_b", {"IN0": "IN0", "IN1": "IN1"}, {"SUM": "SUM"})
    loop_b = _step("ens_loop_a", {"IN0": "IN0", "IN1": "IN1"}, {"SUM": "SUM"})
    _ensemble(repo, "ens_loop_a", [loop_a], outputs=("SUM",))
    _ensemble(repo, "ens_loop_b", [loop_b], outputs=("SUM",))
    with served(
        repo, "--exit-on-error=false", "--strict-readiness=false", "--allow-client-shm=true"
    ) as srv:
        srv.wait_settled(("ens", "ens_nested", "ens_missing", "ens_loop_a", "ens_big"))
        yield srv


def _inputs(
    protocol: Any, a: np.ndarray, b: np.ndarray, names: tuple[str, str] = ("IN0", "IN1")
) -> list:
    out = []
    for name, value in zip(names, (a, b), strict=True):
        t = protocol.InferInput(name, list(value.shape), "INT32")
        t.set_data_from_numpy(value)
        out.append(t)
    return out


def _stats(server: ShoalServer, model: str) -> dict:
    status, body = server.http(f"/v2/models/{model}/stats")
    assert status == 200, body
    return dict(json.loads(body)["model_stats"][0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_steps_run_in_order_and_feed_each_other(server: ShoalServer, protocol: str) -> None:
    url, client_mod = server.client(protocol)
    client = client_mod.InferenceServerClient(url)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, np.int32)
    before_ens, before_simple = _stats(server, "ens"), _stats(server, "simple")
    result = client.infer("ens", _inputs(client_mod, a, b))
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUT"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("OUT2"), 2 * b)
    ens, simple = _stats(server, "ens"), _stats(server, "simple")
    # the ensemble counts the request once (its batch of 2); its model, each step
    assert (
        ens["inference_stats"]["success"]["count"]
        - before_ens["inference_stats"]["success"]["count"]
        == 1
    )
    assert ens["inference_count"] - before_ens["inference_count"] == 2
    assert (
        simple["inference_stats"]["success"]["count"]
        - before_simple["inference_stats"]["success"]["count"]
        == 2
    )


def test_only_the_steps_a_requested_output_needs_run(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    before = _stats(server, "simple")["inference_stats"]["success"]["count"]
    a, b = np.ones((1, 16), np.int32), np.full((1, 16), 5, np.int32)
    result = client.infer(
        "ens", _inputs(httpclient, a, b), outputs=[httpclient.InferRequestedOutput("SUM")]
    )
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    assert result.as_numpy("OUT") is None
    assert _stats(server, "simple")["inference_stats"]["success"]["count"] - before == 1


def test_an_ensemble_of_ensembles(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    a, b = np.full((1, 16), 7, np.int32), np.full((1, 16), 2, np.int32)
    result = client.infer("ens_nested", _inputs(grpcclient, a, b, ("A", "B")))
    np.testing.assert_array_equal(result.as_numpy("X"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("Y"), 2 * b)


def _failures(port: int, model: str, reason: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        page = r.read().decode()
    for family in text_string_to_metric_families(page):
        if family.name == "nv_inference_request_failure":
            for sample in family.samples:
                if sample.labels.get("model") == model and sample.labels.get("reason") == reason:
                    return sample.value
    return 0.0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_step_fails_the_request_in_tritons_words(
    server: ShoalServer, protocol: str
) -> None:
    url, client_mod = server.client(protocol)
    client = client_mod.InferenceServerClient(url)
    before = _stats(server, "ens_var")["inference_stats"]["fail"]["count"]
    short = np.ones((1, 8), np.int32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("ens_var", _inputs(client_mod, short, short))
    assert err.value.message() == (
        "in ensemble 'ens_var', [request id: <id_unknown>] unexpected shape for input 'INPUT1' "
        "for model 'simple'. Expected [-1,16], got [1,8]. NOTE: Setting a non-zero "
        "max_batch_size in the model config requires a batch dimension to be prepended to "
        "each input shape. If you want to specify the full shape including the batch dim in "
        "your input dims config, try setting max_batch_size to zero. See the model "
        "configuration docs for more info on max_batch_size."
    )
    assert err.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert _stats(server, "ens_var")["inference_stats"]["fail"]["count"] - before == 1
    # in the metrics (refreshed every 2 s), an ensemble's failure's reason is OTHER
    deadline = time.monotonic() + 10
    while _failures(server.metrics_port, "ens_var", "OTHER") != before + 1:
        assert time.monotonic() < deadline, "the failure never reached the metrics"
        time.sleep(0.1)


def test_the_ensembles_own_checks_come_first(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    short = np.ones((1, 8), np.int32)
    with pytest.raises(
        InferenceServerException, match=r"unexpected shape for input 'IN1' for model 'ens'"
    ):
        client.infer("ens", _inputs(httpclient, short, short))
    before = _stats(server, "ens")["inference_stats"]["fail"]["count"]
    assert before == 0  # refused before any step: no failure, as in Triton


def test_the_ensembles_that_cannot_load_say_why(server: ShoalServer) -> None:
    index = {
        e["name"]: e
        for e in httpclient.InferenceServerClient(server.url).get_model_repository_index()
    }
    reasons = {
        n: e.get("reason", "")
        for n, e in index.items()
        if n.startswith("ens_") and e.get("state") != "READY"
    }
    loop = "circular dependency between ensembles: "
    assert reasons == {
        "ens_missing": (
            "ensemble ens_missing contains models that are not available or ambiguous: nope"
        ),
        "ens_bad_map": (
            "in ensemble ens_bad_map, ensemble tensor IN1 is mapping to non-existing input "
            "INPUTX in model simple"
        ),
        "ens_type": (
            "in ensemble ens_type, ensemble tensor IN0: inconsistent data type: TYPE_FP32 is "
            "inferred from model ens_type while TYPE_INT32 is inferred from model simple"
        ),
        "ens_unwritten": "ensemble output 'NEVER' for ensemble ens_unwritten' is not used",
        "ens_loop_a": loop + "ens_loop_a -> ... -> ens_loop_b -> ens_loop_a",
        "ens_loop_b": loop + "ens_loop_b -> ... -> ens_loop_a -> ens_loop_b",
    }
    assert index["ens"]["state"] == "READY" and index["ens_nested"]["state"] == "READY"
    meta = httpclient.InferenceServerClient(server.url).get_model_metadata("ens")
    assert meta["platform"] == "ensemble"
    assert [i["shape"] for i in meta["inputs"]] == [[-1, 16], [-1, 16]]


def test_client_shared_memory_flows_through_the_steps(server: ShoalServer) -> None:
    """Inputs in a client region reach the first step as references; an output asked
    into a region is written there by the step that makes it. One a later step reads
    cannot go to a region (the frontend never reads one)."""
    client = httpclient.InferenceServerClient(server.url)
    tag = uuid.uuid4().hex[:8]
    nbytes = 16 * 4
    regions = []
    try:
        for name in ("in", "out"):
            key = f"/shoal_ens_{name}_{tag}"
            handle = shm.create_shared_memory_region(f"{name}_{tag}", key, 2 * nbytes)
            regions.append(handle)
            client.register_system_shared_memory(f"{name}_{tag}", key, 2 * nbytes)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 4, np.int32)
        shm.set_shared_memory_region(regions[0], [a, b])
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("IN0", "IN1")]
        inputs[0].set_shared_memory(f"in_{tag}", nbytes)
        inputs[1].set_shared_memory(f"in_{tag}", nbytes, offset=nbytes)
        out = httpclient.InferRequestedOutput("OUT2", binary_data=True)
        out.set_shared_memory(f"out_{tag}", nbytes)
        result = client.infer("ens", inputs, outputs=[out])
        # written into the region: the answer names it, with no data
        assert result.get_output("OUT2") == {"name": "OUT2", "datatype": "INT32", "shape": [1, 16]}
        got = shm.get_contents_as_numpy(regions[1], np.int32, [1, 16])
        np.testing.assert_array_equal(got, 2 * b)
        summed = httpclient.InferRequestedOutput("SUM", binary_data=True)
        summed.set_shared_memory(f"out_{tag}", nbytes)
        with pytest.raises(InferenceServerException) as err:
            client.infer("ens", inputs, outputs=[summed, httpclient.InferRequestedOutput("OUT")])
        assert err.value.status() == "501"
        assert "output 'SUM' of ensemble 'ens' is read by a later step" in err.value.message()
    finally:
        client.unregister_system_shared_memory()
        for handle in regions:
            shm.destroy_shared_memory_region(handle)


def test_max_inflight_requests_holds_a_step_at_its_bound(server: ShoalServer) -> None:
    """ens_serial's one step may have one request running: with simple's worker stopped,
    a second ensemble request waits in the frontend, never queued at simple."""
    pid = server.worker_pid("simple")
    a = np.ones((1, 16), np.int32)
    results: list[np.ndarray] = []

    def call() -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        results.append(client.infer("ens_serial", _inputs(httpclient, a, a)).as_numpy("SUM"))
        client.close()

    os.kill(pid, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        _until(lambda: any(i["busy"] for i in server.model_version("simple")["instances"]))
        time.sleep(0.3)  # time enough for the second to be queued, were it sent
        assert server.model_version("simple")["queued"] == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert len(results) == 2
    for r in results:
        np.testing.assert_array_equal(r, 2 * a)


def _until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.02)


def test_large_intermediate_tensors_pass_between_steps_by_reference(server: ShoalServer) -> None:
    """32 KiB tensors travel in the frontend's slab: the second step reads the first
    one's output where its answer left it."""
    client = httpclient.InferenceServerClient(server.url)
    data = np.random.default_rng(5).standard_normal((2, 8192)).astype(np.float32)
    x = httpclient.InferInput("X", [2, 8192], "FP32")
    x.set_data_from_numpy(data)
    for _ in range(3):
        np.testing.assert_array_equal(client.infer("ens_big", [x]).as_numpy("Y"), data)
