"""Malformed and invalid requests: Triton's status codes and messages, and the server
stays up after every one of them."""

from __future__ import annotations

import gzip
import http.client
import json
import shutil
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer
from tools import modelgen


@pytest.fixture(autouse=True)
def server_stays_up(server: ShoalServer) -> Iterator[None]:
    yield
    assert server.http_status("/v2/health/live") == 200
    assert server.http_status("/v2/health/ready") == 200


def post(
    server: ShoalServer, model: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection(server.url, timeout=10)
    conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers or {})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw)


def simple_json(**override: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
    doc.update(override)
    return doc


def test_valid_json_request_works(server: ShoalServer) -> None:
    status, body = post(server, "simple", json.dumps(simple_json()).encode())
    assert status == 200
    assert body["outputs"][0]["data"] == [i + 1 for i in range(16)]


@pytest.mark.parametrize(
    ("doc", "status", "message"),
    [
        (
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "data": list(range(16)),
                    }
                ]
            },
            400,
            "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
            "but missing required input(s) ['INPUT1']. Please provide all required input(s).",
        ),
        (
            simple_json(
                inputs=[
                    {
                        "name": "INPUT0",
                        "shape": [2, 8],
                        "datatype": "INT32",
                        "data": list(range(16)),
                    },
                    {"name": "INPUT1", "shape": [2, 8], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            400,
            # both are wrong: Triton 2.51 names the one it walks first, the newest
            "unexpected shape for input 'INPUT1' for model 'simple'. Expected [-1,16], got [2,8]",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [9, 16], "datatype": "INT32", "data": [0] * 144},
                    {"name": "INPUT1", "shape": [9, 16], "datatype": "INT32", "data": [1] * 144},
                ]
            ),
            400,
            "inference request batch-size must be <= 8 for 'simple'",
        ),
        (
            simple_json(
                inputs=[
                    {
                        "name": "INPUT0",
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "parameters": {"binary_data_size": 64},
                    },
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            400,
            # no Inference-Header-Content-Length: all JSON, no binary section (triton-peer)
            "unexpected size for input 'INPUT0', expecting 64 additional bytes for model 'simple'",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16},
                    {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "data": [1] * 32},
                ]
            ),
            400,
            # Triton 2.51 (triton-peer): it walks the inputs newest first
            "[request id: <id_unknown>] input 'INPUT0' batch size does not match other inputs "
            "for 'simple'",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [2, 16], "datatype": "INT32", "data": [0] * 32},
                    {"name": "INPUT1", "shape": [0, 16], "datatype": "INT32", "data": []},
                ]
            ),
            400,
            # a 0 batch seen first is held to the request's batch (2), as Triton holds it
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model "
            "'simple'. Expected 128, got 0",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            400,
            "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                    {"name": "INPUT9", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            400,
            "expected 2 inputs but got 3 inputs for model 'simple'",  # Triton: count first
        ),
        (
            simple_json(outputs=[{"name": "OUTPUT7"}]),
            400,
            "unexpected inference output 'OUTPUT7' for model 'simple'",
        ),
        (
            simple_json(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]),
            400,
            "output 'OUTPUT0' already exists in request",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [1, -16], "datatype": "INT32", "data": [0] * 16},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            500,
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            simple_json(
                inputs=[
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 15},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            500,  # Triton 2.51's JSON layer: INTERNAL
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        (
            simple_json(
                inputs=[
                    {
                        "name": "INPUT0",
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64},
                    },
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                ]
            ),
            501,
            "Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
            "to enable.",
        ),
    ],
    ids=[
        "input-count",
        "shape",
        "batch-size",
        "binary-without-header",
        "batch-mismatch",
        "zero-batch-beside-a-real-one",
        "datatype",
        "extra-input",
        "unknown-output",
        "duplicate-output",
        "negative-dim",
        "element-count",
        "client-shm-disabled",
    ],
)
def test_invalid_request(
    server: ShoalServer, doc: dict[str, object], status: int, message: str
) -> None:
    got_status, body = post(server, "simple", json.dumps(doc).encode())
    assert got_status == status
    assert message in body["error"]


def test_unknown_model_infer(server: ShoalServer) -> None:
    status, body = post(server, "nope", json.dumps(simple_json()).encode())
    assert (status, body) == (404, {"error": "Request for unknown model: 'nope' is not found"})


@pytest.mark.parametrize("body", [b"{", b'{"inputs": 5}', b"not json"])
def test_an_unknown_model_is_the_answer_whatever_the_body(server: ShoalServer, body: bytes) -> None:
    """Triton creates the request for its model before it reads the body (2.51 answers
    these with the unknown model too: 404, checked side by side)."""
    status, doc = post(server, "nope", body)
    assert (status, doc) == (404, {"error": "Request for unknown model: 'nope' is not found"})


def test_a_header_value_that_is_not_utf8_is_quoted_in_the_error(server: ShoalServer) -> None:
    """Found by tests/integration/test_fuzz.py: the message quoting the value could not be
    encoded as JSON, and aiohttp answered with its own 500 and a traceback."""
    conn = http.client.HTTPConnection(server.url, timeout=10)
    conn.putrequest("POST", "/v2/models/simple/infer")
    conn.putheader("Inference-Header-Content-Length", b"1\xff")
    conn.putheader("Content-Length", "2")
    conn.endheaders(b"{}")
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    conn.close()
    assert resp.status == 400
    assert doc["error"] == (
        "Unable to parse Inference-Header-Content-Length header value '1\\udcff'"
    )
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"not json", b""])
def test_bad_json(server: ShoalServer, body: bytes) -> None:
    """500, as Triton 2.51 answers a body its JSON layer cannot read (triton-peer)."""
    status, doc = post(server, "simple", body)
    assert status == 500
    assert doc["error"].startswith(("failed to parse the request JSON buffer", "Unable to parse"))


@pytest.mark.parametrize("length", ["99999999999", "-1"])
def test_header_length_out_of_range(server: ShoalServer, length: str) -> None:
    body = json.dumps(simple_json()).encode()
    status, doc = post(server, "simple", body, {"Inference-Header-Content-Length": length})
    assert status == 400
    assert doc["error"].startswith("inference header size should be in range (0, ")


def test_binary_byte_size_mismatch(server: ShoalServer) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 32},
                },
                {
                    "name": "INPUT1",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                },
            ]
        }
    ).encode()
    body = header + b"\0" * 96
    status, doc = post(
        server, "simple", body, {"Inference-Header-Content-Length": str(len(header))}
    )
    assert status == 400
    assert doc["error"] == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'simple'. Expected 64, got 32"
    )
    # Both wrong (60 and 68 bytes): Triton 2.51 names the newest input (triton-peer).
    header = header.replace(b'"binary_data_size": 32', b'"binary_data_size": 60')
    header = header.replace(b'"binary_data_size": 64', b'"binary_data_size": 68')
    body = header + b"\0" * 128
    status, doc = post(
        server, "simple", body, {"Inference-Header-Content-Length": str(len(header))}
    )
    assert (status, doc["error"]) == (
        400,
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model "
        "'simple'. Expected 64, got 68",
    )


def test_binary_sizes_beyond_body(server: ShoalServer) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                },
                {
                    "name": "INPUT1",
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                },
            ]
        }
    ).encode()
    status, doc = post(
        server, "simple", header + b"\0" * 70, {"Inference-Header-Content-Length": str(len(header))}
    )
    assert status == 400
    assert doc["error"]


def test_json_nesting_depth_limit(server: ShoalServer) -> None:
    def nested(depth: int) -> object:
        value: object = [1]
        for _ in range(depth - 1):
            value = [value]
        return value

    deep = {
        "inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": nested(120)}]
    }
    status, doc = post(server, "identity_fp32", json.dumps(deep).encode())
    assert status == 400
    assert doc["error"] == "JSON nesting depth exceeds maximum allowed limit (100)"
    fine = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": nested(40)}]}
    status, doc = post(server, "identity_fp32", json.dumps(fine).encode())
    assert status == 200, doc


def test_raw_request_needs_a_single_input_model(server: ShoalServer) -> None:
    status, doc = post(server, "simple", b"\0" * 64, {"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert doc["error"] == (  # Triton 2.51's words (triton-peer)
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
        "deduced but got 2 inputs in 'simple' model configuration"
    )


def test_bytes_element_count_mismatch(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([[b"a", b"b", b"c"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    inp.set_data_from_numpy(data)
    inp.set_shape([1, 4])
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_bytes", [inp])
    assert e.value.status() == "400"
    assert "expected 4 string elements for inference input 'INPUT0'" in e.value.message()


def test_reserved_parameter_prefix(server: ShoalServer) -> None:
    status, doc = post(
        server, "simple", json.dumps(simple_json(parameters={"triton_x": 1})).encode()
    )
    assert status == 400
    assert "reserved for Triton usage" in doc["error"]


def test_body_above_max_input_size(server: ShoalServer) -> None:
    limit = 64 * 1024 * 1024
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, limit // 4 + 1],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": limit + 4},
                }
            ]
        }
    ).encode()
    body = header + bytes(limit + 4)
    status, doc = post(
        server, "identity_fp32", body, {"Inference-Header-Content-Length": str(len(header))}
    )
    assert status == 400
    assert doc["error"] == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def _int32(name: str, shape: list[int]) -> dict[str, object]:
    n = shape[0] * shape[1]
    return {"name": name, "shape": shape, "datatype": "INT32", "data": [0] * n}


_NOTE = (
    ". NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
    "dimension to be prepended to each input shape. If you want to specify the full shape "
    "including the batch dim in your input dims config, try setting max_batch_size to zero. "
    "See the model configuration docs for more info on max_batch_size."
)


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        (  # Triton's per-request checks name the request...
            {"id": "r7", "inputs": [_int32("INPUT0", [1, 16]), _int32("INPUT1", [1, 8])]},
            "[request id: r7] unexpected shape for input 'INPUT1' for model 'simple'. "
            "Expected [-1,16], got [1,8]" + _NOTE,
        ),
        (  # ...<id_unknown> when it has no id; the input count comes first, and with
            # nothing missing Triton's list closes on a lone "]"
            {
                "inputs": [
                    _int32("INPUT0", [1, 16]),
                    _int32("INPUT1", [1, 16]),
                    _int32("X", [1, 16]),
                ]
            },
            "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'simple'. "
            "Got input(s) ['X','INPUT1','INPUT0'], but missing required input(s) ]. Please "
            "provide all required input(s).",
        ),
        (  # an unknown name with the right count is not named
            {"id": "r8", "inputs": [_int32("INPUT0", [1, 16]), _int32("X", [1, 16])]},
            "unexpected inference input 'X' for model 'simple'",
        ),
    ],
)
def test_request_errors_read_as_tritons(
    server: ShoalServer, doc: dict[str, object], error: str
) -> None:
    """Checked against Triton 2.51 (triton-peer) on an identity model, 2026-12-01."""
    status, body = post(server, "simple", json.dumps(doc).encode())
    assert (status, body) == (400, {"error": error})


# Compressed bodies (Content-Encoding), decompressed by shoal, not by aiohttp.

_DOC = json.dumps(simple_json()).encode()


def _send_body_late(server: ShoalServer, head: bytes, body: bytes) -> tuple[int, object]:
    """Headers first, the body a moment later, so the handler already waits for it; the
    socket's timeout is what catches a request that is never answered."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    try:
        sock.sendall(head)
        time.sleep(0.2)
        sock.sendall(body)
        resp = http.client.HTTPResponse(sock)
        try:
            resp.begin()
            return resp.status, json.loads(resp.read())
        except TimeoutError:
            pytest.fail("no answer to a request whose body came after its headers")
    finally:
        sock.close()


@pytest.mark.parametrize("cut", [13, -1], ids=["stream-cut", "trailer-missing"])
def test_truncated_deflate_body_after_headers(server: ShoalServer, cut: int) -> None:
    body = zlib.compress(_DOC)[:cut]
    head = (
        "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: deflate\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    error = "failed to decompress the deflate request body: the compressed data is truncated"
    assert _send_body_late(server, head, body) == (400, {"error": error})


@pytest.mark.parametrize(
    ("encoding", "body", "error"),
    [
        ("gzip", b"notgzip", "failed to decompress the gzip request body: incorrect header check"),
        (
            "deflate",
            zlib.compress(_DOC) + b"xx",
            "failed to decompress the deflate request body: 2 unexpected byte(s) after the "
            "compressed data",
        ),
        ("gzip", b"", "nothing to be decompressed"),
    ],
    ids=["corrupt-gzip", "trailing-bytes", "empty"],
)
def test_undecodable_body(server: ShoalServer, encoding: str, body: bytes, error: str) -> None:
    before = len(server.log().splitlines())
    status, doc = post(server, "simple", body, {"Content-Encoding": encoding})
    assert (status, doc) == (400, {"error": error})
    assert "Traceback" not in "\n".join(server.log().splitlines()[before:])


@pytest.mark.parametrize(
    "body",
    [gzip.compress(_DOC), zlib.compress(_DOC), zlib.compress(_DOC)[2:-4]],
    ids=["gzip", "zlib", "raw-deflate"],
)
def test_compressed_body_forms(server: ShoalServer, body: bytes) -> None:
    encoding = "gzip" if body[:2] == b"\x1f\x8b" else "deflate"
    status, doc = post(server, "simple", body, {"Content-Encoding": encoding})
    assert status == 200, doc
    assert doc["outputs"][0]["data"] == [i + 1 for i in range(16)]


def test_decompressed_size_limit(server: ShoalServer) -> None:
    limit = 64 * 1024 * 1024
    status, doc = post(
        server, "simple", zlib.compress(bytes(limit + 1)), {"Content-Encoding": "deflate"}
    )
    assert (status, doc) == (
        400,
        {
            "error": f"request body decompresses to more than the maximum allowed input size of "
            f"{limit} bytes. Use --http-max-input-size to increase the limit."
        },
    )


def test_unsupported_content_encoding(server: ShoalServer) -> None:
    """Triton answers 415 with the encodings it accepts."""
    conn = http.client.HTTPConnection(server.url, timeout=10)
    conn.request(
        "POST", "/v2/models/simple/infer", body=b"xx", headers={"Content-Encoding": "zstd"}
    )
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    conn.close()
    assert resp.status == 415
    assert resp.getheader("Accept-Encoding") == "gzip, deflate"
    error = "unsupported Content-Encoding 'zstd': the server accepts gzip and deflate"
    assert doc == {"error": error}


def test_malformed_framing_logs_one_line(server: ShoalServer) -> None:
    before = len(server.log().splitlines())
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    try:
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"
        )
        resp = http.client.HTTPResponse(sock)
        resp.begin()  # aiohttp logs before it answers
        resp.read()
    finally:
        sock.close()
    assert resp.status == 400
    new = server.log().splitlines()[before:]
    assert not any("Traceback" in line for line in new), new
    http_lines = [line for line in new if "shoal.frontend.http" in line]
    assert len(http_lines) == 1, new
    assert "Invalid character in chunk size" in http_lines[0]


def test_a_body_that_stops_arriving_is_refused(tmp_path: Path) -> None:
    """aiohttp's C parser keeps a chunked framing error that comes after the headers from
    the body being read; without an idle limit that request waits as long as its client
    keeps the socket open. The limit (--http-body-timeout-secs) answers it, and a client
    that trickles its body the same way (tests/fault/test_slow_clients.py)."""
    modelgen.write_shipped_repository(tmp_path, ("simple",))
    srv = ShoalServer(tmp_path, "--http-body-timeout-secs=1", "--http-body-min-rate=0")
    try:
        head = (
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        status, doc = _send_body_late(srv, head, b'4\r\n{"in\r\nzz\r\n')
        assert (status, doc) == (400, {"error": "failed to read the request body: no data for 1 s"})
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_the_input_size_limit_holds_however_the_body_arrives(tmp_path: Path) -> None:
    """A body here whole when the handler starts is read without the idle timer; one
    still arriving goes through the timed read. The limit and its message are the same."""
    modelgen.write_shipped_repository(tmp_path, ("simple",))
    limit = 2048
    srv = ShoalServer(tmp_path, f"--http-max-input-size={limit}")
    try:
        small = json.dumps(simple_json()).encode()
        large = json.dumps(simple_json(id="x" * limit)).encode()
        error = (
            f"request JSON size of {len(large)} bytes exceeds the maximum allowed input size "
            f"of {limit} bytes. Use --http-max-input-size to increase the limit."
        )
        assert post(srv, "simple", small)[0] == 200
        assert post(srv, "simple", large) == (400, {"error": error})
        for body, expected in ((small, 200), (large, 400)):
            head = (
                "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            status, doc = _send_body_late(srv, head, body)
            assert status == expected, doc
        assert doc == {"error": error}
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _raw_exchange(server: ShoalServer, request: bytes) -> tuple[int, bytes]:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    try:
        sock.sendall(request)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, resp.read()
    finally:
        sock.close()


def test_chunked_with_a_content_length_is_served_as_triton_does(server: ShoalServer) -> None:
    """What ``requests`` sends for a chunk-encoded body it also knows the length of
    (L0_http test_content_encoding_chunked_manually): Transfer-Encoding wins, as in
    Triton; aiohttp's own parser refuses the pair. Twice on one connection: the second
    request goes through the same (lenient) parser."""
    body = json.dumps(simple_json()).encode()
    chunked = f"{len(body):X}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Length: " + str(len(chunked)).encode() + b"\r\n\r\n"
    )
    status, raw = _raw_exchange(server, head + chunked)
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == [i + 1 for i in range(16)]


@pytest.mark.parametrize(
    "body",
    [b'{"ready": 1}', b'{"ready":' + b"[" * 250_000 + b"true" + b"]" * 250_000 + b"}"],
    ids=["an int", "250000 levels deep"],
)
def test_an_index_ready_that_is_no_boolean_is_refused_by_name(
    server: ShoalServer, body: bytes
) -> None:
    """The current Triton's answer (L0_http test_repository_index_deeply_nested_json),
    however deep the member is nested; 2.51 answered INTERNAL, or the nesting depth.
    Another member nested past Triton's depth is refused for its depth, as in any
    control body (tests/fault/test_deep_json.py)."""
    status, raw = server.http("/v2/repository/index", body)
    assert (status, json.loads(raw)) == (
        400,
        {"error": "Invalid value for 'ready': expected a boolean"},
    )
    deep_other = b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b', "ready": true}'
    status, raw = server.http("/v2/repository/index", deep_other)
    assert status == 400 and "depth" in json.loads(raw)["error"], raw


@pytest.mark.parametrize(
    ("body", "twice"),
    [
        ('{"INPUT0": [1], "INPUT1": [2], "INPUT0": [3]}', "INPUT0"),
        ('{"INPUT0": [1], "INPUT1": [2], "INPUT1": [2], "INPUT0": [3]}', "INPUT1"),
        ('{"INPUT0": [1], "parameters": {"INPUT1": [2], "INPUT1": [2]}}', "INPUT1"),
    ],
)
@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_a_generate_key_written_twice_names_an_input_twice(
    server: ShoalServer, body: str, twice: str, endpoint: str
) -> None:
    """Triton reads a /generate body member by member (L0_http test_duplicate_inputs):
    the first input written twice is refused, where a dict would keep the last value."""
    body = body.replace("[1]", str(list(range(16)))).replace("[2]", str([1] * 16))
    body = body.replace("[3]", str([0] * 16))
    status, raw = server.http(f"/v2/models/simple/{endpoint}", body.encode())
    assert status == 400
    assert json.loads(raw)["error"].endswith(f"input '{twice}' already exists in request")
