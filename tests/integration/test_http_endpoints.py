"""Health, metadata, config and readiness endpoints through the real tritonclient."""

from __future__ import annotations

import json
import urllib.request

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer


@pytest.fixture(scope="module")
def client(server: ShoalServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def _get(server: ShoalServer, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{server.url}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_health_endpoints_answer_200_with_empty_body(server: ShoalServer) -> None:
    assert _get(server, "/v2/health/live") == (200, b"")
    assert _get(server, "/v2/health/ready") == (200, b"")


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert meta["version"]
    assert "binary_tensor_data" in meta["extensions"]
    assert "model_configuration" in meta["extensions"]


def test_model_metadata_of_simple(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("simple")
    assert meta["name"] == "simple"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert client.get_model_metadata("simple", "1")["name"] == "simple"


def test_model_config_rendered_like_triton(client: httpclient.InferenceServerClient) -> None:
    cfg = client.get_model_config("simple")
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [16]  # int64 as a JSON number
    assert cfg["input"][0]["data_type"] == "TYPE_INT32"
    assert cfg["input"][0]["format"] == "FORMAT_NONE"  # defaults printed
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}


def test_auto_complete_fills_a_missing_config(client: httpclient.InferenceServerClient) -> None:
    cfg = client.get_model_config("simple_autofill")
    assert cfg["max_batch_size"] == 4
    assert {i["name"] for i in cfg["input"]} == {"INPUT0", "INPUT1"}
    assert cfg["input"][0]["dims"] == [16]
    assert cfg["output"][0]["data_type"] == "TYPE_INT32"
    assert "dynamic_batching" in cfg


def test_version_policy_selects_versions(
    server: ShoalServer, client: httpclient.InferenceServerClient
) -> None:
    assert client.get_model_metadata("versioned")["versions"] == ["1", "3"]
    assert client.is_model_ready("versioned", "1")
    assert client.is_model_ready("versioned", "3")
    assert not client.is_model_ready("versioned", "2")
    status, body = _get(server, "/v2/models/versioned/versions/2")
    assert status == 404
    assert (
        json.loads(body)["error"] == "Request for unknown model: 'versioned' version 2 is not found"
    )
    status, body = _get(server, f"/v2/models/versioned/versions/{'9' * 30}")
    assert status == 400
    assert json.loads(body)["error"].startswith("failed to get model version")


def test_model_ready(server: ShoalServer, client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    assert _get(server, "/v2/models/simple/ready") == (200, b"")
    assert _get(server, "/v2/models/simple/versions/1/ready") == (200, b"")
    # Not ready, unknown model or version alike: Triton 2.51's one message (triton-peer).
    not_ready = (400, b'{"error":"Model version not ready"}')
    assert _get(server, "/v2/models/nope/ready") == not_ready
    assert _get(server, "/v2/models/simple/versions/7/ready") == not_ready
    assert _get(server, "/v2/models/simple/versions/007/ready") == not_ready
    status, body = _get(server, f"/v2/models/simple/versions/{'9' * 30}/ready")
    assert status == 400
    assert json.loads(body)["error"] == (
        f"failed to get model version from specified version string '{'9' * 30}' "
        "(details: stol), version should be an integral value > 0"
    )


@pytest.mark.parametrize("path", ["/v2/models/nope", "/v2/models/nope/config"])
def test_unknown_model(server: ShoalServer, path: str) -> None:
    status, body = _get(server, path)
    assert status == 404  # Triton 2.51's (checked side by side)
    assert json.loads(body) == {"error": "Request for unknown model: 'nope' is not found"}


def test_unknown_model_through_client(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.get_model_metadata("nope")


@pytest.mark.parametrize("path", ["/v3", "/v2/models", "/v2/models/simple/versions/x"])
def test_unknown_paths_are_404(server: ShoalServer, path: str) -> None:
    status, body = _get(server, path)
    assert status == 404
    assert json.loads(body) == {"error": "Not Found"}


def test_wrong_verb_is_405(server: ShoalServer) -> None:
    req = urllib.request.Request(f"http://{server.url}/v2/health/live", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v2/models/nope/stats", "requested model 'nope' is not available"),
        ("/v2/models/nope/versions/1/stats", "requested model 'nope' is not available"),
        (
            "/v2/models/versioned/versions/2/stats",  # on disk, not served by the policy
            "requested model version is not available for model 'versioned'",
        ),
        (
            "/v2/models/versioned/versions/7/stats",
            "requested model version is not available for model 'versioned'",
        ),
    ],
)
def test_stats_errors_are_tritons_400s(server: ShoalServer, path: str, error: str) -> None:
    status, body = _get(server, path)
    assert (status, json.loads(body)) == (400, {"error": error})


def test_stats_carry_every_key_triton_prints(server: ShoalServer) -> None:
    status, body = _get(server, "/v2/models/versioned/stats")
    assert status == 200
    stats = json.loads(body)["model_stats"]
    assert [s["version"] for s in stats] == ["1", "3"]
    assert list(stats[0]) == [
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "response_stats",
        "batch_stats",
        "memory_usage",
    ]
    assert (stats[0]["response_stats"], stats[0]["memory_usage"]) == ({}, [])
