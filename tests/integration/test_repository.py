"""Triton's model repository extension under model control mode "none" (Triton's
default): the index over HTTP and gRPC, and load / unload refused in Triton 2.51's words
after its body checks (checked side by side with triton-peer). Explicit model control:
test_model_control.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served
from tools import modelgen

REFUSED = "explicit model load / unload is not allowed if polling is enabled"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("repository-ext")
    modelgen.write_shipped_repository(repo)
    shutil.rmtree(repo / "mlp_large", ignore_errors=True)
    broken = repo / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: -3\n')
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN0" data_type: TYPE_INT32 dims: [ 16 ] }, '
        '{ name: "IN1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "simple" model_version: -1 '
        'input_map { key: "INPUT0" value: "IN0" } input_map { key: "INPUT1" value: "IN1" } '
        'output_map { key: "OUTPUT0" value: "OUT" } } ] }\n'
    )
    shutil.copytree(repo / "simple", repo / "seq")
    config = (repo / "simple" / "config.pbtxt").read_text().replace('"simple"', '"seq"')
    (repo / "seq" / "config.pbtxt").write_text(
        config + "sequence_batching { iterative_sequence: true }\n"
    )
    _identity(repo, "identity", "TYPE_FP32", 'parameters { key: "execute_delay_ms" '
              'value: { string_value: "1" } }\ndynamic_batching { }\n')  # fmt: skip
    _identity(repo, "identity_bad", "TYPE_INT32")
    with served(repo, "--exit-on-error=false", "--strict-readiness=false") as srv:
        srv.wait_settled(("simple", "mlp", "identity", "identity_bad"))
        yield srv


def _identity(repo: Path, name: str, output0: str, extra: str = "") -> None:
    """A model of Triton's identity backend (no model file): two input/output pairs."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: {output0} dims: [ 4 ] }}, '
        '{ name: "OUTPUT1" data_type: TYPE_STRING dims: [ -1 ] } ]\n' + extra
    )


def test_the_index_lists_every_version_and_why_one_is_not_ready(server: ShoalServer) -> None:
    index = httpclient.InferenceServerClient(server.url).get_model_repository_index()
    (broken,) = [e for e in index if e["name"] == "broken"]
    assert broken["state"] == "UNAVAILABLE" and "version" not in broken  # its config failed
    assert "max_batch_size" in broken["reason"]
    # a valid config shoal cannot serve yet fails its load saying so
    (seq,) = [e for e in index if e["name"] == "seq"]
    assert seq["reason"] == (
        "failed to load 'seq': iterative sequence batching is supported for Python models only"
    )
    (bad,) = [e for e in index if e["name"] == "identity_bad"]
    assert bad["state"] == "UNAVAILABLE"
    assert bad["reason"].endswith(
        "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32"
    )  # (Triton's identity backend's words)
    assert [e for e in index if e["name"] not in ("broken", "seq", "identity_bad")] == [
        {"name": "ens", "version": "1", "state": "READY"},  # an ensemble: no instances
        {"name": "identity", "version": "1", "state": "READY"},
        {"name": "mlp", "version": "1", "state": "READY"},
        {"name": "simple", "version": "1", "state": "READY"},
    ]
    assert [e["name"] for e in index] == sorted(e["name"] for e in index)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    over_grpc = client.get_model_repository_index(as_json=True)["models"]
    assert over_grpc == index
    # ready: READY versions only (both protocols); a named repository is the same one
    ready = [e for e in index if e["state"] == "READY"]
    assert len(ready) == 4
    assert server.http("/v2/repository/index", b'{"ready":true}') == (200, _json(ready))
    assert server.http("/v2/repository/mine/index", b'{"ready":true}') == (200, _json(ready))
    request = grpcclient.service_pb2.RepositoryIndexRequest(ready=True)
    reply = client._client_stub.RepositoryIndex(request)
    assert [(m.name, m.state) for m in reply.models] == [
        ("ens", "READY"),
        ("identity", "READY"),
        ("mlp", "READY"),
        ("simple", "READY"),
    ]


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v2/repository/index", b'{"ready":"x"}', 400,  # the current Triton's (2.51: 500)
         "Invalid value for 'ready': expected a boolean"),
        ("/v2/repository/index", b"junk", 500, "failed to parse the request JSON buffer"),
        ("/v2/repository/models/simple/load", b"", 503, REFUSED),
        ("/v2/repository/models/nope/load", b'{"parameters":{"config":"{}"}}', 503, REFUSED),
        ("/v2/repository/models/simple/load", b'{"parameters":5}', 500,
         "attempt to get members for non-object"),
        ("/v2/repository/models/simple/load", b'{"parameters":{"config":5}}', 500,
         "attempt to access JSON non-string as string"),
        ("/v2/repository/models/simple/load", b'{"parameters":{"other":"s"}}', 500,
         "unexpected error on creating Triton parameter"),
        ("/v2/repository/models/simple/unload", b"junk", 503, REFUSED),  # no body read
        ("/v2/repository/mine/models/simple/unload", b"", 501,
         "'repository_name' specification is not supported"),
        ("/v2/repository/mine/models/simple/load", b'{"parameters":{"config":5}}', 501,
         "'repository_name' specification is not supported"),
    ],
)  # fmt: skip
def test_load_and_unload_are_refused_after_tritons_body_checks(
    server: ShoalServer, path: str, body: bytes, status: int, message: str
) -> None:
    got, reply = server.http(path, body)
    assert got == status
    assert message in reply.decode()
    assert server.http_status("/v2/models/simple/ready") == 200  # nothing was unloaded


def test_tritonclient_load_and_unload_get_unavailable(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    for call, status in [
        (lambda: http.load_model("simple"), "503"),
        (lambda: http.unload_model("simple", unload_dependents=True), "503"),
        (
            lambda: grpc.load_model("simple", config='{"max_batch_size": 4}'),
            "StatusCode.UNAVAILABLE",
        ),
        (lambda: grpc.unload_model("simple"), "StatusCode.UNAVAILABLE"),
    ]:
        with pytest.raises(InferenceServerException) as e:
            call()
        assert (e.value.status(), e.value.message()) == (status, REFUSED)
    assert "model_repository" in http.get_server_metadata()["extensions"]


def _grpc_refusal(server: ShoalServer, method: str, repo: str = "", **params: object) -> tuple:
    request = getattr(pb, f"Repository{method}Request")(repository_name=repo)
    if method != "Index":
        request.model_name = "simple"
    for key, (choice, value) in params.items():  # type: ignore[misc]
        setattr(request.parameters[key], choice, value)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            getattr(stub, f"Repository{method}")(request, timeout=10)
    return e.value.code().name, e.value.details()


def test_grpc_checks_names_and_parameters_as_triton(server: ShoalServer) -> None:
    named = ("UNIMPLEMENTED", "'repository_name' specification is not supported")
    for method in ("Index", "ModelLoad", "ModelUnload"):
        assert _grpc_refusal(server, method, "mine") == named
    bad = "INVALID_ARGUMENT"
    assert _grpc_refusal(server, "ModelLoad", bogus=("bool_param", True)) == (
        bad,
        "unrecognized load parameter 'bogus'.",
    )
    assert _grpc_refusal(server, "ModelLoad", config=("int64_param", 1)) == (
        bad,
        "invalid value type for load parameter 'config', expected string_param.",
    )
    assert _grpc_refusal(server, "ModelLoad", **{"file:1/model.onnx": ("string_param", "x")}) == (
        bad,
        "invalid value type for load parameter 'file:1/model.onnx', expected bytes_param.",
    )
    assert _grpc_refusal(server, "ModelUnload", unload_dependents=("int64_param", 1)) == (
        bad,
        "invalid value type for 'unload_dependents' parameter, expected bool_param.",
    )
    good = {"config": ("string_param", "{}"), "file:1/model.onnx": ("bytes_param", b"x")}
    assert _grpc_refusal(server, "ModelLoad", **good) == ("UNAVAILABLE", REFUSED)
    assert _grpc_refusal(server, "ModelUnload", other=("int64_param", 1)) == (
        "UNAVAILABLE",
        REFUSED,
    )  # other unload parameters are ignored


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (
            ["--model-control-mode=poll", "--repository-poll-secs=0"],
            "--repository-poll-secs must be more than 0 in poll mode",
        ),
        (["--model-control-mode=lazy"], "unexpected value for --model-control-mode: 'lazy'"),
        (
            ["--load-model=simple"],  # Triton 2.51's words
            "Use of '--load-model' requires setting '--model-control-mode=explicit' as well.",
        ),
        (
            ["--model-control-mode=explicit", "--load-model=*", "--load-model=simple"],
            "Wildcard model name '*' must be the ONLY startup model if specified at all.",
        ),
    ],
)
def test_model_control_flags_triton_refuses_are_refused_at_start(
    tmp_path: Path, flags: list[str], words: str
) -> None:
    argv = [sys.executable, "-m", "shoal", "serve", f"--model-repository={tmp_path}"]
    done = subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert words in done.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_identity_backend_is_built_in(server: ShoalServer, protocol: str) -> None:
    """``backend: "identity"``: each OUTPUT<i> is the request's INPUT<i>, BYTES too."""
    url, mod = server.client(protocol)
    client = mod.InferenceServerClient(url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    text = np.array([[b"a", b"bc", b""], [b"d", b"\x00e", b"f"]], dtype=object)
    inputs = [mod.InferInput("INPUT0", [2, 4], "FP32"), mod.InferInput("INPUT1", [2, 3], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(text)
    result = client.infer("identity", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert result.as_numpy("OUTPUT1").tolist() == text.tolist()
    only = client.infer("identity", inputs, outputs=[mod.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None
