"""Restricted API groups on the real server (--http-restricted-api,
--grpc-restricted-protocol), with tritonclient: Triton 2.51's answers without the header
or with a wrong value, service with it, unrestricted groups untouched."""

from __future__ import annotations

import contextlib
import http.client
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, served
from tools import modelgen

ADMIN = {"admin-key": "s3cret"}
INFER = {"infer-key": "go"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "go"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("restricted-repo")
    modelgen.write_shipped_repository(repo, ("simple",))
    with served(
        repo,
        "--http-restricted-api=model-repository,statistics,logging:admin-key=s3cret",
        "--http-restricted-api=inference:infer-key=go",
        "--grpc-restricted-protocol=statistics,health:admin-key=s3cret",
        "--grpc-restricted-protocol=inference:infer-key=go",
    ) as srv:
        yield srv


def _inputs(module: object) -> list:
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def test_http_groups_need_their_header(server: ShoalServer) -> None:
    refused = (403, b'{"error":"This API is restricted, expecting header \'admin-key\'"}')
    for path in ("/v2/models/stats", "/v2/models/simple/stats", "/v2/logging"):
        assert server.http(path) == refused
        assert server.http(path, headers={"admin-key": "wrong"}) == refused
        assert server.http(path, headers={"Admin-Key": "s3cret"})[0] == 200  # any case of name
    assert server.http("/v2/repository/index", b"") == refused
    # the restriction comes before everything else: even an unknown model is refused
    assert server.http("/v2/models/nope/infer", b"{}", ADMIN)[0] == 403
    # a value that is no UTF-8 is compared as sent: refused, not a 500
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    conn.putrequest("GET", "/v2/models/stats")
    conn.putheader("admin-key", b"\xff\xfe")
    conn.endheaders()
    response = conn.getresponse()
    assert (response.status, response.read()) == refused
    conn.close()
    # unrestricted groups and unknown paths are as ever
    assert server.http("/v2/health/ready")[0] == 200
    assert server.http("/v2/models/simple/config")[0] == 200
    assert server.http("/v2/nothing")[0] == 404
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        client.infer("simple", _inputs(httpclient))
    out = client.infer("simple", _inputs(httpclient), headers=INFER).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, np.full((1, 16), 2))


def test_grpc_groups_need_their_metadata(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    expecting = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    for call in (
        lambda h: client.get_inference_statistics("simple", headers=h),
        lambda h: client.is_server_live(headers=h),
    ):
        for headers in ({}, {"triton-grpc-protocol-admin-key": "bad"}, {"admin-key": "s3cret"}):
            with pytest.raises(InferenceServerException) as e:
                call(headers)
            assert (e.value.status(), e.value.message()) == ("StatusCode.UNAVAILABLE", expecting)
        call(GRPC_ADMIN)
    assert client.get_model_config("simple").config.name == "simple"  # not restricted
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        reply = health.Check(health_pb2.HealthCheckRequest(), metadata=tuple(GRPC_ADMIN.items()))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
        client.infer("simple", _inputs(grpcclient))
    out = client.infer("simple", _inputs(grpcclient), headers=GRPC_INFER).as_numpy("OUTPUT1")
    np.testing.assert_array_equal(out, np.zeros((1, 16)))


def _stream_once(server: ShoalServer, headers: dict[str, str] | None) -> tuple:
    """One request on a new stream (its own client); its (result, error), once it came."""
    results: list = []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(
        callback=lambda result, error: results.append((result, error)), headers=headers
    )
    # A refused stream ends at once: its error may reach the callback before this request
    # is queued, and the client then refuses to queue it (the error is the callback's).
    with contextlib.suppress(InferenceServerException):
        client.async_stream_infer("simple", _inputs(grpcclient))
    deadline = time.monotonic() + 10
    while not results and time.monotonic() < deadline:
        time.sleep(0.02)
    client.stop_stream()
    client.close()
    (answer,) = results
    return answer


def test_a_stream_needs_the_inference_metadata(server: ShoalServer) -> None:
    _, error = _stream_once(server, None)
    assert "triton-grpc-protocol-infer-key" in str(error)
    result, error = _stream_once(server, GRPC_INFER)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("--http-restricted-api=bogus:k=v", "unknown restricted api 'bogus'"),
        ("--grpc-restricted-protocol=health", "option format is '<config name>:<setting>=<value>'"),
    ],
)
def test_bad_groups_are_refused_at_start(tmp_path: Path, flag: str, words: str) -> None:
    argv = [sys.executable, "-m", "shoal", "serve", f"--model-repository={tmp_path}", flag]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and words in done.stderr
