"""The HTTP codec against bodies built and parsed by the real tritonclient."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import msgspec
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import serialize_byte_tensor

from shoal.dataplane.json_tensors import float_to_bf16_bits
from shoal.dataplane.types import InferenceResult, OutputTensor
from shoal.frontend.http_codec import (
    OutputEncoding,
    RawInputMeta,
    ResponseOptions,
    decode_infer_request,
    encode_error,
    encode_infer_response,
)
from shoal.ipc.errors import Code, RequestError, ServingError

Client = httpclient.InferenceServerClient

NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def sample(dtype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == "BYTES":
        items = [b"", b"a\x00b", "\u00e9t\u00e9".encode(), b"xyz", b'["]', b"q"] * n
        return np.array(items[:n], dtype=object).reshape(shape)
    if dtype == "BF16":
        return (np.arange(n, dtype=np.float32) * 1.25 - 3).astype(ml_dtypes.bfloat16).reshape(shape)
    np_type = NUMERIC[dtype]
    if dtype == "BOOL":
        return (np.arange(n) % 3 == 0).reshape(shape)
    info = np.iinfo(np_type) if np.issubdtype(np_type, np.integer) else None
    if info is not None:
        edges = [int(info.min), int(info.max), 0, 1, int(info.max) // 3, int(info.min) // 7]
        return np.array((edges * n)[:n], dtype=np_type).reshape(shape)
    return (np.arange(n, dtype=np.float64) * 0.5 - 1.25).astype(np_type).reshape(shape)


def wire(arr: np.ndarray) -> bytes:
    if arr.dtype == object:
        return serialize_byte_tensor(arr).item()
    return arr.tobytes()


def body_for(
    inputs: list[httpclient.InferInput], outputs: Any = None, **kw: Any
) -> tuple[bytes, int | None]:
    return Client.generate_request_body(inputs, outputs=outputs, **kw)


def decode(body: bytes | str, header_length: int | None = None, **kw: Any) -> Any:
    raw = body.encode() if isinstance(body, str) else body
    return decode_infer_request(raw, header_length, "m", "1", **kw)


def make_input(name: str, arr: np.ndarray, dtype: str, binary: bool) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, list(arr.shape), dtype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def json_input(data: Any, shape: list[int], dtype: str = "INT32", name: str = "IN") -> bytes:
    return msgspec.json.encode(
        {"inputs": [{"name": name, "shape": shape, "datatype": dtype, "data": data}]}
    )


def error_of(body: bytes | str, header_length: int | None = None, **kw: Any) -> ServingError:
    with pytest.raises(ServingError) as info:
        decode(body, header_length, **kw)
    return info.value


ALL_TYPES = [*NUMERIC, "BF16", "BYTES"]
JSON_TYPES = [t for t in ALL_TYPES if t not in ("FP16", "BF16")]  # tritonclient refuses these


@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_binary_inputs_match_numpy_bytes(dtype: str) -> None:
    a, b = sample(dtype), sample(dtype, (4,))
    body, hl = body_for([make_input("A", a, dtype, True), make_input("B", b, dtype, True)])
    req, opts = decode(body, hl)
    assert [i.name for i in req.inputs] == ["A", "B"]
    assert req.inputs[0].shape == [2, 3] and req.inputs[0].datatype == dtype
    assert bytes(req.inputs[0].data) == wire(a)
    assert bytes(req.inputs[1].data) == wire(b)
    assert "binary_data_size" not in req.inputs[0].parameters
    assert opts.default_binary is True and req.outputs == []


@pytest.mark.parametrize("dtype", JSON_TYPES)
def test_json_inputs_equal_binary_inputs(dtype: str) -> None:
    a = sample(dtype)
    jbody, jhl = body_for([make_input("A", a, dtype, False)])
    bbody, bhl = body_for([make_input("A", a, dtype, True)])
    assert jhl is None
    jreq, _ = decode(jbody, jhl)
    breq, _ = decode(bbody, bhl)
    assert bytes(jreq.inputs[0].data) == bytes(breq.inputs[0].data) == wire(a)


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
def test_half_floats_from_json_round_to_nearest(dtype: str) -> None:
    values = [0.1, -2.5, 3.14159, 65504.0, 1e-3, float(2**20) + 3]
    req, _ = decode(json_input(values, [6], dtype))
    with np.errstate(over="ignore"):  # 2**20 is out of FP16 range: inf
        if dtype == "BF16":
            expected = np.array(values, dtype=np.float32).astype(ml_dtypes.bfloat16)
        else:
            expected = np.array(values, dtype=np.float64).astype(np.float16)
    assert bytes(req.inputs[0].data) == expected.tobytes()


def test_bf16_rounding_ties_and_nan() -> None:
    f = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, np.nan, np.inf, -0.0], dtype=np.float32)
    got = float_to_bf16_bits(f)
    assert got.tobytes()[:4] == f[:2].astype(ml_dtypes.bfloat16).tobytes()
    assert np.isnan(got[2:3].view(ml_dtypes.bfloat16)).all()
    assert got[3:].tobytes() == f[3:].astype(ml_dtypes.bfloat16).tobytes()


def test_nested_and_flat_json_data_agree() -> None:
    flat, _ = decode(json_input([1, 2, 3, 4, 5, 6], [2, 3]))
    nested, _ = decode(json_input([[1, 2, 3], [4, 5, 6]], [2, 3]))
    ragged, _ = decode(json_input([[1, [2, 3]], 4, [[5], 6]], [2, 3]))
    want = np.arange(1, 7, dtype=np.int32).tobytes()
    assert bytes(flat.inputs[0].data) == bytes(nested.inputs[0].data) == want
    assert bytes(ragged.inputs[0].data) == want


def test_request_id_parameters_and_outputs() -> None:
    a = sample("INT32")
    outs = [
        httpclient.InferRequestedOutput("O0", binary_data=True),
        httpclient.InferRequestedOutput("O1", binary_data=False),
    ]
    body, hl = body_for(
        [make_input("A", a, "INT32", True)],
        outputs=outs,
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        priority=2,
        timeout=1000,
        parameters={"custom": "x", "n": 3, "f": 0.5, "flag": False},
    )
    req, opts = decode(body, hl)
    assert req.id == "req-7" and req.model == "m" and req.version == "1"
    assert req.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 1000,
        "custom": "x",
        "n": 3,
        "f": 0.5,
        "flag": False,
    }
    assert [o.name for o in req.outputs] == ["O0", "O1"]
    assert req.outputs[0].parameters == {}
    assert opts.encoding("O0").binary is True and opts.encoding("O1").binary is False
    assert opts.default_binary is False


def test_binary_data_output_governs_unlisted_outputs_only() -> None:
    body = {
        "inputs": [{"name": "A", "shape": [1], "datatype": "INT32", "data": [1]}],
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "O0"}],
    }
    _, opts = decode(json.dumps(body))
    assert opts.encoding("O0").binary is False  # listed, no binary_data: JSON
    assert opts.encoding("OTHER").binary is True
    _, opts = decode(json_input([1], [1]))
    assert opts.encoding("ANY").binary is False


def test_shared_memory_parameters_are_kept() -> None:
    inp = httpclient.InferInput("A", [2, 3], "INT32")
    inp.set_shared_memory("region0", 24, offset=8)
    out = httpclient.InferRequestedOutput("O0")
    out.set_shared_memory("out_region", 24)
    body, hl = body_for([inp], outputs=[out])
    req, opts = decode(body, hl)
    tensor = req.inputs[0]
    assert tensor.data is None
    assert tensor.parameters == {
        "shared_memory_region": "region0",
        "shared_memory_byte_size": 24,
        "shared_memory_offset": 8,
    }
    assert req.outputs[0].parameters["shared_memory_region"] == "out_region"
    assert opts.encoding("O0").binary is False


def test_empty_and_zero_sized_inputs() -> None:
    empty = np.zeros((0, 3), dtype=np.float32)
    body, hl = body_for([make_input("A", empty, "FP32", True)])
    req, _ = decode(body, hl)
    assert bytes(req.inputs[0].data) == b""
    req, _ = decode(json_input([], [0], "BYTES"))
    assert bytes(req.inputs[0].data) == b""


def test_memoryview_body_and_zero_copy_binary() -> None:
    a = sample("FP32")
    body, hl = body_for([make_input("A", a, "FP32", True)])
    req, _ = decode_infer_request(memoryview(body), hl, "m", "")
    data = req.inputs[0].data
    assert data is not None and data.obj is body


# --- raw binary requests -----------------------------------------------------------


def raw_meta(dtype: str = "FP32", dims: tuple[int, ...] = (-1,), mbs: int = 0, count: int = 1):
    return lambda: RawInputMeta("INPUT0", dtype, dims, mbs, count)


def test_raw_binary_request_deduces_shape() -> None:
    data = np.arange(8, dtype=np.float32).tobytes()
    req, opts = decode(data, 0, raw_input_meta=raw_meta())
    (tensor,) = req.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "FP32", [8])
    assert bytes(tensor.data) == data
    assert opts.default_binary is True and opts.encoding("OUT").binary is True
    req, _ = decode(data, 0, raw_input_meta=raw_meta(dims=(2, -1), mbs=4))
    assert req.inputs[0].shape == [1, 2, 4]


def test_raw_binary_bytes_gets_length_prefix() -> None:
    req, _ = decode(b"hello", 0, raw_input_meta=raw_meta("BYTES", (1,), mbs=8))
    assert req.inputs[0].shape == [1, 1]
    assert bytes(req.inputs[0].data) == b"\x05\x00\x00\x00hello"


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (
            raw_meta(count=3),
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in",
        ),
        (
            raw_meta(dims=(-1, -1)),
            "The shape of the raw input 'INPUT0' can not be deduced because there are more "
            "than one variable-sized dimension",
        ),
        (
            raw_meta("BYTES", (-1,)),
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
    ],
)
def test_raw_binary_errors(meta: Any, message: str) -> None:
    """Triton 2.51 (triton-peer) refuses them as requests: its unknown id comes first."""
    err = error_of(b"\x00" * 12, 0, raw_input_meta=meta)
    assert err.code == Code.INVALID_ARG
    assert err.message.startswith("[request id: <id_unknown>] " + message)


# --- request errors ------------------------------------------------------------------


def bad(body: Any, header_length: int | None = None) -> ServingError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return error_of(raw, header_length)


def one_input(**fields: Any) -> dict[str, Any]:
    tensor = {"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}
    tensor.update(fields)
    return {"inputs": [{k: v for k, v in tensor.items() if v is not None}]}


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        # Triton 2.51's JSON layer answers INTERNAL (HTTP 500) for every member it cannot
        # read, in its words; another root than an object has no 'inputs'.
        (b"{not json", Code.INTERNAL, "failed to parse the request JSON buffer"),
        (
            b"[1]",
            Code.INTERNAL,
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'",
        ),
        (
            one_input(shape=[2, -5]),
            Code.INTERNAL,
            "Unable to parse 'shape': attempt to access "
            "JSON non-unsigned-integer as unsigned-integer",
        ),
        (one_input(shape=[1.5]), Code.INTERNAL, "Unable to parse 'shape'"),
        (
            one_input(name=None),
            Code.INTERNAL,
            "Unable to parse 'name': attempt to access non-existing object member 'name'",
        ),
        (one_input(datatype=None), Code.INTERNAL, "Unable to parse 'datatype'"),
        (one_input(shape=None), Code.INTERNAL, "Unable to parse 'shape'"),
        ({"id": "x"}, Code.INTERNAL, "Unable to parse 'inputs'"),
        (
            {"id": 5, "inputs": []},
            Code.INTERNAL,
            "Unable to parse 'id': attempt to access JSON non-string as string",
        ),
        # where the content is, first: before the name (Triton's order)
        (one_input(name=None, data=None), Code.INVALID_ARG, "But no field is set"),
        ({"inputs": [5]}, Code.INVALID_ARG, "But no field is set"),
        (one_input(datatype="FP128"), Code.INVALID_ARG, "invalid datatype for input IN"),
        (
            one_input(shape=[2**4, 2**60 + 2], data=[1.0], datatype="FP32"),
            Code.INVALID_ARG,
            "causes total element count to exceed maximum size of",
        ),
        (
            one_input(shape=[2**2, 2**60 + 2], data=[1.0], datatype="FP32"),
            Code.INVALID_ARG,
            "byte size overflow for input",
        ),
        (
            one_input(shape=[3]),
            Code.INTERNAL,
            "Shape does not match true shape of 'data' "
            "field (unexpected number of elements for inference input 'IN'",
        ),
        (
            one_input(shape=[3], datatype="BYTES", data=["a", "b"]),
            Code.INVALID_ARG,
            "expected 3 string elements for inference input 'IN' for model 'm', got 2",
        ),
        (one_input(data=[1.5]), Code.INTERNAL, "non-signed-integer"),
        (one_input(data=[-1], datatype="UINT8"), Code.INTERNAL, "non-unsigned-integer"),
        (one_input(data=[1], datatype="BOOL"), Code.INTERNAL, "non-boolean"),
        (one_input(data=[1], datatype="BYTES"), Code.INTERNAL, "non-string"),
        (one_input(data=["x"], datatype="FP32"), Code.INTERNAL, "non-number"),
        (one_input(data=None), Code.INVALID_ARG, "But no field is set"),
        (
            one_input(data=None, parameters={"shared_memory_region": 7}),
            Code.INTERNAL,
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
        ),
        (
            one_input(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 4}),
            Code.INVALID_ARG,
            "But set 'data' 'shared_memory_region'",
        ),
        (
            one_input(data=None, parameters={"shared_memory_byte_size": 4}),
            Code.INVALID_ARG,
            "But no field is set",
        ),
        (
            {**one_input(), "outputs": [{"name": "O"}, {"name": "O"}]},
            Code.INVALID_ARG,
            "output 'O' already exists in request",
        ),
        (
            {"id": "q", "inputs": one_input()["inputs"] * 2},
            Code.INVALID_ARG,
            "[request id: q] input 'IN' already exists in request",  # Triton 2.51's words
        ),
        (
            {**one_input(), "parameters": {"triton_x": 1}},
            Code.INVALID_ARG,
            "reserved for Triton usage",
        ),
        (
            {**one_input(), "parameters": {"p": [1]}},
            Code.INVALID_ARG,
            "parameter 'p' has invalid type",
        ),
        (  # Triton 2.51 answers these from its JSON layer, as INTERNAL (triton-peer)
            {**one_input(), "parameters": {"sequence_start": 1}},
            Code.INTERNAL,
            "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean",
        ),
        (
            {**one_input(), "parameters": {"sequence_end": None}},
            Code.INTERNAL,
            "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean",
        ),
        (  # not a uint64: read as a string
            {**one_input(), "parameters": {"sequence_id": -1}},
            Code.INTERNAL,
            "Unable to parse 'sequence_id': attempt to access JSON non-string as string",
        ),
        (
            {**one_input(), "parameters": {"sequence_id": 1.5}},
            Code.INTERNAL,
            "Unable to parse 'sequence_id': attempt to access JSON non-string as string",
        ),
        (
            {**one_input(), "parameters": {"priority": -1}},
            Code.INTERNAL,
            "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            {**one_input(), "parameters": {"timeout": "5"}},
            Code.INTERNAL,
            "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "IN",
                        "shape": [1],
                        "datatype": "FP32",
                        "parameters": {"shared_memory_region": "r", "shared_memory_offset": -8},
                    }
                ]
            },
            Code.INTERNAL,
            "Unable to parse 'shared_memory_offset': attempt to access JSON "
            "non-unsigned-integer as unsigned-integer",
        ),
        (
            {**one_input(), "parameters": {"binary_data_output": "yes"}},
            Code.INTERNAL,
            "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean",
        ),
        (
            {**one_input(), "parameters": 5},
            Code.INTERNAL,
            "failed to get request params.: attempt to get members for non-object",
        ),
        (
            {**one_input(), "outputs": [{"name": "O", "parameters": {"classification": -3}}]},
            Code.INVALID_ARG,
            "Unable to set 'classification'",
        ),
        (
            {
                **one_input(),
                "outputs": [
                    {
                        "name": "O",
                        "parameters": {
                            "shared_memory_region": "r",
                            "shared_memory_byte_size": 4,
                            "binary_data": True,
                        },
                    }
                ],
            },
            Code.INVALID_ARG,
            "Output can't set both 'shared_memory_region' and 'binary_data'",
        ),
    ],
)
def test_request_errors(body: Any, code: Code, message: str) -> None:
    err = bad(body)
    assert err.code == code
    assert message in err.message


def test_classification_reaches_the_data_plane_as_a_parameter() -> None:
    body = {**one_input(), "outputs": [{"name": "O", "parameters": {"classification": 3}}]}
    req, _ = decode(json.dumps(body))
    assert req.outputs[0].parameters == {"classification": 3}


@pytest.mark.parametrize("header_length", [-1, 10**11])
def test_header_length_out_of_range(header_length: int) -> None:
    body = json_input([1], [1])
    err = bad(body, header_length)
    assert err.code == Code.INVALID_ARG
    assert err.message == (
        f"inference header size should be in range (0, {len(body)}), got: {header_length}"
    )


def test_binary_sizes_must_cover_the_body_exactly() -> None:
    a = sample("INT32")
    body, hl = body_for([make_input("A", a, "INT32", True)])
    assert "expecting 4 additional bytes" in bad(body[:-4], hl).message
    assert "unexpected additional input data for model 'm'" in bad(body + b"xx", hl).message
    # the JSON alone, no header length: no binary section (Triton 2.51's words)
    n = a.nbytes
    assert bad(body[:hl], None).message == (
        f"unexpected size for input 'A', expecting {n} additional bytes for model 'm'"
    )


def test_binary_bytes_input_is_validated_by_the_data_plane() -> None:
    # The codec only slices the bytes; the element count is checked once, for every
    # transport, by dataplane.model_handle.check_byte_size.
    from shoal.dataplane.model_handle import check_byte_size

    arr = np.array([b"ab", b"cd"], dtype=object)
    inp = make_input("S", arr, "BYTES", True)
    inp.set_shape([3])
    req, _ = decode(*body_for([inp]))
    with pytest.raises(ServingError) as e:
        check_byte_size(req.inputs[0], "m")
    assert "expected 3 string elements for inference input 'S' for model 'm', got 2" in (
        e.value.message
    )
    inp.set_shape([1])
    req, _ = decode(*body_for([inp]))
    with pytest.raises(ServingError) as e:
        check_byte_size(req.inputs[0], "m")
    assert "unexpected number of string elements 2 for inference input 'S'" in e.value.message
    truncated = {
        "inputs": [
            {"name": "S", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}
        ]
    }
    header = json.dumps(truncated).encode()
    req, _ = decode(header + b"\x09\x00\x00\x00ab", len(header))
    with pytest.raises(ServingError) as e:
        check_byte_size(req.inputs[0], "m")
    assert e.value.message == (
        "incomplete string data for inference input 'S', expecting string of length 9 but "
        "only 2 bytes available"
    )
    assert not isinstance(e.value, RequestError)  # the backend's words: no request id


def nested(depth: int, leaf: str) -> Any:
    text = leaf
    for _ in range(depth):
        text = f"[{text}]"
    return json.loads(text)


@pytest.mark.parametrize(("dtype", "leaf"), [("BYTES", '"he[l]{lo\\""'), ("INT64", "123")])
def test_json_nesting_depth_limit(dtype: str, leaf: str) -> None:
    ok, _ = decode(json_input(nested(50, leaf), [1, 1], dtype))
    assert len(bytes(ok.inputs[0].data)) > 0
    err = bad(json_input(nested(120, leaf), [1, 1], dtype))
    assert err.message == "JSON nesting depth exceeds maximum allowed limit (100)"
    err = bad(b"[" * 100_000 + b"]" * 100_000)
    assert "nesting depth exceeds" in err.message


def test_brackets_inside_strings_do_not_count_toward_depth() -> None:
    body = json_input(["[" * 300 + "\\" + "{" * 300], [1], "BYTES")
    req, _ = decode(body)
    assert bytes(req.inputs[0].data)[4:] == b"[" * 300 + b"\\" + b"{" * 300


# --- responses -----------------------------------------------------------------------


def result_for(arrays: dict[str, tuple[str, np.ndarray]], **kw: Any) -> InferenceResult:
    outputs = [
        OutputTensor(name, dtype, list(arr.shape), memoryview(wire(arr)))
        for name, (dtype, arr) in arrays.items()
    ]
    return InferenceResult("m", "1", outputs=outputs, **kw)


def parse(parts: list[bytes | memoryview], header_length: int | None) -> Any:
    body = b"".join(bytes(p) for p in parts)
    return Client.parse_response_body(body, header_length=header_length)


def check_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        as_bytes = [x.encode() if isinstance(x, str) else bytes(x) for x in got.reshape(-1)]
        assert as_bytes == [bytes(x) for x in want.reshape(-1)]
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("binary", [True, False])
def test_response_round_trips_every_datatype(binary: bool) -> None:
    arrays = {f"OUT_{t}": (t, sample(t)) for t in ALL_TYPES}
    if not binary:  # JSON strings must be valid UTF-8
        arrays["OUT_BYTES"] = (
            "BYTES",
            np.array([b"a", b"\x00b", "\u00e9".encode()] * 2, dtype=object).reshape(2, 3),
        )
    opts = ResponseOptions(default_binary=binary)
    parts, hl = encode_infer_response(result_for(arrays), opts)
    assert (hl is not None) == binary
    res = parse(parts, hl)
    for name, (_, want) in arrays.items():
        check_equal(res.as_numpy(name), want)
    response = res.get_response()
    assert response["model_name"] == "m" and response["model_version"] == "1"
    assert "id" not in response and "parameters" not in response


def test_response_mixes_binary_json_and_shm_outputs() -> None:
    a, b = sample("FP32"), sample("INT64", (4,))
    result = result_for(
        {"A": ("FP32", a), "B": ("INT64", b)}, id="r1", parameters={"triton_final_response": True}
    )
    result.outputs.append(OutputTensor("C", "FP32", [2, 2], None))
    opts = ResponseOptions(outputs={"A": OutputEncoding(binary=True), "B": OutputEncoding()})
    parts, hl = encode_infer_response(result, opts)
    assert len(parts) == 2 and hl == len(parts[0])
    res = parse(parts, hl)
    check_equal(res.as_numpy("A"), a)
    check_equal(res.as_numpy("B"), b)
    header = res.get_response()
    assert header["id"] == "r1" and header["parameters"] == {"triton_final_response": True}
    out_a, out_b, out_c = header["outputs"]
    assert out_a["parameters"] == {"binary_data_size": a.nbytes} and "data" not in out_a
    assert "parameters" not in out_b and out_b["data"] == b.tolist()
    assert out_c == {"name": "C", "datatype": "FP32", "shape": [2, 2]}


def test_json_bf16_and_invalid_utf8_outputs() -> None:
    bf = np.array([1.5, -2.0, 0.1], dtype=ml_dtypes.bfloat16)
    strings = np.array([b"\xff\xfe", b"ok"], dtype=object)
    parts, hl = encode_infer_response(
        result_for({"F": ("BF16", bf), "S": ("BYTES", strings)}), ResponseOptions()
    )
    doc = json.loads(bytes(parts[0]))
    assert hl is None and len(parts) == 1
    assert doc["outputs"][0]["data"] == bf.astype(np.float32).tolist()
    assert doc["outputs"][1]["data"] == ["\ufffd\ufffd", "ok"]


def test_response_shape_mismatch_is_internal() -> None:
    out = OutputTensor("A", "FP32", [3], memoryview(b"\x00" * 8))
    with pytest.raises(ServingError) as info:
        encode_infer_response(InferenceResult("m", "1", outputs=[out]), ResponseOptions())
    assert info.value.code == Code.INTERNAL
    assert "output tensor shape does not match size of output for 'A'" in info.value.message


def test_encode_error_escapes() -> None:
    body = encode_error('bad "quote"\n\\ \u00e9')
    assert msgspec.json.decode(body) == {"error": 'bad "quote"\n\\ \u00e9'}
    assert body.startswith(b'{"error":')


def test_ragged_nesting_depth_is_counted() -> None:
    err = bad(json_input([1, nested(120, "2")], [2]))
    assert err.message == "JSON nesting depth exceeds maximum allowed limit (100)"
    req, _ = decode(json_input([1, nested(40, "2")], [2]))
    assert bytes(req.inputs[0].data) == np.array([1, 2], dtype=np.int32).tobytes()


def test_shared_memory_parameters_follow_the_region_as_in_triton() -> None:
    # A byte size without a region is ignored: the tensor's own data is used.
    req, _ = decode(json.dumps(one_input(parameters={"shared_memory_byte_size": 4})))
    assert req.inputs[0].data is not None
    # A region without a byte size has 0 bytes (the size check then refuses it).
    req, _ = decode(json.dumps(one_input(data=None, parameters={"shared_memory_region": "r"})))
    assert req.inputs[0].data is None
    assert req.inputs[0].parameters["shared_memory_byte_size"] == 0
