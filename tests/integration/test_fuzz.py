"""Inference requests built by Hypothesis, near-valid and broken in every field, against a
real server over HTTP (raw bodies: JSON header, binary tail, header length) and gRPC (raw
ModelInferRequest messages), client shared memory included.

Whatever a client sends, the answer is a success or an error in Triton's form with one of
the statuses Triton uses, never shoal's "internal error" (an exception nothing in the
request path expected, which also logs a traceback); the server stays live. Triton's
L0_http_fuzz mutates only the request line; these go after the bodies, as
RELIABILITY_IPC.md asks. The examples are derandomized: every run sends the same ones.
"""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import identity_config
from tests.serverctl import ShoalServer
from tools import modelgen

MODELS = ["simple", "identity_bytes", "identity_fp16", "identity_nobatch", "no_such_model"]
DATATYPES = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
]  # fmt: skip
REGION, REGION_BYTES = "fuzz_region", 4096
HTTP_STATUSES = {200, 400, 404, 405, 413, 415, 500, 501, 503}
FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("fuzz-repo")
    modelgen.write_model(repo, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    for name, dt, batch in (
        ("identity_bytes", "BYTES", 8),
        ("identity_fp16", "FP16", 8),
        ("identity_nobatch", "FP32", 0),
    ):
        model = modelgen.identity_model(dt, [-1], batch=batch > 0)
        modelgen.write_model(repo, name, model, identity_config(name, dt, "[ -1 ]", batch))
    srv = ShoalServer(repo, "--allow-client-shm=true")
    region = shm.create_shared_memory_region(REGION, f"/{REGION}-{srv.http_port}", REGION_BYTES)
    client = httpclient.InferenceServerClient(srv.url)
    try:
        client.register_system_shared_memory(REGION, f"/{REGION}-{srv.http_port}", REGION_BYTES)
        yield srv
        assert srv.http_status("/v2/health/live") == 200
        log = srv.log()
        assert "unhandled error" not in log and "Traceback" not in log, log[-4000:]
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(region)
        assert srv.stop() == 0
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


# -- what a client might send --------------------------------------------------------
# A valid request for one of the models, then a few mutations: a field replaced by
# anything JSON can hold, or by an out-of-range number, or removed; the binary tail cut or
# grown; the header length off. Mostly-valid requests reach the deep checks (shapes, byte
# sizes, shared-memory bounds, BYTES layout) and the model, not only the JSON parser.

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_any = st.recursive(
    json_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
nasty_ints = st.sampled_from([-1, 0, 1, 2**31, 2**32 + 4, 2**63 - 1, 2**63, 2**64, -(2**63)])
nasty_ints |= st.integers(-8, REGION_BYTES + 64)
replacements = nasty_ints | json_any | st.sampled_from(DATATYPES) | st.text(max_size=6)

# model -> [(input, datatype, dims without the batch dim)], batching or not
SPECS: dict[str, tuple[list[tuple[str, str, list[int]]], bool]] = {
    "simple": ([("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])], True),
    "identity_bytes": ([("INPUT0", "BYTES", [-1])], True),
    "identity_fp16": ([("INPUT0", "FP16", [-1])], True),
    "identity_nobatch": ([("INPUT0", "FP32", [-1])], False),
    "no_such_model": ([("INPUT0", "FP32", [-1])], True),
}
OUTPUTS = {"simple": ["OUTPUT0", "OUTPUT1"]}
NUMPY = {"INT32": np.int32, "FP16": np.float16, "FP32": np.float32}


@st.composite
def tensor_values(draw: st.DrawFn, datatype: str, count: int) -> tuple[list[Any], bytes]:
    """``count`` valid elements: as JSON data, and in binary wire form."""
    if datatype == "BYTES":
        items = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        wire = b"".join(len(b).to_bytes(4, "little") + b for b in items)
        return [b.decode("latin-1") for b in items], wire
    if datatype == "INT32":
        values = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=count, max_size=count))
    else:
        values = draw(st.lists(st.floats(-1e4, 1e4, width=16), min_size=count, max_size=count))
    return values, np.asarray(values, dtype=NUMPY[datatype]).tobytes()


@st.composite
def valid_request(draw: st.DrawFn, model: str) -> tuple[dict[str, Any], bytes]:
    spec, batching = SPECS[model]
    batch = draw(st.integers(1, 3))
    width = draw(st.integers(1, 8))  # for the [-1] dims
    doc: dict[str, Any] = {"inputs": []}
    tail = b""
    for name, datatype, dims in spec:
        shape = ([batch] if batching else []) + [width if d < 0 else d for d in dims]
        count = int(np.prod(shape))
        values, wire = draw(tensor_values(datatype, count))
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        how = draw(st.sampled_from(["json", "binary", "shm"]))
        if how == "json":
            tensor["data"] = values
        elif how == "binary":
            tensor["parameters"] = {"binary_data_size": len(wire)}
            tail += wire
        else:  # whatever the region holds is taken as this tensor's bytes
            offset = draw(st.integers(0, 64)) * 4
            tensor["parameters"] = {
                "shared_memory_region": REGION,
                "shared_memory_offset": offset,
                "shared_memory_byte_size": len(wire),
            }
        doc["inputs"].append(tensor)
    outputs = OUTPUTS.get(model, ["OUTPUT0"])
    if draw(st.booleans()):
        doc["outputs"] = []
        for name in draw(st.lists(st.sampled_from(outputs), max_size=2)):
            params: dict[str, Any] = {"binary_data": draw(st.booleans())}
            if draw(st.booleans()):
                params = {
                    "shared_memory_region": REGION,
                    "shared_memory_offset": draw(st.integers(0, 64)) * 4,
                    "shared_memory_byte_size": draw(st.sampled_from([0, 64, 4 * width * batch])),
                }
            doc["outputs"].append({"name": name, "parameters": params})
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=6))
    if draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": draw(st.booleans())}
    return doc, tail


def _places(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document."""
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _places(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _places(value, (*path, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, doc: dict[str, Any]) -> Any:
    """``doc`` with 0 to 3 values replaced, removed, or given an extra key."""
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_places(doc)))
        if not path:
            if draw(st.integers(0, 9)) == 0:
                doc = draw(json_any)  # the whole document
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(replacements)
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(json_any)
        if not isinstance(doc, dict):
            break
    return doc


@st.composite
def http_request(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    model = draw(st.sampled_from(MODELS))
    doc, tail = draw(valid_request(model))
    doc = draw(mutated(doc))
    header = _json_bytes(doc)
    cut = draw(st.sampled_from([0, 0, 0, -1, 1, -3]))
    if cut < 0:
        tail = tail[:cut]
    elif cut > 0:
        tail += draw(st.binary(min_size=1, max_size=8))
    headers = {"Content-Type": "application/octet-stream"}
    length = draw(st.sampled_from(["exact", "exact", "exact", "absent", "off"]))
    if length == "exact" or (length == "absent" and tail):
        headers["Inference-Header-Content-Length"] = str(len(header))
    elif length == "off":
        headers["Inference-Header-Content-Length"] = str(len(header) + draw(st.integers(-4, 4)))
    return model, header + tail, headers


# An Inference-Header-Content-Length of anything a header may hold (RFC 9110: visible
# ASCII, space, tab and obs-text bytes; a control byte is a framing error aiohttp answers
# itself, docs/api.md).
header_chars = st.characters(codec="latin-1", exclude_categories=["Cc"]) | st.sampled_from("\t")
header_lengths = st.sampled_from(["absent"]) | st.integers(-3, 10**12).map(str)
header_lengths |= st.text(header_chars, max_size=4)


def _json_bytes(doc: Any) -> bytes:
    # allow_nan: tritonclient writes NaN/Infinity tokens, and so may anyone
    return json.dumps(doc, allow_nan=True).encode()


class HttpProbe:
    """One connection a request: what one request leaves behind cannot touch the next."""

    def __init__(self, url: str) -> None:
        self.url = url

    def post(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.url, timeout=30)
        try:
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def http_probe(fuzz_server: ShoalServer) -> HttpProbe:
    return HttpProbe(fuzz_server.url)


def _check_http_answer(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status in HTTP_STATUSES, (status, body[:300])
    if status != 200:
        error = json.loads(body)["error"]
        assert isinstance(error, str) and error
        event(f"{status} {error[:48]}")  # pytest --hypothesis-show-statistics lists them
        assert not error.startswith("internal error"), error
        return
    ihcl = headers.get("Inference-Header-Content-Length")
    header = body if ihcl is None else body[: int(ihcl)]
    assert "outputs" in json.loads(header)
    event("200")


@FUZZ
@given(request=http_request())
def test_http_requests_get_an_answer_in_tritons_form(
    http_probe: HttpProbe, request: tuple[str, bytes, dict[str, str]]
) -> None:
    model, body, headers = request
    _check_http_answer(*http_probe.post(f"/v2/models/{model}/infer", body, headers))


@FUZZ
@given(model=st.sampled_from(MODELS), body=st.binary(max_size=300), header_length=header_lengths)
def test_http_raw_bytes_get_an_answer_in_tritons_form(
    http_probe: HttpProbe, model: str, body: bytes, header_length: str
) -> None:
    headers = {}
    if header_length != "absent":
        headers["Inference-Header-Content-Length"] = header_length
    _check_http_answer(*http_probe.post(f"/v2/models/{model}/infer", body, headers))


# -- gRPC ----------------------------------------------------------------------------

int64s = st.integers(-3, 20) | st.integers(-(2**63), 2**63 - 1)


@st.composite
def infer_parameter(draw: st.DrawFn) -> service_pb2.InferParameter:
    p = service_pb2.InferParameter()
    kind = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64", "none"]))
    if kind == "bool":
        p.bool_param = draw(st.booleans())
    elif kind == "int64":
        p.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    elif kind == "string":
        p.string_param = draw(st.sampled_from([REGION, "unknown_region"]) | st.text(max_size=6))
    elif kind == "double":
        p.double_param = draw(st.floats())
    elif kind == "uint64":
        p.uint64_param = draw(st.integers(0, 2**64 - 1) | st.integers(0, REGION_BYTES + 8))
    return p


param_keys = st.sampled_from(
    ["shared_memory_region", "shared_memory_offset", "shared_memory_byte_size",
     "priority", "timeout", "classification", "binary_data", "sequence_id", "triton_x"]
) | st.text(max_size=5)  # fmt: skip


def _fill_params(target: Any, draw: st.DrawFn) -> None:
    for key, value in draw(st.dictionaries(param_keys, infer_parameter(), max_size=3)).items():
        target[key].CopyFrom(value)


names = st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0", ""]) | st.text(max_size=5)
TYPED = {"INT32": "int_contents", "FP32": "fp32_contents", "BYTES": "bytes_contents"}


@st.composite
def model_infer_request(draw: st.DrawFn) -> service_pb2.ModelInferRequest:
    """A valid ModelInferRequest for one of the models (raw, typed or shared-memory
    contents), then a few mutations of its fields."""
    model = draw(st.sampled_from(MODELS))
    spec, batching = SPECS[model]
    batch, width = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    req = service_pb2.ModelInferRequest(model_name=model, id=draw(st.text(max_size=4)))
    raw_mode = draw(st.booleans())  # raw contents for all inputs, or none of them
    for name, datatype, dims in spec:
        shape = ([batch] if batching else []) + [width if d < 0 else d for d in dims]
        values, wire = draw(tensor_values(datatype, int(np.prod(shape))))
        t = req.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw_mode:
            req.raw_input_contents.append(wire)
        elif datatype in TYPED and draw(st.booleans()):
            typed = [v.encode("latin-1") for v in values] if datatype == "BYTES" else values
            getattr(t.contents, TYPED[datatype]).extend(typed)
        else:
            t.parameters["shared_memory_region"].string_param = REGION
            t.parameters["shared_memory_offset"].int64_param = draw(st.integers(0, 64)) * 4
            t.parameters["shared_memory_byte_size"].int64_param = len(wire)
    for name in draw(st.lists(st.sampled_from(OUTPUTS.get(model, ["OUTPUT0"])), max_size=2)):
        o = req.outputs.add(name=name)
        if draw(st.booleans()):
            o.parameters["shared_memory_region"].string_param = REGION
            o.parameters["shared_memory_byte_size"].int64_param = 4 * batch * width
    for _ in range(draw(st.integers(0, 3))):
        _mutate(req, draw)
    return req


def _mutate(req: service_pb2.ModelInferRequest, draw: st.DrawFn) -> None:
    what = draw(
        st.sampled_from(
            ["name", "datatype", "shape", "drop", "twice", "param", "raw", "typed", "version",
             "output"]
        )
    )  # fmt: skip
    tensors = list(req.inputs)
    t = draw(st.sampled_from(tensors)) if tensors else None
    if what == "name" and t is not None:
        t.name = draw(names)
    elif what == "datatype" and t is not None:
        t.datatype = draw(st.sampled_from(DATATYPES) | st.text(max_size=4))
    elif what == "shape" and t is not None:
        t.ClearField("shape")
        t.shape.extend(draw(st.lists(int64s, max_size=4)))
    elif what == "drop" and tensors:
        del req.inputs[draw(st.integers(0, len(tensors) - 1))]
    elif what == "twice" and t is not None:
        req.inputs.add().CopyFrom(t)
    elif what == "param":
        target = draw(st.sampled_from([req, *tensors, *req.outputs])).parameters
        target[draw(param_keys)].CopyFrom(draw(infer_parameter()))
    elif what == "raw":
        raw = list(req.raw_input_contents)
        req.ClearField("raw_input_contents")
        req.raw_input_contents.extend(
            [r[: draw(st.integers(0, len(r)))] for r in raw]
            + draw(st.lists(st.binary(max_size=64), max_size=1))
        )
    elif what == "typed" and t is not None:
        t.contents.int64_contents.extend(
            draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20))
        )
    elif what == "version":
        req.model_version = draw(st.sampled_from(["1", "2", "01"]) | st.text(max_size=4))
    elif what == "output":
        o = req.outputs.add(name=draw(names))
        o.parameters[draw(param_keys)].CopyFrom(draw(infer_parameter()))


@pytest.fixture(scope="module")
def grpc_stub(fuzz_server: ShoalServer) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{fuzz_server.grpc_port}")
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


GRPC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.ALREADY_EXISTS,
}


@FUZZ
@given(req=model_infer_request())
def test_grpc_requests_get_an_answer_in_tritons_form(
    grpc_stub: service_pb2_grpc.GRPCInferenceServiceStub, req: service_pb2.ModelInferRequest
) -> None:
    try:
        resp = grpc_stub.ModelInfer(req, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in GRPC_CODES, (exc.code(), exc.details())
        event(f"{exc.code().name} {(exc.details() or '')[:48]}")
        assert exc.details() and not exc.details().startswith("internal error"), exc.details()
        return
    assert resp.model_name == req.model_name
    event("OK")
    assert len(resp.raw_output_contents) == len(resp.outputs) or not resp.raw_output_contents


def test_the_fuzzed_server_still_serves(fuzz_server: ShoalServer) -> None:
    """Placed after the fuzz tests: a correct request is answered correctly."""
    client = httpclient.InferenceServerClient(fuzz_server.url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * a)
    client.close()
    assert Path(f"/dev/shm/{REGION}-{fuzz_server.http_port}").exists()  # the client's, untouched
