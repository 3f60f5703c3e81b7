"""Explicit model control (``--model-control-mode=explicit``): Triton's repository
extension loads, reloads and unloads models while the server runs, driven by tritonclient
over HTTP and gRPC, and by the checks of Triton's own example clients
(``simple_{http,grpc}_model_control.py``).

One server serves the module; each test starts from ``simple`` loaded from its config
file and every other model unloaded, and puts it back so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.repos import SIMPLE_ENSEMBLE
from tests.serverctl import ShoalServer, processes_with, served
from tools import modelgen

POLL_FAILED = "failed to poll from model repository"
OTHERS = ("mlp", "outer", "ens", "slow", "broken", "uploaded", "simple_sequence")
# an ensemble of the ensemble ``ens``
OUTER = (
    SIMPLE_ENSEMBLE.replace('model_name: "simple"', 'model_name: "ens"')
    .replace(
        'key: "INPUT0" value: "IN0" } input_map { key: "INPUT1"',
        'key: "IN0" value: "IN0" } input_map { key: "IN1"',
    )
    .replace('key: "OUTPUT0" value: "OUT"', 'key: "OUT" value: "OUT"')
)

SLOW = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("model-control")
    modelgen.write_shipped_repository(repo, ("simple", "mlp", "simple_sequence"))
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(SIMPLE_ENSEMBLE)
    (repo / "outer" / "1").mkdir(parents=True)
    (repo / "outer" / "config.pbtxt").write_text(OUTER)
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "1" / "model.py").write_text(SLOW)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    # a config that reads, and a model file that does not: its instance fails to load
    shutil.copytree(repo / "simple", repo / "broken")
    config = (repo / "simple" / "config.pbtxt").read_text().replace('"simple"', '"broken"')
    (repo / "broken" / "config.pbtxt").write_text(config)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with served(repo, "--model-control-mode=explicit", "--load-model=simple") as srv:
        yield srv


@pytest.fixture(autouse=True)
def baseline(server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    for name in OTHERS:
        client.unload_model(name)
    _modify(server, "simple", "config.pbtxt")  # (else a load keeps a config a test gave)
    client.load_model("simple")  # from its config file again
    assert client.is_server_ready()
    # the instances it replaced have stopped
    _until(lambda: len(_workers(server, "simple")) == 1)


def _infer_simple(client: object, module: object, model: str = "simple") -> np.ndarray:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for i in inputs:
        i.set_data_from_numpy(a)
    return client.infer(model, inputs).as_numpy("OUTPUT0")  # type: ignore[attr-defined,no-any-return]


def _workers(server: ShoalServer, model: str) -> set[int]:
    return {
        pid
        for pid, cmd in processes_with(server.runtime_dir).items()
        if "-m shoal.workers " in cmd and f"--model {model} " in cmd
    }


def _modify(server: ShoalServer, model: str, part: str) -> None:
    """A change to ``part`` of the model's folder (a version, its config), newer than any
    before: as in Triton, a load reloads what changed and leaves what did not (and keeps
    the config a load gave while no file is newer)."""
    path = Path(server.repo) / model / part
    if path.is_dir():
        (path / "changed").write_text("changed")
    else:
        os.utime(path)  # (now: later than the last load read it)


def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_at_start_the_named_model_loads_and_the_index_lists_the_others_by_name(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    index = baseline.get_model_repository_index()
    assert index == [
        {"name": "broken"},
        {"name": "ens"},
        {"name": "mlp"},
        {"name": "outer"},
        {"name": "simple", "version": "1", "state": "READY"},
        {"name": "simple_sequence"},
        {"name": "slow"},
    ]
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert grpc.get_model_repository_index(as_json=True)["models"] == index
    assert server.http("/v2/repository/index", b'{"ready":true}')[1] == (
        b'[{"name":"simple","version":"1","state":"READY"}]'
    )
    assert not _workers(server, "mlp")
    with pytest.raises(InferenceServerException) as e:
        baseline.get_model_metadata("mlp")
    assert "Request for unknown model: 'mlp' is not found" in e.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_serves_and_unload_stops_its_workers(server: ShoalServer, protocol: str) -> None:
    url, module = server.client(protocol)
    client = module.InferenceServerClient(url)
    client.load_model("mlp")
    assert client.is_model_ready("mlp")
    (pid,) = _workers(server, "mlp")
    x = np.ones((1, 256), dtype=np.float32)
    inp = module.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(x)
    assert client.infer("mlp", [inp]).as_numpy("OUTPUT0").shape == (1, 256)
    client.unload_model("mlp")  # answered once its worker has stopped
    assert not _workers(server, "mlp")
    assert not client.is_model_ready("mlp")
    assert client.is_server_ready()  # an unloaded model does not count against it
    with pytest.raises(InferenceServerException) as e:
        client.infer("mlp", [inp])
    assert "Request for unknown model: 'mlp' has no available versions" in e.value.message()
    index = httpclient.InferenceServerClient(server.url).get_model_repository_index()
    (entry,) = [e for e in index if e["name"] == "mlp"]
    assert entry == {"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert "worker mlp/1 mlp_0_0 stopped: its model was unloaded or reloaded" in server.log()
    assert pid not in processes_with(server.runtime_dir)


def test_a_config_override_replaces_the_config_file_until_the_file_changes(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    """As in Triton (L0_lifecycle test_config_override): a load that gives no config
    keeps the one an earlier load gave while none of the model's files is newer."""
    baseline.load_model("simple", config=json.dumps({"max_batch_size": "16"}))
    assert baseline.get_model_config("simple")["max_batch_size"] == 16
    # completed as at start: the inputs and outputs come from the model itself
    assert [i["name"] for i in baseline.get_model_config("simple")["input"]] == [
        "INPUT0",
        "INPUT1",
    ]
    np.testing.assert_array_equal(_infer_simple(baseline, httpclient), 2 * np.arange(16)[None])
    baseline.load_model("simple")  # no file changed since: the model is left as it is
    assert baseline.get_model_config("simple")["max_batch_size"] == 16
    _modify(server, "simple", "config.pbtxt")
    baseline.load_model("simple")
    assert baseline.get_model_config("simple")["max_batch_size"] == 8


def test_a_reload_keeps_serving_every_request(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    """Zero downtime: the new instances load beside the old ones, which retire only
    once the new ones are READY, and run what they were given."""
    (old,) = _workers(server, "simple")
    stop = threading.Event()
    errors: list[str] = []
    done = [0]

    def hammer() -> None:
        client = httpclient.InferenceServerClient(server.url)
        while not stop.is_set():
            try:
                _infer_simple(client, httpclient)
                done[0] += 1
            except InferenceServerException as exc:
                errors.append(exc.message())

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for batch in (4, 2, 8):
            # requests wait in the dynamic batcher (20 ms) as the copies change over
            batching = {"max_queue_delay_microseconds": 20000}
            config = {"max_batch_size": batch, "dynamic_batching": batching}
            baseline.load_model("simple", config=json.dumps(config))
            assert baseline.get_model_config("simple")["max_batch_size"] == batch
        _modify(server, "simple", "config.pbtxt")
        baseline.load_model("simple")  # from its file again
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert done[0] > 0
    _until(lambda: len(_workers(server, "simple")) == 1)  # the replaced ones retire
    assert old not in _workers(server, "simple")


def test_a_failed_reload_leaves_the_loaded_version_serving(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    before = _workers(server, "simple")
    wrong = {"input": [{"name": "WRONG", "data_type": "TYPE_INT32", "dims": [16]}]}
    with pytest.raises(InferenceServerException) as e:
        baseline.load_model("simple", config=json.dumps(wrong))
    assert e.value.status() == "400"
    message = e.value.message()
    assert message.startswith("load failed for model 'simple': version 1 is at UNAVAILABLE state:")
    assert "WRONG" in message
    assert baseline.is_model_ready("simple")
    assert baseline.get_model_config("simple")["max_batch_size"] == 8
    np.testing.assert_array_equal(_infer_simple(baseline, httpclient), 2 * np.arange(16)[None])
    _until(lambda: _workers(server, "simple") == before)  # the failed one exits
    assert baseline.is_server_ready()


def test_a_failed_first_load_is_in_the_index_and_the_server_not_ready_until_unloaded(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as e:
        baseline.load_model("broken")
    assert e.value.status() == "400"
    assert e.value.message().startswith("load failed for model 'broken': version 1 is at")
    (entry,) = [e for e in baseline.get_model_repository_index() if e["name"] == "broken"]
    assert entry["state"] == "UNAVAILABLE" and entry["version"] == "1"
    assert entry["reason"] in e.value.message()
    assert not baseline.is_server_ready()  # Triton's strict readiness
    _until(lambda: not _workers(server, "broken"))
    baseline.unload_model("broken")
    assert baseline.is_server_ready()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_loads_that_cannot_read_the_model_fail_as_tritons_poll_does(
    server: ShoalServer, protocol: str
) -> None:
    url, module = server.client(protocol)
    client = module.InferenceServerClient(url)
    internal = "500" if protocol == "http" else "StatusCode.INTERNAL"
    cases = [
        (lambda: client.load_model("wrong_model_name"), ""),
        (lambda: client.load_model("simple", config="{bad json"), "Expecting property name"),
        (lambda: client.load_model("simple", config='{"max_batch_size": -3}'), "max_batch_size"),
        (lambda: client.load_model("simple", config='{"nope": 1}'), "nope"),
    ]
    for call, detail in cases:
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == internal
        assert POLL_FAILED in e.value.message() and detail in e.value.message()
    assert client.is_model_ready("simple")
    client.unload_model("no_such_model")  # nothing to do: Triton answers success


def test_http_bodies_as_triton_reads_them(server: ShoalServer) -> None:
    """Triton 2.51, checked side by side: an unload body that does not parse (or says
    something else) is ignored, and a file parameter that is no base64 fails the load
    as a directory it cannot read."""
    for body in (b"junk", b'{"parameters": 5}', b'{"parameters": {"unload_dependents": "x"}}'):
        assert server.http("/v2/repository/models/mlp/load", b"")[0] == 200
        assert server.http("/v2/repository/models/mlp/unload", body) == (200, b"")
        assert server.http_status("/v2/models/mlp/ready") == 400
    bad = b'{"parameters": {"config": "{}", "file:1/model.onnx": "!!!"}}'
    status, reply = server.http("/v2/repository/models/uploaded/load", bad)
    assert status == 500
    assert json.loads(reply)["error"].startswith(
        "failed to load 'uploaded', failed to poll from model repository"
    )


def test_an_ensemble_loads_its_composing_models_and_unload_dependents_takes_them(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    baseline.unload_model("simple")
    baseline.load_model("ens")
    assert baseline.is_model_ready("simple")  # loaded for the ensemble
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("IN0", "IN1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    np.testing.assert_array_equal(baseline.infer("ens", inputs).as_numpy("OUT"), 2 * a)
    baseline.unload_model("ens", unload_dependents=True)
    assert not baseline.is_model_ready("ens")
    assert not baseline.is_model_ready("simple")  # only the ensemble used it
    assert not _workers(server, "simple")


def test_unloading_a_composing_model_unloads_its_ensemble_until_it_is_back(
    baseline: httpclient.InferenceServerClient,
) -> None:
    """As Triton 2.51 does (checked side by side): the ensemble goes with its composing
    model, as "unloaded" (the server stays ready), and comes back with it."""
    baseline.load_model("ens")
    baseline.unload_model("simple")
    (entry,) = [e for e in baseline.get_model_repository_index() if e["name"] == "ens"]
    assert entry == {"name": "ens", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert not baseline.is_model_ready("ens")
    assert baseline.is_server_ready()
    baseline.load_model("simple")
    assert baseline.is_model_ready("ens")
    # through an ensemble of ensembles too
    baseline.load_model("outer")
    baseline.unload_model("simple")
    assert not baseline.is_model_ready("outer") and not baseline.is_model_ready("ens")
    assert baseline.is_server_ready()
    baseline.load_model("simple")
    assert baseline.is_model_ready("outer") and baseline.is_model_ready("ens")
    baseline.unload_model("outer")
    # unload_dependents leaves a composing model that was loaded by name
    baseline.unload_model("ens", unload_dependents=True)
    assert baseline.is_model_ready("simple")


def test_an_unload_lets_the_requests_in_flight_finish(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    baseline.load_model("slow")
    x = np.arange(4, dtype=np.int32)
    results: list[object] = []

    def call() -> None:
        inp = httpclient.InferInput("INPUT0", [4], "INT32")
        inp.set_data_from_numpy(x)
        try:
            out = httpclient.InferenceServerClient(server.url).infer("slow", [inp])
            results.append(out.as_numpy("OUTPUT0"))
        except InferenceServerException as exc:
            results.append(exc.message())

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()

    def both_held() -> bool:  # one running, the other queued behind it
        state = server.model_version("slow")
        return bool(state["instances"][0]["busy"]) and state["queued"] == 1

    _until(both_held)  # (a request that reaches the broker after the unload finds no model)
    baseline.unload_model("slow")
    for t in threads:
        t.join()
    assert len(results) == 2
    for r in results:
        np.testing.assert_array_equal(r, x)  # type: ignore[arg-type]
    assert not _workers(server, "slow")


def test_a_loaded_models_worker_that_dies_is_restarted_in_its_load(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    baseline.load_model("simple", config=json.dumps({"max_batch_size": 4}))
    _until(lambda: len(_workers(server, "simple")) == 1)
    (pid,) = _workers(server, "simple")
    os.kill(pid, signal.SIGKILL)
    _until(lambda: _workers(server, "simple") - {pid} and baseline.is_model_ready("simple"), 30)
    # the same load: its config override too
    assert baseline.get_model_config("simple")["max_batch_size"] == 4
    np.testing.assert_array_equal(_infer_simple(baseline, httpclient), 2 * np.arange(16)[None])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_loaded_from_files_given_in_the_request(server: ShoalServer, protocol: str) -> None:
    url, module = server.client(protocol)
    client = module.InferenceServerClient(url)
    onnx = modelgen.simple_model()
    config = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 8})
    files = {"file:1/model.onnx": onnx}  # tritonclient's HTTP client sends it as base64
    client.load_model("uploaded", config=config, files=files)
    np.testing.assert_array_equal(
        _infer_simple(client, module, "uploaded"), 2 * np.arange(16)[None]
    )
    written = list(Path(server.runtime_dir).glob("files-*"))
    assert written
    client.unload_model("uploaded")
    _until(lambda: not any(p.exists() for p in written))
    with pytest.raises(InferenceServerException) as e:  # files need their config
        client.load_model("uploaded", files=files)
    assert POLL_FAILED in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.load_model("uploaded", config=config, files={"file:../escape": b"x"})
    assert POLL_FAILED in e.value.message()


def test_tritons_model_control_example_clients(server: ShoalServer) -> None:
    """The checks of simple_http_model_control.py and simple_grpc_model_control.py."""
    for client in (
        httpclient.InferenceServerClient(server.url),
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"),
    ):
        grpc = isinstance(client, grpcclient.InferenceServerClient)
        index = client.get_model_repository_index()
        assert len(index.models if grpc else index) == 7
        client.load_model("simple")
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as e:
            client.load_model("simple", config="{")
        assert "failed to load" in e.value.message()
        client.load_model("simple", config='{"max_batch_size":"16"}')
        config = client.get_model_config("simple")
        assert (config.config.max_batch_size if grpc else config["max_batch_size"]) == 16
        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        if grpc:
            with pytest.raises(InferenceServerException) as e:
                client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"x"})
            assert e.value.status() == "StatusCode.INTERNAL"
            assert POLL_FAILED in e.value.message()
            assert client.is_server_live()
        with pytest.raises(InferenceServerException) as e:
            client.load_model("wrong_model_name")
        assert "failed to load" in e.value.message()
        client.load_model("simple")


def test_a_load_waits_for_its_workers_and_the_index_shows_loaded_ones_first(
    server: ShoalServer, baseline: httpclient.InferenceServerClient
) -> None:
    """Loading two models at once from two clients: both answered once READY."""
    errors: list[str] = []

    def load(name: str) -> None:
        try:
            httpclient.InferenceServerClient(server.url).load_model(name)
        except InferenceServerException as exc:
            errors.append(exc.message())

    threads = [threading.Thread(target=load, args=(n,)) for n in ("mlp", "mlp", "slow")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert baseline.is_model_ready("mlp") and baseline.is_model_ready("slow")
    _until(lambda: len(_workers(server, "mlp")) == 1)  # the second load replaced the first's


def test_poll_mode_loads_reloads_and_unloads_what_changes_in_the_repository(
    tmp_path: Path,
) -> None:
    """``--model-control-mode=poll``: every model loads at start, the API is refused,
    and each rescan applies what changed on disk (Triton's poll mode)."""
    repo = tmp_path / "repo"
    modelgen.write_shipped_repository(repo, ("simple",))
    with served(repo, "--model-control-mode=poll", "--repository-poll-secs=0.2") as srv:
        client = httpclient.InferenceServerClient(srv.url)
        with pytest.raises(InferenceServerException) as e:
            client.load_model("simple")
        assert e.value.message() == (
            "explicit model load / unload is not allowed if polling is enabled"
        )
        # a new model directory loads
        modelgen.write_shipped_repository(repo, ("mlp",))
        _until(lambda: client.is_model_ready("mlp"))
        # an edited config reloads: the new instances serve, the old ones retire
        (old,) = _workers(srv, "simple")
        config = repo / "simple" / "config.pbtxt"
        config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 2"))
        _until(lambda: client.get_model_config("simple")["max_batch_size"] == 2)
        _until(lambda: _workers(srv, "simple") - {old} and old not in _workers(srv, "simple"))
        np.testing.assert_array_equal(_infer_simple(client, httpclient), 2 * np.arange(16)[None])
        # a config that does not validate leaves the loaded version serving
        config.write_text(config.read_text().replace("max_batch_size: 2", "max_batch_size: -2"))
        time.sleep(0.8)  # a few rescans
        assert client.get_model_config("simple")["max_batch_size"] == 2
        assert client.is_model_ready("simple")
        # a removed directory unloads
        shutil.rmtree(repo / "mlp")
        _until(lambda: not client.is_model_ready("mlp") and not _workers(srv, "mlp"))
        assert [e["name"] for e in client.get_model_repository_index()] == ["simple"]
        assert client.is_server_ready()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_begun_before_a_reload_ends_on_the_copy_that_holds_it(
    server: ShoalServer, protocol: str
) -> None:
    url, module = server.client(protocol)
    client = module.InferenceServerClient(url)
    client.load_model("simple_sequence")
    (old,) = _workers(server, "simple_sequence")

    def step(value: int, seq: int, **flags: bool) -> int:
        inp = module.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        out = client.infer("simple_sequence", [inp], sequence_id=seq, **flags)
        return int(out.as_numpy("OUTPUT")[0, 0])

    assert step(10, 42, sequence_start=True) == 11  # OUTPUT = INPUT + START
    _modify(server, "simple_sequence", "1")
    client.load_model("simple_sequence")  # a new copy; sequence 42 is open on the old one
    assert step(20, 43, sequence_start=True) == 21  # a new sequence: the new copy
    assert step(30, 42) == 30  # not refused for want of a START: the old copy has it
    assert old in _workers(server, "simple_sequence")  # it holds an open sequence
    assert step(40, 42, sequence_end=True) == 40
    _until(lambda: old not in _workers(server, "simple_sequence"))
    assert step(50, 43, sequence_end=True) == 50
