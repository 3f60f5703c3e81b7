"""Triton users' ``model.py`` files, unchanged: models written in the style of Triton's
python_backend examples (add_sub, BLS sync and async, decoupled repeat and square,
auto-complete, custom metrics, the model loading API, DLPack with torch, BF16, a request's
own fields, an execution environment, a readiness check of its own, Logger and finalize;
tests/integration/python_compat_models.py), served by one server in explicit model control
mode and called through tritonclient."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from queue import Queue
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.python_compat_models import ENV_FAILURES, MODELS
from tests.serverctl import ShoalServer, served


def _venv_tarball(into: Path, work: Path) -> None:
    """A small venv (no pip) with a module of its own, as ``env.tar.gz``."""
    env = work / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = env.glob("lib/python3.*/site-packages")
    (site / "env_marker.py").write_text('VALUE = "from the environment"\n')
    with tarfile.open(into / "env.tar.gz", "w:gz") as archive:
        archive.add(env, arcname=".")


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("python-envs")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, env_cache: Path) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("python-compat")
    models = {**MODELS, **{name: MODELS["in_env"] for name in ENV_FAILURES}}
    for name, (source, io) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{io}\n')
    _venv_tarball(repo / "in_env", tmp_path_factory.mktemp("venv"))
    (repo / "env_broken" / "env.tar.gz").write_bytes(b"not an archive")
    loads = [f"--load-model={name}" for name in MODELS]
    env = {"SHOAL_PYTHON_ENV_CACHE": str(env_cache)}
    with served(repo, "--model-control-mode=explicit", *loads, env=env) as srv:
        yield srv


def _add_sub_inputs(module: Any) -> tuple[list[Any], np.ndarray, np.ndarray]:
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    b = np.array([0.5, 0.5, 1.0, 1.0], np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


@pytest.mark.parametrize("model", ["add_sub", "bls_sync", "bls_async", "dlpack_add_sub"])
def test_add_sub_and_its_bls_callers(server: ShoalServer, model: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inputs, a, b = _add_sub_inputs(httpclient)
    result = client.infer(model, inputs)
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


def _stream(server: ShoalServer, model: str, values: np.ndarray) -> list[Any]:
    """The responses of one streamed request (up to the final flag's)."""
    answers: Queue[Any] = Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    x = grpcclient.InferInput("IN", list(values.shape), "INT32")
    x.set_data_from_numpy(values)
    client.async_stream_infer(model, [x], enable_empty_final_response=True)
    out = []
    while True:
        got = answers.get(timeout=30)
        assert not isinstance(got, Exception), got
        if got.get_response().parameters["triton_final_response"].bool_param:
            break
        out.append(got)
    client.stop_stream()
    client.close()
    return out


@pytest.mark.parametrize(
    ("sequence_id", "start", "end", "flags"), [(7, True, False, 1), ("seq-a", True, True, 3)]
)
def test_request_id_correlation_id_of_either_type_flags_and_parameters(
    server: ShoalServer, sequence_id: int | str, start: bool, end: bool, flags: int
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    result = client.infer(
        "request_info", [x], request_id="r-1", sequence_id=sequence_id, sequence_start=start,
        sequence_end=end, parameters={"temperature": 0.5, "mode": "fast"},
    )  # fmt: skip
    info = json.loads(result.as_numpy("OUTPUT0")[0])
    kind = type(sequence_id).__name__
    assert info == {
        "id": "r-1",
        "corrid": [kind, sequence_id],
        "flags": flags,
        "parameters": {"temperature": 0.5, "mode": "fast"},
    }


@pytest.mark.parametrize("model", ["identity_bf16", "bls_bf16"])
def test_bf16_through_dlpack(server: ShoalServer, model: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [4], "BF16")
    x.set_data_from_numpy(np.array([1.5, -2.0, 0.25, 3.0], ml_dtypes.bfloat16))
    result = client.infer(model, [x])
    assert result.as_numpy("OUTPUT0").astype(np.float32).tolist() == [3.0, -4.0, 0.5, 6.0]


def test_decoupled_repeat_and_square(server: ShoalServer) -> None:
    repeated = _stream(server, "repeat_int32", np.array([4, 2, 0, 1], np.int32))
    assert [(r.as_numpy("OUT")[0], r.as_numpy("IDX")[0]) for r in repeated] == [
        (4, 0), (2, 1), (0, 2), (1, 3)
    ]  # fmt: skip
    squared = _stream(server, "square_int32", np.array([3], np.int32))
    assert [r.as_numpy("OUT").tolist() for r in squared] == [[3]] * 3


def test_a_models_is_ready_answers_the_servers_readiness_too(server: ShoalServer) -> None:
    """Under strict readiness (the default), as Triton's server readiness asks each READY
    model's own check: a model whose ``is_ready`` says no makes the server not ready
    (HTTP and gRPC), while it stays live and the other models ready."""
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert http.is_server_ready() and grpc.is_server_ready()
    gate = server.repo / "ready_gate" / "not_ready"
    gate.touch()
    try:
        assert not http.is_server_ready() and not grpc.is_server_ready()
        assert not http.is_model_ready("ready_gate") and http.is_model_ready("add_sub")
        assert http.is_server_live()
    finally:
        gate.unlink()
    assert http.is_server_ready() and grpc.is_server_ready()


def test_logger_lines_at_each_level_from_each_step_and_finalize_runs(
    server: ShoalServer,
) -> None:
    """pb_utils.Logger from initialize, execute and finalize (run when the model is
    unloaded), each level at its own letter; verbose lines not at the default level."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    assert client.infer("logging", [x]).as_numpy("OUTPUT0").tolist() == [1.0]
    client.unload_model("logging")
    try:
        _wait_for(lambda: "Finalize-Error Msg!" in server.log())
    finally:
        client.load_model("logging")
    log = server.log()
    for step in ("Initialize", "Execute", "Finalize"):
        for letter, level in (("I", "Specific"), ("I", "Info"), ("W", "Warning"), ("E", "Error")):
            assert re.search(rf"\] {letter} \S+: {step}-{level} Msg!$", log, re.MULTILINE), (
                step,
                level,
            )
        assert f"{step}-Verbose Msg!" not in log


def test_auto_complete_sets_the_decoupled_policy(server: ShoalServer) -> None:
    config = httpclient.InferenceServerClient(server.url).get_model_config("auto_decoupled")
    assert config["model_transaction_policy"] == {"decoupled": True}
    answers = _stream(server, "auto_decoupled", np.array([5], np.int32))
    assert [a.as_numpy("OUT").tolist() for a in answers] == [[5], [5]]


def test_auto_complete_sets_inputs_outputs_batching(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("auto_complete")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0"]
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for x in inputs:
        x.set_data_from_numpy(np.full((1, 4), 3.0, np.float32))
    assert client.infer("auto_complete", inputs).as_numpy("OUTPUT0").tolist() == [[9.0] * 4]


def _metrics(server: ShoalServer) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_custom_metrics_are_on_the_metrics_page_beside_tritons(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for value, seen in ((1.0, 1.0), (0.5, 2.0)):
        x = httpclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(np.full(4, value, np.float32))
        result = client.infer("custom_metrics", [x])
        assert result.as_numpy("OUTPUT0").tolist() == [seen]
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.zeros(4, np.float32))
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    result = client.infer("custom_metrics", [x], parameters={"metrics_url": url})
    tags = 'model="custom_metrics",version="1"'
    # the model's own scrape, in execute, after its increment: as Triton's registry
    assert result.as_numpy("OUTPUT2")[0].decode() == f"requests_seen{{{tags}}} 3"
    refusal = result.as_numpy("OUTPUT1")[0].decode()
    assert refusal == (
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
        "incremented monotonically by non-negative values."
    )
    families = _metrics(server)
    assert "nv_inference_request_success" in families
    labels = {"model": "custom_metrics", "version": "1"}
    counter, gauge, histogram = (
        families["requests_seen"], families["last_input_sum"], families["input_sum"]
    )  # fmt: skip
    assert (counter.type, counter.documentation) == ("counter", "Requests this model has seen")
    assert [(s.labels, s.value) for s in counter.samples] == [(labels, 3.0)]
    assert [(s.labels, s.value) for s in gauge.samples] == [(labels, 0.0)]
    by_name = {(s.name, s.labels.get("le")): s.value for s in histogram.samples}
    assert by_name == {
        ("input_sum_count", None): 3.0,
        ("input_sum_sum", None): 6.0,
        ("input_sum_bucket", "1"): 1.0,  # (le as Triton writes it)
        ("input_sum_bucket", "10"): 3.0,
        ("input_sum_bucket", "+Inf"): 3.0,
    }


def test_unloading_a_model_takes_its_metrics_off_the_page(server: ShoalServer) -> None:
    assert "requests_seen" in _metrics(server)
    client = httpclient.InferenceServerClient(server.url)
    client.unload_model("custom_metrics")
    try:
        assert "requests_seen" not in _metrics(server)
    finally:
        client.load_model("custom_metrics")
    assert [s.value for s in _metrics(server)["requests_seen"].samples] == [0.0]


def test_a_killed_instances_metrics_leave_the_page(server: ShoalServer) -> None:
    """Its file is skipped at once (its pid is gone) and removed by the broker."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, np.float32))
    seen = client.infer("custom_metrics", [x]).as_numpy("OUTPUT0")[0]
    assert seen >= 1
    pid = server.worker_pid("custom_metrics")
    snapshot = Path(server.runtime_dir) / "metrics" / f"{pid}.msgpack"
    assert snapshot.exists()
    os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: not Path(f"/proc/{pid}").exists())
    family = _metrics(server).get("requests_seen")
    assert family is None or [s.value for s in family.samples] == [0.0]  # (restarted)
    _wait_for(lambda: not snapshot.exists())


def _wait_for(done: Any, timeout: float = 30.0) -> None:
    """Until ``done()`` (a process's end, a file's removal: no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_model_loads_calls_and_unloads_another(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    steps = json.loads(client.infer("loader", [x]).as_numpy("OUTPUT0")[0])
    assert steps == {
        "ready_before": False,
        "unknown": "Failed to load model: failed to load 'no_such_model', failed to poll "
        "from model repository",
        "ready_after": True,
        "answer": [3.0, 6.0],
        "ready_unloaded": False,
        "bad_version": "failed to get model version from specified version string 'one', "
        "version should be an integral value > 0",
    }
    assert not client.is_model_ready("generated")


def test_a_model_runs_in_its_execution_environment(server: ShoalServer, env_cache: Path) -> None:
    """EXECUTION_ENV_PATH: its tarball unpacked once in the cache, the model's worker run
    by that environment's Python (its own modules first, numpy from the server's)."""
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    prefix, marker = client.infer("in_env", [x]).as_numpy("OUTPUT0")
    (unpacked,) = [p for p in env_cache.iterdir() if not p.name.startswith(".")]
    assert Path(prefix.decode()) == unpacked
    assert marker == b"from the environment"
    argv = Path(f"/proc/{server.worker_pid('in_env')}/cmdline").read_bytes().split(b"\0")
    assert Path(argv[0].decode()).parent == unpacked / "bin"  # the process itself


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("env_missing", "/env.tar.gz': no such file or directory"),
        ("env_broken", "/env.tar.gz' cannot be unpacked: "),
    ],
)
def test_an_environment_that_cannot_be_used_fails_the_load(
    server: ShoalServer, model: str, reason: str
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as err:
        client.load_model(model)
    assert f"EXECUTION_ENV_PATH '{server.repo}/{model}" in err.value.message()
    assert reason in err.value.message()
    assert not client.is_model_ready(model)
