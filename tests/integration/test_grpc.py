"""GRPCInferenceService with the real tritonclient.grpc (sync, async_infer, asyncio, stream)."""

from __future__ import annotations

import asyncio
import http.client
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import ALL_DATATYPES
from tests.integration.test_http_infer import _sample
from tests.serverctl import ShoalServer


@pytest.fixture(scope="module")
def url(server: ShoalServer) -> str:
    return f"127.0.0.1:{server.grpc_port}"


@pytest.fixture(scope="module")
def client(url: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url)


def simple_inputs(batch: int = 1) -> tuple[list[grpcclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 5, dtype=np.int32)
    ins = [grpcclient.InferInput(n, [batch, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins, a, b


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("simple", "7")


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("abc", "failed to get model version from specified version string 'abc' (details: stol)"),
        ("-1", "invalid model version specified '-1' "),
        ("9" * 30, f"failed to get model version from specified version string '{'9' * 30}'"),
    ],
)
def test_model_ready_refuses_what_is_no_version_as_triton(
    client: grpcclient.InferenceServerClient, version: str, message: str
) -> None:
    """Triton 2.51 (triton-peer) answers INVALID_ARGUMENT here, not ready: false."""
    with pytest.raises(InferenceServerException) as exc:
        client.is_model_ready("simple", version)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert exc.value.message().startswith(message)
    assert exc.value.message().endswith(", version should be an integral value > 0")


def test_server_metadata_and_model_config(client: grpcclient.InferenceServerClient) -> None:
    assert client.get_server_metadata().name == "triton"
    meta = client.get_model_metadata("simple")
    assert meta.name == "simple"
    assert list(meta.inputs[0].shape) == [-1, 16]
    assert meta.inputs[0].datatype == "INT32"
    cfg = client.get_model_config("simple").config
    assert cfg.name == "simple"
    assert cfg.max_batch_size == 8


def test_standard_health_service(url: str) -> None:
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_infer_with_id(client: grpcclient.InferenceServerClient) -> None:
    ins, a, b = simple_inputs(batch=4)
    result = client.infer("simple", ins, request_id="grpc-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "grpc-1"
    assert result.get_response().model_version == "1"


def test_async_infer(client: grpcclient.InferenceServerClient) -> None:
    done: queue.Queue[object] = queue.Queue()
    ins, a, b = simple_inputs()
    for _ in range(8):
        client.async_infer("simple", ins, lambda result, error: done.put(error or result))
    for _ in range(8):
        result = done.get(timeout=10)
        assert not isinstance(result, Exception), result
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_asyncio_client(url: str) -> None:
    async def run() -> list[np.ndarray]:
        async with grpcaio.InferenceServerClient(url) as aio:
            assert await aio.is_server_ready()
            reqs = []
            for i in range(16):
                inp = grpcaio.InferInput("INPUT0", [1, 4], "FP32")
                inp.set_data_from_numpy(np.full((1, 4), i, dtype=np.float32))
                reqs.append(aio.infer("identity_fp32", [inp]))
            return [r.as_numpy("OUTPUT0") for r in await asyncio.gather(*reqs)]

    outs = asyncio.run(run())
    assert [int(o[0, 0]) for o in outs] == list(range(16))


def test_stream_many_requests_in_flight_each_answered(url: str) -> None:
    """Many requests in flight on one stream, each answered; an error among them ends
    nothing (the order of the answers: tests/unit/frontend/test_grpc_stream.py)."""
    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        n = 64
        for i in range(n):
            inp = grpcclient.InferInput("INPUT0", [1, 3], "INT64")
            inp.set_data_from_numpy(np.full((1, 3), i, dtype=np.int64))
            client.async_stream_infer("identity_int64", [inp], request_id=f"r{i}")
        # An error on the stream does not end it.
        bad = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        client.async_stream_infer("identity_int64", [bad], request_id="bad")
        inp = grpcclient.InferInput("INPUT0", [1, 3], "INT64")
        inp.set_data_from_numpy(np.full((1, 3), 99, dtype=np.int64))
        client.async_stream_infer("identity_int64", [inp], request_id="after")
        got = [answers.get(timeout=20) for _ in range(n + 2)]
    finally:
        client.stop_stream()
    errors = [r for r in got if isinstance(r, InferenceServerException)]
    assert len(errors) == 1
    assert "data-type is 'FP32', but model 'identity_int64' expects 'INT64'" in str(errors[0])
    by_id = {r.get_response().id: r for r in got if not isinstance(r, Exception)}
    assert sorted(by_id) == sorted([f"r{i}" for i in range(n)] + ["after"])
    for i in range(n):
        assert int(by_id[f"r{i}"].as_numpy("OUTPUT0")[0, 0]) == i
    assert int(by_id["after"].as_numpy("OUTPUT0")[0, 0]) == 99


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_every_datatype_raw(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = _sample(datatype, 12).reshape(3, 4)
    inp = grpcclient.InferInput("INPUT0", [3, 4], datatype)
    inp.set_data_from_numpy(data)
    got = client.infer(f"identity_{datatype.lower()}", [inp]).as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert list(got.reshape(-1)) == list(data.reshape(-1))
    elif datatype == "BF16":
        np.testing.assert_array_equal(got.view(np.uint16), data.view(np.uint16))
    else:
        np.testing.assert_array_equal(got, data)


_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _raw_stub(url: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))


def _refusal(url: str, req: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    """The status a ModelInfer of ``req`` is refused with (it must be refused)."""
    with pytest.raises(grpc.RpcError) as e:
        _raw_stub(url).ModelInfer(req)
    return e.value.code(), e.value.details()


@pytest.mark.parametrize("datatype", sorted(_TYPED_FIELD))
def test_typed_contents_of_every_type(url: str, datatype: str) -> None:
    data = _sample(datatype, 6).reshape(2, 3)
    req = service_pb2.ModelInferRequest(model_name=f"identity_{datatype.lower()}")
    t = req.inputs.add(name="INPUT0", datatype=datatype, shape=[2, 3])
    getattr(t.contents, _TYPED_FIELD[datatype]).extend(data.reshape(-1).tolist())
    resp = _raw_stub(url).ModelInfer(req)
    assert len(resp.raw_output_contents) == 1
    assert not resp.outputs[0].HasField("contents")
    out = grpcclient.InferResult(resp).as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert list(out.reshape(-1)) == list(data.reshape(-1))
    else:
        np.testing.assert_array_equal(out, data)


def test_mixed_raw_and_typed_contents_refused(url: str) -> None:
    req = service_pb2.ModelInferRequest(model_name="simple")
    t0 = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    t0.contents.int_contents.extend(range(16))
    req.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    assert _refusal(url, req) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'simple'",
    )


_ONES = np.ones(16, dtype=np.int32).tobytes()


def _typed(req: service_pb2.ModelInferRequest, name: str, datatype: str, **fields: list) -> None:
    t = req.inputs.add(name=name, datatype=datatype, shape=[1, 16])
    for field, values in fields.items():
        getattr(t.contents, field).extend(values)


def _raw_input(
    req: service_pb2.ModelInferRequest, name: str, shape: list[int], datatype: str
) -> None:
    req.inputs.add(name=name, datatype=datatype, shape=shape)
    req.raw_input_contents.append(_ONES)


def _ints(req: service_pb2.ModelInferRequest) -> None:
    _typed(req, "INPUT1", "INT32", int_contents=list(range(16)))


def _typed_wrong_field(req: service_pb2.ModelInferRequest) -> None:
    _typed(req, "INPUT0", "INT32", fp32_contents=[1.0] * 16)
    _ints(req)


def _typed_two_fields(req: service_pb2.ModelInferRequest) -> None:
    _typed(req, "INPUT0", "INT32", int_contents=list(range(16)), fp32_contents=[1.0] * 16)
    _ints(req)


def _typed_unknown_datatype(req: service_pb2.ModelInferRequest) -> None:
    _typed(req, "INPUT0", "BOGUS", int_contents=list(range(16)))
    _ints(req)


def _no_data(req: service_pb2.ModelInferRequest) -> None:
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    _ints(req)


def _raw_unknown_datatype(req: service_pb2.ModelInferRequest) -> None:
    _raw_input(req, "INPUT0", [1, 16], "BOGUS")
    _raw_input(req, "INPUT1", [1, 16], "INT32")


def _raw_too_few(req: service_pb2.ModelInferRequest) -> None:
    _raw_input(req, "INPUT0", [1, 16], "INT32")
    req.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])


def _negative_dim(req: service_pb2.ModelInferRequest) -> None:
    _raw_input(req, "INPUT0", [1, 16], "INT32")
    _raw_input(req, "INPUT1", [1, -1], "INT32")


def _zero_batch_beside_a_real_one(req: service_pb2.ModelInferRequest) -> None:
    _raw_input(req, "INPUT0", [2, 16], "INT32")
    req.raw_input_contents[0] = _ONES * 2
    _raw_input(req, "INPUT1", [0, 16], "INT32")
    req.raw_input_contents[1] = b""


def _batch_mismatch(req: service_pb2.ModelInferRequest) -> None:
    _raw_input(req, "INPUT0", [1, 16], "INT32")
    _raw_input(req, "INPUT1", [2, 16], "INT32")
    req.raw_input_contents[1] = _ONES * 2


_PREFIX = "[request id: <id_unknown>] "


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            _typed_wrong_field,
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple' of "
            "type 'FP32', expected datatype 'INT32'",
        ),
        (
            _typed_two_fields,
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple', "
            "binary data was already supplied.",
        ),
        (
            _typed_unknown_datatype,
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple' of "
            "type 'INT32', expected datatype '<invalid>'",
        ),
        (
            _no_data,
            "unable to find data for input tensor 'INPUT0' for model 'simple' in request.",
        ),
        (
            _raw_too_few,
            "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",
        ),
        (
            _raw_unknown_datatype,
            _PREFIX + "inference input 'INPUT0' data-type is '<invalid>', but model 'simple' "
            "expects 'INT32'",
        ),
        (
            _negative_dim,
            _PREFIX + "All input dimensions should be specified for input 'INPUT1' for model "
            "'simple', got [1,-1]",
        ),
        (
            _batch_mismatch,
            _PREFIX + "input 'INPUT0' batch size does not match other inputs for 'simple'",
        ),
        (  # held to the request's batch, as Triton holds it: never run at its own 0
            _zero_batch_beside_a_real_one,
            _PREFIX + "input byte size mismatch for input 'INPUT1' for model 'simple'. "
            "Expected 128, got 0",
        ),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else "",
)
def test_input_data_refused_in_triton_s_words(
    url: str, build: Callable[[service_pb2.ModelInferRequest], None], message: str
) -> None:
    """Each answer as Triton 2.51 gives it (triton-peer, same bytes)."""
    req = service_pb2.ModelInferRequest(model_name="simple")
    build(req)
    assert _refusal(url, req) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_narrow_integers_keep_the_low_bytes_and_extra_raw_contents_are_ignored(
    url: str,
) -> None:
    """As Triton 2.51: an INT8 taken from int_contents keeps each value's low byte; raw
    contents beyond the inputs are not read."""
    req = service_pb2.ModelInferRequest(model_name="identity_int8")
    _typed(req, "INPUT0", "INT8", int_contents=[1, 255, 256, -129] * 4)
    req.outputs.add(name="OUTPUT0")
    resp = _raw_stub(url).ModelInfer(req)
    assert [o.name for o in resp.outputs] == ["OUTPUT0"]
    out = np.frombuffer(resp.raw_output_contents[0], dtype=np.int8)
    np.testing.assert_array_equal(out, [1, -1, 0, 127] * 4)
    req = _simple_request()
    req.raw_input_contents.append(b"not read")
    resp = _raw_stub(url).ModelInfer(req)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.int32), [2] * 16)


def test_parameters_are_accepted(client: grpcclient.InferenceServerClient) -> None:
    ins, a, b = simple_inputs()
    result = client.infer("simple", ins, parameters={"custom": "x", "n": 3, "flag": True})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def _simple_request(**params: int) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    for key, value in params.items():
        req.parameters[key].int64_param = value
    return req


def test_negative_int64_priority_and_timeout_mean_the_defaults(url: str) -> None:
    # Triton reads them into uint64s: -1 is a level that does not exist (the default
    # level) and a timeout too long to shorten anything.
    reply = _raw_stub(url).ModelInfer(_simple_request(priority=-1, timeout=-1))
    out = np.frombuffer(reply.raw_output_contents[0], dtype=np.int32)
    np.testing.assert_array_equal(out, np.full(16, 2))


@pytest.mark.parametrize(
    ("key", "kind", "expected"),
    [
        ("priority", "string_param", "int64_param or uint64_param"),
        ("timeout", "uint64_param", "int64_param"),
        ("sequence_id", "uint64_param", "int64_param or string_param"),
        ("sequence_start", "int64_param", "bool_param"),
        ("custom", "uint64_param", "int64_param, bool_param, or string_param"),
    ],
)
def test_parameters_of_the_wrong_kind_are_refused(
    url: str, key: str, kind: str, expected: str
) -> None:
    req = _simple_request()
    setattr(req.parameters[key], kind, "1" if kind == "string_param" else 1)
    assert _refusal(url, req) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invalid value type for '{key}' parameter, expected {expected}.",
    )


def test_triton_parameter_keys_are_reserved_but_one(url: str) -> None:
    req = _simple_request()
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    req.parameters["ratio"].double_param = 0.5
    assert _raw_stub(url).ModelInfer(req).outputs
    req.parameters["triton_x"].int64_param = 1
    assert _refusal(url, req) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response",
    )


@pytest.mark.parametrize(
    ("model", "version", "code", "message"),
    [
        (
            "nope",
            "",
            grpc.StatusCode.NOT_FOUND,  # Triton 2.51's (checked side by side)
            "Request for unknown model: 'nope' is not found",
        ),
        (
            "versioned",
            "2",
            grpc.StatusCode.NOT_FOUND,
            "Request for unknown model: 'versioned' version 2 is not found",
        ),
        (
            "simple",
            "wrong_specification",
            grpc.StatusCode.INVALID_ARGUMENT,
            "failed to get model version from specified version string 'wrong_specification' "
            "(details: stol), version should be an integral value > 0",
        ),
        (
            "simple",
            "-1",
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
    ],
)
def test_error_codes(
    url: str, model: str, version: str, code: grpc.StatusCode, message: str
) -> None:
    ins, _, _ = simple_inputs()
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for i in ins:
        req.inputs.add(name=i.name(), datatype="INT32", shape=[1, 16])
        req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    assert _refusal(url, req) == (code, message)


def test_an_unknown_model_is_the_answer_before_its_tensors_are_read(url: str) -> None:
    """Triton looks the model up first: a request with broken contents gets the unknown
    model, not the contents' error."""
    req = service_pb2.ModelInferRequest(model_name="nope")
    req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16]).contents.int_contents.append(1)
    req.raw_input_contents.append(b"\0" * 64)  # raw and typed contents: refused for a model
    assert _refusal(url, req) == (
        grpc.StatusCode.NOT_FOUND,  # Triton 2.51's (checked side by side)
        "Request for unknown model: 'nope' is not found",
    )


def test_bad_shape_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    ins = [grpcclient.InferInput(n, [2, 8], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((2, 8), dtype=np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins, request_id="g1")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message().startswith(  # both wrong: Triton names the newest (2.51)
        "[request id: g1] unexpected shape for input 'INPUT1' for model 'simple'. Expected "
        "[-1,16], got [2,8]. NOTE: Setting a non-zero max_batch_size"
    )


def test_large_tensor_over_grpc(client: grpcclient.InferenceServerClient) -> None:
    data = np.random.default_rng(3).standard_normal((2, 3_000_000)).astype(np.float32)  # 24 MB
    inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES", "INT8", "BOOL", "FP16"])
def test_http_and_grpc_outputs_are_byte_identical(
    server: ShoalServer, client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    data = _sample(datatype, 8).reshape(2, 4)
    ginp = grpcclient.InferInput("INPUT0", [2, 4], datatype)
    ginp.set_data_from_numpy(data)
    gresp = client.infer(f"identity_{datatype.lower()}", [ginp]).get_response()
    hinp = httpclient.InferInput("INPUT0", [2, 4], datatype)
    hinp.set_data_from_numpy(data)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    body, json_len = httpclient.InferenceServerClient.generate_request_body([hinp], [out])
    conn = http.client.HTTPConnection(server.url, timeout=10)
    conn.request(
        "POST",
        f"/v2/models/identity_{datatype.lower()}/infer",
        body=body,
        headers={"Inference-Header-Content-Length": str(json_len)},
    )
    resp = conn.getresponse()
    raw = resp.read()
    header_len = int(resp.getheader("Inference-Header-Content-Length"))
    assert gresp.raw_output_contents[0] == raw[header_len:]


def test_concurrent_clients_from_threads(url: str) -> None:
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            c = grpcclient.InferenceServerClient(url)
            for _ in range(10):
                ins, a, b = simple_inputs(batch=1 + k % 8)
                np.testing.assert_array_equal(c.infer("simple", ins).as_numpy("OUTPUT0"), a + b)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


def test_a_cancelled_request_never_corrupts_the_next(server: ShoalServer, url: str) -> None:
    import os
    import signal

    client = grpcclient.InferenceServerClient(url)
    worker = server.worker_pid("identity_fp32")
    os.kill(worker, signal.SIGSTOP)  # A will still be waiting when its deadline passes
    done: queue.Queue[object] = queue.Queue()
    try:
        a = grpcclient.InferInput("INPUT0", [1, 8192], "FP32")
        a.set_data_from_numpy(np.full((1, 8192), -1.0, dtype=np.float32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("identity_fp32", [a], client_timeout=0.3)
        assert "Deadline" in str(e.value) or "DEADLINE" in str(e.value)
        # C is bigger: had A's slots been freed, C's input would sit where A's output
        # is about to be written.
        expected = np.arange(16384, dtype=np.float32).reshape(1, 16384)
        c = grpcclient.InferInput("INPUT0", [1, 16384], "FP32")
        c.set_data_from_numpy(expected)
        client.async_infer("identity_fp32", [c], lambda result, error: done.put(error or result))
        time.sleep(0.3)
    finally:
        os.kill(worker, signal.SIGCONT)
    result = done.get(timeout=20)
    assert not isinstance(result, Exception), result
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)


@pytest.mark.parametrize(
    ("model", "version", "message"),
    [
        ("nope", "", "requested model 'nope' is not available"),
        ("versioned", "2", "requested model version is not available for model 'versioned'"),
    ],
)
def test_stats_errors_are_invalid_argument(
    client: grpcclient.InferenceServerClient, model: str, version: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics(model, version)
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_stats_without_a_model_ignore_the_version(
    client: grpcclient.InferenceServerClient,
) -> None:
    every = client.get_inference_statistics().model_stats
    assert {(s.name, s.version) for s in every} >= {("versioned", "1"), ("versioned", "3")}
    same = client.get_inference_statistics("", "3").model_stats
    assert [(s.name, s.version) for s in same] == [(s.name, s.version) for s in every]


def test_a_duplicate_input_is_refused_as_triton_does(url: str) -> None:
    req = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT0"):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    # Triton's words (2.51): the request names itself
    assert _refusal(url, req) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] input 'INPUT0' already exists in request",
    )


def test_an_output_named_twice_is_refused_as_the_current_triton_does(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Triton's L0_grpc GrpcTest: refused (2.51 served it once), and the server lives."""
    ins, _, _ = simple_inputs()
    outs = [grpcclient.InferRequestedOutput("OUTPUT0") for _ in range(2)]
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins, outputs=outs)
    assert (e.value.status(), e.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "output 'OUTPUT0' already exists in request",
    )
    assert client.is_server_live()


@pytest.mark.parametrize("version", ["²", "\u0661", "9" * 5000])  # \u0661: Arabic-Indic 1
def test_version_strings_python_reads_as_numbers_are_refused(
    client: grpcclient.InferenceServerClient, version: str
) -> None:
    inp = grpcclient.InferInput("INPUT0", [1, 3], "INT64")
    inp.set_data_from_numpy(np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_int64", [inp], model_version=version)
    assert (e.value.status(), e.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        f"failed to get model version from specified version string '{version}' "
        "(details: stol), version should be an integral value > 0",
    )


def test_a_bad_version_on_a_stream_answers_that_request_only(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for version, rid in (("²", "bad"), ("", "good")):
            inp = grpcclient.InferInput("INPUT0", [1, 3], "INT64")
            inp.set_data_from_numpy(np.full((1, 3), 7, dtype=np.int64))
            client.async_stream_infer(
                "identity_int64", [inp], model_version=version, request_id=rid
            )
        bad, good = (answers.get(timeout=20) for _ in range(2))
    finally:
        client.stop_stream()
    assert isinstance(bad, InferenceServerException)
    assert "failed to get model version from specified version string '²'" in str(bad)
    assert int(good.as_numpy("OUTPUT0")[0, 0]) == 7


@pytest.mark.parametrize("shape", [[1, 0], [2, 0]])
def test_zero_element_tensors_round_trip(
    client: grpcclient.InferenceServerClient, shape: list[int]
) -> None:
    inp = grpcclient.InferInput("INPUT0", shape, "FP32")
    inp.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
    out = client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
    assert out.shape == tuple(shape)


def test_classification_parameter_must_be_an_int64(url: str) -> None:
    req = _simple_request()
    out = req.outputs.add(name="OUTPUT0")
    out.parameters["classification"].string_param = "2"
    assert _refusal(url, req) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for 'classification' parameter, expected int64_param.",
    )


def _raw(
    channel: grpc.Channel, method: str, service: str = "inference.GRPCInferenceService"
) -> Callable[..., Any]:
    """A call of ``method`` with request bytes as given; a streamed answer comes as a list."""
    path = f"/{service}/{method}"
    if method == "Watch":  # grpc.health.v1's only response-streaming method
        stream = channel.unary_stream(
            path, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        return lambda request, **kw: list(stream(request, **kw))
    return channel.unary_unary(
        path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


@pytest.mark.parametrize(
    ("service", "method"),
    [
        ("inference.GRPCInferenceService", "ModelInfer"),
        ("inference.GRPCInferenceService", "ServerLive"),
        ("inference.GRPCInferenceService", "SystemSharedMemoryRegister"),
        ("inference.GRPCInferenceService", "RepositoryIndex"),
        ("inference.GRPCInferenceService", "TraceSetting"),
        ("grpc.health.v1.Health", "Check"),
        ("grpc.health.v1.Health", "Watch"),
    ],
)
def test_an_unparsable_message_is_refused_as_triton_does(
    server: ShoalServer, url: str, service: str, method: str
) -> None:
    seen = len(server.log())
    with grpc.insecure_channel(url) as channel:
        for garbage in (b"\xff\xff\xff", b"\x0a\x05ab"):  # a bad tag, a truncated field
            with pytest.raises(grpc.RpcError) as e:
                _raw(channel, method, service)(garbage, timeout=10)
            assert (e.value.code(), e.value.details()) == (
                grpc.StatusCode.INTERNAL,
                "Unable to parse request",
            )
        assert _raw(channel, "ServerLive")(b"", timeout=10) == b"\x08\x01"  # still serving
    log = server.log()[seen:]
    assert log.count(f"/{service}/{method}: Unable to parse request (DecodeError") == 2
    assert "Traceback" not in log  # grpcio would log one for each


@pytest.mark.parametrize(
    ("service", "method", "request_bytes"),
    [("grpc.health.v1.Health", "Watch", b"")],
)
def test_a_method_shoal_does_not_implement_says_so_without_a_traceback(
    server: ShoalServer, url: str, service: str, method: str, request_bytes: bytes
) -> None:
    seen = len(server.log())
    with grpc.insecure_channel(url) as channel, pytest.raises(grpc.RpcError) as e:
        _raw(channel, method, service)(request_bytes, timeout=10)
    assert (e.value.code(), e.value.details()) == (
        grpc.StatusCode.UNIMPLEMENTED,
        f"/{service}/{method} is not implemented",
    )
    assert "Traceback" not in server.log()[seen:]


def test_a_stream_error_carries_the_request_id_and_nothing_else(url: str) -> None:
    """As Triton 2.51 (triton-peer): the stream goes on; the error's infer_response holds
    only the id, so a client with many requests in flight can match it."""
    bad = _simple_request()
    bad.id = "bad"
    bad.inputs[1].shape[1] = 8
    good = _simple_request()
    good.id = "good"
    answers = list(_raw_stub(url).ModelStreamInfer(iter([bad, good]), timeout=30))
    by_id = {a.infer_response.id: a for a in answers}
    assert set(by_id) == {"bad", "good"}
    error = by_id["bad"]
    assert error.error_message.startswith(
        "[request id: bad] unexpected shape for input 'INPUT1' for model 'simple'."
    )
    assert error.infer_response == service_pb2.ModelInferResponse(id="bad")
    assert by_id["good"].error_message == ""
    assert by_id["good"].infer_response.model_name == "simple"


def test_an_unparsable_message_ends_a_stream_after_the_answers_before_it(url: str) -> None:
    good = service_pb2.ModelInferRequest(model_name="identity_int64", id="first")
    good.inputs.add(name="INPUT0", datatype="INT64", shape=[1, 3])
    good.raw_input_contents.append(np.full(3, 4, dtype=np.int64).tobytes())
    with grpc.insecure_channel(url) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda b: b,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        call = stream(iter([good.SerializeToString(), b"\xff\xff", good.SerializeToString()]))
        answers = []
        with pytest.raises(grpc.RpcError) as e:
            for answer in call:
                answers.append(answer)
    assert (e.value.code(), e.value.details()) == (
        grpc.StatusCode.INTERNAL,
        "Unable to parse request",
    )
    assert [(a.error_message, a.infer_response.id) for a in answers] == [("", "first")]
    out = np.frombuffer(answers[0].infer_response.raw_output_contents[0], dtype=np.int64)
    assert out.tolist() == [4, 4, 4]
