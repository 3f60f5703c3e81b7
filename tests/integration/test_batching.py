"""Dynamic batching, queue policies and instance groups, observed from outside through
Triton's statistics (as Triton's own QA does), with real processes and tritonclient."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.repos import infer_identity, write_identity
from tests.serverctl import ShoalServer
from tools import modelgen


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("batching-repo")
    write_identity(
        repo,
        "preferred6",
        "dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 5000000 }",
    )
    write_identity(
        repo,
        "queue2",
        "dynamic_batching { max_queue_delay_microseconds: 1500000 "
        "default_queue_policy { max_queue_size: 2 } }",
    )
    write_identity(
        repo,
        "timeout",
        "dynamic_batching { max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 200000 } }",
    )
    write_identity(
        repo, "shapes", "dynamic_batching { max_queue_delay_microseconds: 1000000 }", dims="[ -1 ]"
    )
    write_identity(repo, "nobatcher", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    write_identity(repo, "auto_kind", "instance_group [ { kind: KIND_AUTO } ]")
    write_identity(
        repo,
        "standby",
        "instance_group [ { count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_CPU passive: true } ]",
    )
    write_identity(repo, "passive_only", "instance_group [ { kind: KIND_CPU passive: true } ]")
    write_identity(
        repo,
        "ordered",
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        "dynamic_batching { preserve_ordering: true }",
    )
    write_identity(  # one test only: new to the frontend; batches shared as often as can be
        repo,
        "ordered_stream",
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        "dynamic_batching { preserve_ordering: true max_queue_delay_microseconds: 500 }\n"
        'parameters { key: "shoal_share_min_compute_us" value { string_value: "0" } }',
    )
    modelgen.write_model(
        repo, "priority2", _batch_sum_model(),
        'name: "priority2"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 2\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    )  # fmt: skip
    modelgen.write_model(
        repo, "shared", _batch_sum_model(),
        'name: "shared"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        "dynamic_batching { max_queue_delay_microseconds: 2000000 }\n"
        # shared even though it computes in microseconds (by default a part must be
        # expected to take 1 ms)
        'parameters { key: "shoal_share_min_compute_us" value { string_value: "0" } }',
    )  # fmt: skip
    write_identity(
        repo,
        "override",
        "dynamic_batching { default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 20000000 allow_timeout_override: true } }",
        mbs=1,
    )
    srv = ShoalServer(repo)
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _stats(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        (stats,) = json.loads(r.read())["model_stats"]
    return stats


def test_twelve_requests_preferred_six_make_two_executions(batching_server: ShoalServer) -> None:
    with ThreadPoolExecutor(12) as pool:
        outs = list(
            pool.map(lambda i: infer_identity(batching_server.url, "preferred6", i), range(12))
        )
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
        waiting = [pool.submit(infer_identity, batching_server.url, "queue2", i) for i in range(2)]
        time.sleep(0.5)  # both queued: the batcher waits for its delay
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            infer_identity(batching_server.url, "queue2", 9)
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
        infer_identity(batching_server.url, "timeout", 1)
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
        fours = [pool.submit(infer_identity, batching_server.url, "shapes", i, 4) for i in range(2)]
        time.sleep(0.3)  # both queued, well inside the delay
        sevens = [
            pool.submit(infer_identity, batching_server.url, "shapes", i, 7) for i in range(2)
        ]
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
    assert [i["gpu"] for i in instances] == [None, None]  # CPU instances
    before = {i["pid"]: cpu_ticks(i["pid"]) for i in instances}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: infer_identity(batching_server.url, "nobatcher", i), range(400)))
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
    assert int(infer_identity(batching_server.url, "auto_kind", 3)[0, 0]) == 3


def test_kind_gpu_without_a_gpu_fails_to_load_clearly(tmp_path: Path) -> None:
    write_identity(tmp_path, "wants_gpu", "instance_group [ { kind: KIND_GPU } ]")
    srv = ShoalServer(tmp_path, wait_ready=False)
    try:
        assert srv.proc.wait(60) != 0
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)
    assert "wants_gpu" in srv.log()
    assert "GPU" in srv.log()


def _version(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/shoal/models/{model}", timeout=5) as r:
        return dict(json.loads(r.read())["versions"][0])


def _instances(url: str, model: str) -> list[dict]:
    return list(_version(url, model)["instances"])


def _wait_queued(url: str, model: str, count: int) -> None:
    """Until ``count`` requests wait in the model's queue (the broker has them)."""
    deadline = time.monotonic() + 30
    while _version(url, model)["queued"] < count:
        assert time.monotonic() < deadline, f"{model}: never {count} request(s) queued"
        time.sleep(0.02)


def test_preserve_ordering_holds_a_later_answer_until_the_earlier_one(
    batching_server: ShoalServer,
) -> None:
    url = batching_server.url
    pids = [i["pid"] for i in _instances(url, "ordered")]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    finished: list[str] = []

    def call(tag: str, value: float) -> None:
        infer_identity(url, "ordered", value)
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


def test_a_stream_is_answered_in_the_order_it_sent_with_preserve_ordering(
    batching_server: ShoalServer,
) -> None:
    """Triton reads a stream's requests into the scheduler one after the other, so
    preserve_ordering answers them in the order they were sent, whichever of two
    instances ran them, batched or shared. The model is new to the frontend, so the
    first requests also wait for its lookup (tests/unit/frontend/test_grpc_stream.py
    holds that wait open on purpose)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{batching_server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    n = 200
    try:
        for i in range(n):
            inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.full((1, 4), i, dtype=np.float32))
            client.async_stream_infer("ordered_stream", [inp], request_id=str(i))
        got = [answers.get(timeout=30) for _ in range(n)]
    finally:
        client.stop_stream()
        client.close()
    assert not [r for r in got if isinstance(r, Exception)]
    assert [r.get_response().id for r in got] == [str(i) for i in range(n)]
    assert [int(r.as_numpy("OUTPUT0")[0, 0]) for r in got] == list(range(n))


def test_passive_instances_load_and_are_never_sent_requests(batching_server: ShoalServer) -> None:
    instances = _instances(batching_server.url, "standby")
    assert [(i["state"], i["passive"]) for i in instances] == [("READY", False), ("READY", True)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: infer_identity(batching_server.url, "standby", i), range(64)))
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


def _wait_busy(url: str, model: str, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while sum(i["busy"] for i in _instances(url, model)) < count:
        assert time.monotonic() < deadline, f"{model}: never {count} instance(s) busy"
        time.sleep(0.02)


def _wait_ready(url: str, model: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/models/{model}/ready", timeout=5):
                return
        except OSError:
            assert time.monotonic() < deadline, f"{model} never became ready again"
            time.sleep(0.1)


def _batch_sum_model() -> bytes:
    """OUTPUT0 = INPUT0 + the sum of INPUT0 over the batch: each answer tells which
    requests shared its execution."""
    from onnx import TensorProto, checker, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["INPUT0", "axes"], ["S"], keepdims=1),
            helper.make_node("Add", ["INPUT0", "S"], ["OUTPUT0"]),
        ],
        "batch_sum",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, 1])],
        initializer=[axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelgen.OPSET)])
    model.ir_version = modelgen.IR_VERSION
    checker.check_model(model)
    return bytes(model.SerializeToString())


def test_the_priority_parameter_jumps_the_queue(batching_server: ShoalServer) -> None:
    """Triton's priority levels end to end. With the one instance busy, two requests at
    the default level (2) queue, then one with the request parameter priority 1. The
    next batch (max_batch_size 2) takes the high-priority request and the oldest other
    one; the model adds the batch's sum to each input, so every answer tells its
    batch-mates."""
    url = batching_server.url
    worker = batching_server.worker_pid("priority2")
    answers: dict[str, float] = {}

    def call(tag: str, value: float, priority: int, proto: str) -> None:
        mod: Any = httpclient if proto == "http" else grpcclient
        client = (
            httpclient.InferenceServerClient(url, network_timeout=60)
            if proto == "http"
            else grpcclient.InferenceServerClient(f"127.0.0.1:{batching_server.grpc_port}")
        )
        inp = mod.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
        try:
            out = client.infer("priority2", [inp], priority=priority).as_numpy("OUTPUT0")
        finally:
            client.close()
        answers[tag] = float(out[0, 0])

    os.kill(worker, signal.SIGSTOP)
    threads = []
    try:
        for tag, value, priority, proto in (
            ("first", 1000.0, 0, "http"),  # 0: the default level; the stopped instance takes it
            ("low-1", 1.0, 2, "http"),
            ("low-2", 10.0, 0, "grpc"),
            ("high", 100.0, 1, "grpc"),
        ):
            threads.append(threading.Thread(target=call, args=(tag, value, priority, proto)))
            threads[-1].start()
            if tag == "first":
                _wait_busy(url, "priority2")
            else:
                _wait_queued(url, "priority2", len(threads) - 1)  # arrival order
    finally:
        os.kill(worker, signal.SIGCONT)
    for t in threads:
        t.join(60)
    assert answers == {
        "first": 2000.0,  # alone
        "high": 201.0,  # with low-1, the oldest of the default level
        "low-1": 102.0,
        "low-2": 20.0,  # alone, last
    }


def test_a_batch_that_goes_for_its_delay_is_shared_by_the_idle_instances(
    batching_server: ShoalServer,
) -> None:
    """Six requests wait out the 2 s delay with both instances idle. Triton would run all
    six on one instance and leave the other idle; shoal gives each instance three. The
    model adds the batch's sum to each input, so every answer tells its batch-mates."""
    url = batching_server.url
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]  # any three of them have a sum of their own

    def call(value: float) -> float:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        inp = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
        try:
            return float(client.infer("shared", [inp]).as_numpy("OUTPUT0")[0, 0])
        finally:
            client.close()

    with ThreadPoolExecutor(6) as pool:
        jobs = [pool.submit(call, v) for v in values]
        _wait_queued(url, "shared", 6)  # all six inside the delay: they form one batch
        answers = [j.result(60) for j in jobs]
    batch_sums = [a - v for a, v in zip(answers, values, strict=True)]
    together: dict[float, list[float]] = {}
    for value, total in zip(values, batch_sums, strict=True):
        together.setdefault(total, []).append(value)
    assert sorted(len(batch) for batch in together.values()) == [3, 3]
    assert all(sum(batch) == total for total, batch in together.items())
    stats = _stats(url, "shared")
    assert stats["execution_count"] == 2
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (3, 2)
    ]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_a_request_timeout_overrides_the_queue_policy(
    batching_server: ShoalServer, proto: str
) -> None:
    """allow_timeout_override: the request's own 'timeout' parameter (µs) replaces the
    policy's 20 s; the request expires in the queue with Triton's answer while the
    instance is busy, and a request without one keeps waiting and succeeds."""
    url = batching_server.url
    worker = batching_server.worker_pid("override")
    waiting: list[object] = []

    def plain() -> None:
        waiting.append(infer_identity(url, "override", 5)[0, 0])

    os.kill(worker, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=plain)]
        threads[0].start()  # taken by the stopped instance
        _wait_busy(url, "override")
        threads.append(threading.Thread(target=plain))  # queued, the policy's 20 s
        threads[1].start()
        _wait_queued(url, "override", 1)
        t0 = time.monotonic()
        if proto == "http":
            client: Any = httpclient.InferenceServerClient(url, network_timeout=30)
            inp: Any = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{batching_server.grpc_port}")
            inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("override", [inp], timeout=200_000)
        waited = time.monotonic() - t0
        assert e.value.message() == "Request timeout expired"
        assert e.value.status() in ("503", "StatusCode.UNAVAILABLE")
        assert 0.15 < waited < 5.0
        assert waiting == []  # the others are still held
    finally:
        os.kill(worker, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert waiting == [5.0, 5.0]


def test_preserve_ordering_releases_later_answers_when_the_earlier_instance_dies(
    batching_server: ShoalServer,
) -> None:
    """A later answer held for an earlier request is released when that request fails
    instead: the instance running it is killed; the client gets Triton's 503 for it and
    the later answer right after, in order; the instance then comes back."""
    url = batching_server.url
    pids = [i["pid"] for i in _instances(url, "ordered")]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    outcomes: dict[str, object] = {}

    def call(tag: str, value: float) -> None:
        try:
            outcomes[tag] = float(infer_identity(url, "ordered", value)[0, 0])
        except InferenceServerException as exc:
            outcomes[tag] = exc

    first = threading.Thread(target=call, args=("A", 1))
    second = threading.Thread(target=call, args=("B", 2))
    holder_a = 0
    try:
        first.start()
        _wait_busy(url, "ordered")
        holder_a = next(i["pid"] for i in _instances(url, "ordered") if i["busy"])
        second.start()
        _wait_busy(url, "ordered", 2)
        holder_b = next(p for p in pids if p != holder_a)
        os.kill(holder_b, signal.SIGCONT)  # B is computed first, and held
        time.sleep(0.5)
        assert outcomes == {}
        os.kill(holder_a, signal.SIGKILL)  # A's instance dies with A
    finally:
        for pid in pids:  # nothing stays stopped, whatever failed above
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    first.join(30)
    second.join(30)
    assert outcomes["B"] == 2.0
    a = outcomes["A"]
    assert isinstance(a, InferenceServerException)
    assert a.status() == "503"
    assert "exited" in (a.message() or "")
    _wait_ready(url, "ordered")
    deadline = time.monotonic() + 60
    while len({i["pid"] for i in _instances(url, "ordered")} - {holder_a}) < 2:
        assert time.monotonic() < deadline, "the killed instance was not restarted"
        time.sleep(0.1)
    assert float(infer_identity(url, "ordered", 3)[0, 0]) == 3.0
