"""Dynamic batching, queue policies and instance groups, observed from outside through
Triton's statistics (as Triton's own QA does), with real processes and tritonclient."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal import modelgen
from tests.serverctl import ShoalServer


def _identity(repo: Path, name: str, extra: str, dims: str = "[ 4 ]", mbs: int = 8) -> None:
    modelgen.write_model(
        repo, name, modelgen.identity_model("FP32", [-1], batch=True),
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {mbs}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n{extra}',
    )  # fmt: skip


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("batching-repo")
    _identity(
        repo,
        "preferred6",
        "dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 5000000 }",
    )
    _identity(
        repo,
        "queue2",
        "dynamic_batching { max_queue_delay_microseconds: 1500000 "
        "default_queue_policy { max_queue_size: 2 } }",
    )
    _identity(
        repo,
        "timeout",
        "dynamic_batching { max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 200000 } }",
    )
    _identity(
        repo, "shapes", "dynamic_batching { max_queue_delay_microseconds: 1000000 }", dims="[ -1 ]"
    )
    _identity(repo, "nobatcher", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    _identity(repo, "auto_kind", "instance_group [ { kind: KIND_AUTO } ]")
    _identity(
        repo,
        "standby",
        "instance_group [ { count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_CPU passive: true } ]",
    )
    _identity(repo, "passive_only", "instance_group [ { kind: KIND_CPU passive: true } ]")
    _identity(
        repo,
        "ordered",
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        "dynamic_batching { preserve_ordering: true }",
    )
    srv = ShoalServer(repo)
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _infer(url: str, model: str, value: float, dims: int = 4) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    inp = httpclient.InferInput("INPUT0", [1, dims], "FP32")
    inp.set_data_from_numpy(np.full((1, dims), value, dtype=np.float32))
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def _stats(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return stats


def test_twelve_requests_preferred_six_make_two_executions(batching_server: ShoalServer) -> None:
    with ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(lambda i: _infer(batching_server.url, "preferred6", i), range(12)))
    assert [int(o[0, 0]) for o in outs] == list(range(12))  # each got its own rows back
    stats = _stats(batching_server.url, "preferred6")
    assert stats["execution_count"] == 2
    assert stats["inference_count"] == 12
    assert stats["inference_stats"]["success"]["count"] == 12
    assert stats["inference_stats"]["queue"]["count"] == 12
    assert [b["batch_size"] for b in stats["batch_stats"]] == [6]
    assert stats["batch_stats"][0]["compute_infer"]["count"] == 2
    assert stats["last_inference"] > 0


def test_full_queue_is_refused_with_503(batching_server: ShoalServer) -> None:
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(_infer, batching_server.url, "queue2", i) for i in range(2)]
        time.sleep(0.5)  # both queued: the batcher waits for its delay
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            _infer(batching_server.url, "queue2", 9)
        assert time.monotonic() - t0 < 1.0  # refused at once, not after the delay
        assert e.value.status() == "503"
        # Triton 2.51's words, request id included (none given here)
        assert e.value.message() == "[request id: <id_unknown>] Exceeds maximum queue size"
        assert [int(f.result()[0, 0]) for f in waiting] == [0, 1]
    stats = _stats(batching_server.url, "queue2")
    # Refused before the scheduler owned it: not a failure in Triton 2.51's statistics.
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["execution_count"] == 1  # the two queued ran together


def test_queue_timeout_rejects(batching_server: ShoalServer) -> None:
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        _infer(batching_server.url, "timeout", 1)
    assert time.monotonic() - t0 < 2.0
    assert e.value.status() == "503"
    assert e.value.message() == "Request timeout expired"


def test_queue_timeout_over_grpc_is_unavailable(batching_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{batching_server.grpc_port}")
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("timeout", [inp])
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == "Request timeout expired"


def test_different_shapes_run_in_separate_executions(batching_server: ShoalServer) -> None:
    """Two [1, 4] requests wait for the 1 s delay; the first [1, 7] cannot join them, so
    their batch goes at once (Triton's GetDynamicBatch), and the [1, 7]s make their own."""
    with ThreadPoolExecutor(4) as pool:
        fours = [pool.submit(_infer, batching_server.url, "shapes", i, 4) for i in range(2)]
        time.sleep(0.3)  # both queued, well inside the delay
        sevens = [pool.submit(_infer, batching_server.url, "shapes", i, 7) for i in range(2)]
        shapes = [j.result().shape for j in fours + sevens]
    assert shapes == [(1, 4), (1, 4), (1, 7), (1, 7)]
    stats = _stats(batching_server.url, "shapes")
    assert stats["inference_count"] == 4
    assert stats["execution_count"] == 2
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (2, 2)
    ]


def test_two_instances_both_receive_work(batching_server: ShoalServer) -> None:
    def cpu_ticks(pid: int) -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    with urllib.request.urlopen(
        f"http://{batching_server.url}/v2/shoal/models/nobatcher", timeout=5
    ) as r:
        info = json.loads(r.read())
    instances = info["versions"][0]["instances"]
    assert len(instances) == 2
    assert all(i["state"] == "READY" and i["cores"] for i in instances)
    before = {i["pid"]: cpu_ticks(i["pid"]) for i in instances}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _infer(batching_server.url, "nobatcher", i), range(400)))
    stats = _stats(batching_server.url, "nobatcher")
    assert stats["execution_count"] == 400  # no dynamic batching: one request per execution
    assert all(cpu_ticks(pid) > ticks for pid, ticks in before.items())


def test_stats_endpoints(batching_server: ShoalServer) -> None:
    with urllib.request.urlopen(f"http://{batching_server.url}/v2/models/stats", timeout=5) as r:
        every = json.loads(r.read())["model_stats"]
    assert {s["name"] for s in every} >= {"preferred6", "queue2", "nobatcher"}
    client = httpclient.InferenceServerClient(batching_server.url)
    assert len(client.get_inference_statistics("preferred6")["model_stats"]) == 1
    with pytest.raises(InferenceServerException, match="requested model 'nope' is not available"):
        client.get_inference_statistics("nope")
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{batching_server.grpc_port}")
    gstats = grpc_client.get_inference_statistics("preferred6").model_stats[0]
    assert gstats.execution_count >= 2
    assert gstats.inference_stats.success.count >= 12


def test_kind_auto_falls_back_to_cpu(batching_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(batching_server.url)
    assert client.get_model_config("auto_kind")["instance_group"][0]["kind"] == "KIND_CPU"
    assert int(_infer(batching_server.url, "auto_kind", 3)[0, 0]) == 3


def test_kind_gpu_without_a_gpu_fails_to_load_clearly(tmp_path: Path) -> None:
    _identity(tmp_path, "wants_gpu", "instance_group [ { kind: KIND_GPU } ]")
    srv = ShoalServer(tmp_path, wait_ready=False)
    try:
        assert srv.proc.wait(60) != 0
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)
    assert "wants_gpu" in srv.log()
    assert "GPU" in srv.log()


def _instances(url: str, model: str) -> list[dict]:
    with urllib.request.urlopen(f"http://{url}/v2/shoal/models/{model}", timeout=5) as r:
        return list(json.loads(r.read())["versions"][0]["instances"])


def test_preserve_ordering_holds_a_later_answer_until_the_earlier_one(
    batching_server: ShoalServer,
) -> None:
    import os
    import signal
    import threading

    url = batching_server.url
    pids = [i["pid"] for i in _instances(url, "ordered")]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    finished: list[str] = []

    def call(tag: str, value: float) -> None:
        _infer(url, "ordered", value)
        finished.append(tag)

    try:
        first = threading.Thread(target=call, args=("A", 1))
        first.start()
        deadline = time.monotonic() + 30
        while not any(i["busy"] for i in _instances(url, "ordered")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        holder_a = next(i["pid"] for i in _instances(url, "ordered") if i["busy"])
        second = threading.Thread(target=call, args=("B", 2))
        second.start()
        while not all(i["busy"] for i in _instances(url, "ordered")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        holder_b = next(p for p in pids if p != holder_a)
        os.kill(holder_b, signal.SIGCONT)  # B is computed first ...
        time.sleep(0.7)
        assert finished == []  # ... but held back while A is unanswered
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    first.join(20)
    second.join(20)
    # Both answers leave together once A is done; which client thread wakes first is
    # the OS's business, so only completion is checked here (the hold is the point).
    assert sorted(finished) == ["A", "B"]


def test_passive_instances_load_and_are_never_sent_requests(batching_server: ShoalServer) -> None:
    instances = _instances(batching_server.url, "standby")
    assert [(i["state"], i["passive"]) for i in instances] == [("READY", False), ("READY", True)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _infer(batching_server.url, "standby", i), range(64)))
    assert _stats(batching_server.url, "standby")["execution_count"] == 64
    # A model of passive instances only would queue forever on Triton: refused at once.
    client = httpclient.InferenceServerClient(batching_server.url)
    assert client.is_model_ready("passive_only")
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("passive_only", [inp])
    assert (e.value.status(), e.value.message()) == (
        "503",
        "model 'passive_only' version 1 has only passive instances, which are never sent requests",
    )
