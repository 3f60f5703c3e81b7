"""Inference over HTTP with the real tritonclient: every datatype, JSON and binary."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ALL_DATATYPES
from tests.serverctl import ShoalServer


@pytest.fixture(scope="module")
def client(server: ShoalServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def _simple_inputs(binary: tuple[bool, bool] = (True, True), batch: int = 1):
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 3, dtype=np.int32)
    ins = [
        httpclient.InferInput("INPUT0", [batch, 16], "INT32"),
        httpclient.InferInput("INPUT1", [batch, 16], "INT32"),
    ]
    ins[0].set_data_from_numpy(a, binary_data=binary[0])
    ins[1].set_data_from_numpy(b, binary_data=binary[1])
    return ins, a, b


@pytest.mark.parametrize("binary", [(True, True), (False, False), (False, True)])
def test_simple_sum_and_difference(
    client: httpclient.InferenceServerClient, binary: tuple[bool, bool]
) -> None:
    ins, a, b = _simple_inputs(binary)
    outs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = client.infer("simple", ins, outputs=outs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    resp = result.get_response()
    assert resp["id"] == "req-7"
    assert resp["model_name"] == "simple"
    assert resp["model_version"] == "1"


def test_all_outputs_when_none_requested(client: httpclient.InferenceServerClient) -> None:
    ins, a, b = _simple_inputs(batch=8)
    result = client.infer("simple", ins)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_requested_output_subset(client: httpclient.InferenceServerClient) -> None:
    ins, a, b = _simple_inputs()
    result = client.infer("simple", ins, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def test_query_parameters_are_ignored(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    ins, a, b = _simple_inputs()
    result = client.infer("simple", ins, query_params={"test_1": 1, "test_2": 2})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_explicit_version(client: httpclient.InferenceServerClient) -> None:
    ins, a, b = _simple_inputs()
    result = client.infer("versioned", ins, model_version="1")
    assert result.get_response()["model_version"] == "1"
    result = client.infer("versioned", ins)
    assert result.get_response()["model_version"] == "3"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_mlp_matches_in_process_onnxruntime(
    server: ShoalServer, client: httpclient.InferenceServerClient
) -> None:
    x = np.random.default_rng(0).standard_normal((32, 256)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    sess = ort.InferenceSession(str(server.repo / "mlp" / "1" / "model.onnx"))
    np.testing.assert_allclose(got, sess.run(None, {"INPUT0": x})[0], rtol=1e-5, atol=1e-5)


def _sample(datatype: str, n: int) -> np.ndarray:
    rng = np.random.default_rng(42)
    if datatype == "BOOL":
        return rng.integers(0, 2, n).astype(bool)
    if datatype == "BYTES":
        items = [b"", b"a\x00b", "h\u00e9llo".encode(), b"\x00\x01\x02\x03" * 40]
        return np.array(items * (n // 4 + 1), dtype=np.object_)[:n]
    if datatype == "BF16":
        return rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(
        datatype.replace("FP", "float").replace("UINT", "uint").replace("INT", "int").lower()
    )
    if dtype.kind == "f":
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


# tritonclient sends BF16 only as binary (Triton requires it), so BF16 has no JSON case.
@pytest.mark.parametrize(
    ("datatype", "binary"),
    [(d, b) for d in ALL_DATATYPES for b in (True, False) if b or d != "BF16"],
)
def test_every_datatype_round_trips(
    client: httpclient.InferenceServerClient, datatype: str, binary: bool
) -> None:
    if datatype == "BYTES" and not binary:
        data = np.array(
            [b"", b"plain", "h\u00e9llo".encode(), b'tab\tand"quote', b"a\x00b", b"6"],
            dtype=np.object_,
        )
    else:
        data = _sample(datatype, 12)
    data = data.reshape(3, -1)
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    got = client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out]).as_numpy("OUTPUT0")
    assert got.shape == data.shape
    if datatype == "BYTES":
        as_bytes = [x if isinstance(x, bytes) else x.encode() for x in got.reshape(-1)]
        assert as_bytes == list(data.reshape(-1))
    elif datatype == "BF16":
        np.testing.assert_array_equal(got.view(np.uint16), data.view(np.uint16))
    else:
        np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("datatype", ["INT64", "FP32", "BYTES", "BOOL", "FP16"])
def test_json_and_binary_give_identical_results(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = (
        np.array([b"x", b"yz", b"", b"0123"] * 2, dtype=np.object_)
        if datatype == "BYTES"
        else _sample(datatype, 8)
    ).reshape(2, 4)
    results = []
    for binary in (True, False):
        inp = httpclient.InferInput("INPUT0", [2, 4], datatype)
        inp.set_data_from_numpy(data, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        results.append(client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out]))
    a, b = (r.as_numpy("OUTPUT0") for r in results)
    assert a.dtype == b.dtype
    assert a.tobytes() == b.tobytes() if datatype != "BYTES" else list(a.flat) == list(b.flat)


def test_large_tensor_goes_through_shared_memory(
    client: httpclient.InferenceServerClient,
) -> None:
    data = np.random.default_rng(1).standard_normal((8, 300_000)).astype(np.float32)  # ~9.6 MB
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    got = client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(
    client: httpclient.InferenceServerClient, algorithm: str
) -> None:
    ins, a, b = _simple_inputs()
    result = client.infer(
        "simple",
        ins,
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_raw_binary_request(server: ShoalServer) -> None:
    import http.client

    data = np.arange(10, dtype=np.float32)
    conn = http.client.HTTPConnection(server.url, timeout=10)
    conn.request(
        "POST",
        "/v2/models/identity_nobatch/infer",
        body=data.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, body
    header_len = int(resp.getheader("Inference-Header-Content-Length"))
    parsed = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_len)
    np.testing.assert_array_equal(parsed.as_numpy("OUTPUT0"), data)


def test_chunked_request(server: ShoalServer) -> None:
    import http.client

    body, json_len = httpclient.InferenceServerClient.generate_request_body(_simple_inputs()[0])

    def chunks():
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    conn = http.client.HTTPConnection(server.url, timeout=10)
    conn.request(
        "POST",
        "/v2/models/simple/infer",
        body=chunks(),
        encode_chunked=True,
        headers={"Inference-Header-Content-Length": str(json_len), "Transfer-Encoding": "chunked"},
    )
    resp = conn.getresponse()
    raw = resp.read()
    assert resp.status == 200, raw
    header = resp.getheader("Inference-Header-Content-Length")
    parsed = httpclient.InferenceServerClient.parse_response_body(
        raw, header_length=int(header) if header else None
    )
    np.testing.assert_array_equal(parsed.as_numpy("OUTPUT0")[0], np.arange(16) + 3)


def test_bytes_that_onnxruntime_cannot_hold_get_a_clear_error(
    client: httpclient.InferenceServerClient,
) -> None:
    data = np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_bytes", [inp])
    assert e.value.status() == "400"
    assert "BYTES input 'INPUT0' element 1 is not valid UTF-8" in e.value.message()


@pytest.mark.parametrize("binary", [True, False])
def test_zero_element_tensor_of_two_dimensions(
    client: httpclient.InferenceServerClient, binary: bool
) -> None:
    """Triton runs a tensor with no elements; the output is empty, with its shape."""
    inp = httpclient.InferInput("INPUT0", [1, 0], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 0), dtype=np.float32), binary_data=binary)
    result = client.infer("identity_fp32", [inp])
    assert result.get_output("OUTPUT0")["shape"] == [1, 0]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
def test_non_finite_floats_travel_as_triton_writes_them(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    """Triton 2.51 reads and writes NaN, Infinity and -Infinity in JSON tensors (as
    tritonclient does); they must not turn into null or a parse error."""
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    dtype["BF16"] = ml_dtypes.bfloat16
    values = np.array([[np.inf, -np.inf, np.nan, 1.5]], dtype=dtype[datatype])
    inp = httpclient.InferInput("INPUT0", [1, 4], datatype)
    # tritonclient sends BF16 inputs only as binary data; the output is JSON for all.
    inp.set_data_from_numpy(values, binary_data=datatype == "BF16")
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    got = client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out]).as_numpy("OUTPUT0")
    assert got is not None
    np.testing.assert_array_equal(got.astype(np.float64), values.astype(np.float64))
