"""Client system shared memory with tritonclient's own utilities, over HTTP and gRPC."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from shoal.configs.devices import gpu_count
from tests.conftest import ALL_DATATYPES
from tests.integration.test_http_infer import _sample
from tests.serverctl import ShoalServer
from tools import modelgen


@pytest.fixture(scope="module")
def shm_server(model_repo: Path) -> Iterator[ShoalServer]:
    srv = ShoalServer(model_repo, "--allow-client-shm=true")
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


class Regions:
    """Client regions created for one test, always destroyed and unregistered."""

    def __init__(self, http: httpclient.InferenceServerClient) -> None:
        self.http = http
        self.handles: list[object] = []
        self.tag = secrets.token_hex(4)

    def make(self, name: str, size: int, register: bool = True) -> tuple[object, str, str]:
        key = f"/test_{self.tag}_{name}"
        handle = shm.create_shared_memory_region(f"{name}_{self.tag}", key, size)
        self.handles.append(handle)
        region = f"{name}_{self.tag}"
        if register:
            self.http.register_system_shared_memory(region, key, size)
        return handle, region, key

    def close(self) -> None:
        for h in self.handles:
            with contextlib.suppress(FileNotFoundError):  # a test may have unlinked the key
                shm.destroy_shared_memory_region(h)
        for r in self.http.get_system_shared_memory_status():
            if self.tag in r["name"]:
                self.http.unregister_system_shared_memory(r["name"])


@pytest.fixture
def regions(shm_server: ShoalServer) -> Iterator[Regions]:
    r = Regions(httpclient.InferenceServerClient(shm_server.url))
    yield r
    r.close()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, shm_server: ShoalServer) -> Any:
    if request.param == "http":
        return httpclient.InferenceServerClient(shm_server.url)
    return grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _wire(data: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return bytes(serialize_byte_tensor(data).item())
    return data.tobytes()


def test_disabled_by_default(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        http.register_system_shared_memory("r", "/whatever", 64)
    assert e.value.status() == "501"
    assert e.value.message() == (
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
        "to enable."
    )
    assert http.get_system_shared_memory_status() == []
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as g:
        grpc_client.register_system_shared_memory("r", "/whatever", 64)
    assert g.value.status() == "StatusCode.UNIMPLEMENTED"


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_round_trip_of_every_datatype(client: Any, regions: Regions, datatype: str) -> None:
    mod = _mod(client)
    data = _sample(datatype, 8).reshape(2, 4)
    payload = _wire(data, datatype)
    in_handle, in_region, _ = regions.make("in", len(payload))
    out_handle, out_region, _ = regions.make("out", len(payload))
    shm.set_shared_memory_region(
        in_handle, [serialize_byte_tensor(data) if datatype == "BYTES" else data]
    )
    inp = mod.InferInput("INPUT0", [2, 4], datatype)
    inp.set_shared_memory(in_region, len(payload))
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(out_region, len(payload))
    result = client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out])
    meta = result.get_output("OUTPUT0")
    shape = list(meta["shape"] if isinstance(meta, dict) else meta.shape)
    dt = meta["datatype"] if isinstance(meta, dict) else meta.datatype
    assert (shape, dt) == ([2, 4], datatype)
    if datatype == "BYTES":
        got = shm.get_contents_as_numpy(out_handle, np.object_, [2, 4])
        assert list(got.reshape(-1)) == list(data.reshape(-1))
    else:
        np_dtype = data.dtype
        got = shm.get_contents_as_numpy(out_handle, np_dtype, [2, 4])
        assert got.tobytes() == data.tobytes()


def test_mixed_shm_and_inline_tensors(client: Any, regions: Regions) -> None:
    mod = _mod(client)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, dtype=np.int32)
    in_handle, in_region, _ = regions.make("in", 64)
    out_handle, out_region, _ = regions.make("out", 64)
    shm.set_shared_memory_region(in_handle, [a])
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_shared_memory(in_region, 64)
    ins[1].set_data_from_numpy(b)
    outs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    outs[0].set_shared_memory(out_region, 64)
    result = client.infer("simple", ins, outputs=outs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_an_output_region_too_small_is_triton_s_internal_error(
    client: Any, regions: Regions
) -> None:
    mod = _mod(client)
    _, out_region, _ = regions.make("small", 32)
    ins = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(out_region, 32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins, outputs=[out])
    assert e.value.status() in ("500", "StatusCode.INTERNAL")
    assert e.value.message().endswith(
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
        "should be at least 64 bytes to hold the results"
    )


def test_worker_maps_the_client_region_and_the_frontend_does_not(
    shm_server: ShoalServer, regions: Regions
) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    data = np.arange(4096, dtype=np.float32).reshape(1, 4096)
    in_handle, in_region, key = regions.make("zc", data.nbytes)
    shm.set_shared_memory_region(in_handle, [data])
    inp = httpclient.InferInput("INPUT0", [1, 4096], "FP32")
    inp.set_shared_memory(in_region, data.nbytes)
    np.testing.assert_array_equal(http.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)
    worker = shm_server.worker_pid("identity_fp32")
    (frontend,) = shm_server.pids("frontend")
    assert f"/dev/shm{key}" in Path(f"/proc/{worker}/maps").read_text()
    assert f"/dev/shm{key}" not in Path(f"/proc/{frontend}/maps").read_text()


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("/", "cannot register shared memory region '{n}' - invalid shm key '/'"),
        ("///", "cannot register shared memory region '{n}' - invalid shm key '///'"),
        (
            "/triton_python_backend_shm_region_1",
            "cannot register shared memory region '{n}' with key "
            "'/triton_python_backend_shm_region_1' as the key contains the reserved prefix "
            "'triton_python_backend_shm_region_'",
        ),
        (
            "//shoal-1-front-0123456789abcdef",
            "cannot register shared memory region '{n}' with key "
            "'//shoal-1-front-0123456789abcdef' as the key contains the reserved prefix 'shoal-'",
        ),
    ],
)
def test_register_refuses_bad_keys(client: Any, key: str, message: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("badkey", key, 64)
    assert e.value.message() == message.format(n="badkey")
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_a_key_that_cannot_be_opened_is_an_internal_error(shm_server: ShoalServer) -> None:
    """Triton's shm_open failure is INTERNAL (500 / gRPC INTERNAL)."""
    http = httpclient.InferenceServerClient(shm_server.url)
    with pytest.raises(InferenceServerException) as e:
        http.register_system_shared_memory("nokey", "/no_such_key_at_all", 64)
    assert (e.value.status(), e.value.message()) == (
        "500",
        "Unable to open shared memory region: '/no_such_key_at_all'",
    )
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    with pytest.raises(InferenceServerException) as e:
        g.register_system_shared_memory("nokey", "/no_such_key_at_all", 64)
    assert e.value.status() == "StatusCode.INTERNAL"


def _make_read_only(path: Path) -> bool:
    """Whether ``path`` could be made unwritable for this user (root ignores modes)."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_a_key_the_server_cannot_write_is_refused_at_registration(
    shm_server: ShoalServer,
) -> None:
    """Triton opens the key read-write when registering: a read-only file fails there,
    not later when an output is written into it."""
    path = Path(f"/dev/shm/test_ro_{secrets.token_hex(4)}")
    path.write_bytes(bytes(64))
    try:
        if not _make_read_only(path):
            pytest.skip("cannot make a /dev/shm file read-only here")
        http = httpclient.InferenceServerClient(shm_server.url)
        with pytest.raises(InferenceServerException) as e:
            http.register_system_shared_memory("ro", f"/{path.name}", 64)
        assert (e.value.status(), e.value.message()) == (
            "500",
            f"Unable to open shared memory region: '/{path.name}'",
        )
        assert all(r["name"] != "ro" for r in http.get_system_shared_memory_status())
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        path.unlink()


def _post(
    srv: ShoalServer, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """A raw POST, for bodies tritonclient never sends (it always fills every field);
    bytes go as they are, anything else as JSON."""
    conn = http.client.HTTPConnection(srv.url, timeout=10)
    try:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=raw, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())["error"]
    finally:
        conn.close()


def test_register_requests_missing_a_field(shm_server: ShoalServer, regions: Regions) -> None:
    _, _, key = regions.make("fields", 64, register=False)
    base = "/v2/systemsharedmemory/region/fields/register"
    assert _post(shm_server, base, {"byte_size": 64}) == (
        400,
        "Shared memory register request has no 'key' field",
    )
    assert _post(shm_server, base, {"key": key, "offset": 0}) == (
        400,
        "Shared memory register request has no 'byte_size' field",
    )
    # A field of the wrong JSON type: Triton 2.51's JSON layer answers, as INTERNAL.
    for bad in (
        {"key": key, "offset": "0", "byte_size": 64},
        {"key": key, "byte_size": -1},
        {"key": key, "byte_size": 2**64},
    ):
        assert _post(shm_server, base, bad) == (
            500,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        )


def test_register_bodies_read_as_triton_s_json_layer_reads_them(
    shm_server: ShoalServer, regions: Regions
) -> None:
    """Triton's EVBufferToJson and TritonJson: a body it cannot parse (an empty one too)
    is INTERNAL; a root that is no object has no 'key'; a key that is no string is its
    AsString error."""
    _, _, key = regions.make("jsonlayer", 64, register=False)
    base = "/v2/systemsharedmemory/region/jsonlayer/register"
    for raw in (b"", b"{"):
        status, message = _post(shm_server, base, raw)
        assert status == 500
        assert message.startswith("failed to parse the request JSON buffer: ")
    assert _post(shm_server, base, [{"key": key, "byte_size": 64}]) == (
        400,
        "Shared memory register request has no 'key' field",
    )
    for bad_key in (5, None, [key]):
        assert _post(shm_server, base, {"key": bad_key, "byte_size": 64}) == (
            500,
            "attempt to access JSON non-string as string",
        )
    http_client = httpclient.InferenceServerClient(shm_server.url)
    assert http_client.get_system_shared_memory_status() == []  # nothing registered


@pytest.mark.parametrize("key", ["/a/b", "/.", "/..", "//../etc/passwd"])
def test_a_key_shm_open_refuses_is_its_open_failure(client: Any, key: str) -> None:
    """Triton hands such a key to shm_open, which refuses a '/' inside the name, '.' and
    '..': INTERNAL "Unable to open". shoal refuses it before building any path."""
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("slashed", key, 64)
    assert e.value.message() == f"Unable to open shared memory region: '{key}'"
    assert e.value.status() in ("500", "StatusCode.INTERNAL")


def test_a_binary_input_s_stray_shared_memory_parameters_are_ignored(
    shm_server: ShoalServer,
) -> None:
    """Triton reads the shared-memory parameters only of an input not sent in binary
    (ParseJsonTritonIO): an offset or byte size of any type beside binary_data_size
    changes nothing."""
    a, b = np.arange(16, dtype=np.int32), np.full(16, 2, dtype=np.int32)
    for stray in ({"shared_memory_offset": "x"}, {"shared_memory_byte_size": -5}):
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
                        "parameters": {"binary_data_size": 64, **stray},
                    },
                    {
                        "name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
                        "parameters": {"binary_data_size": 64},
                    },
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
            }
        ).encode()  # fmt: skip
        conn = http.client.HTTPConnection(shm_server.url, timeout=10)
        try:
            conn.request(
                "POST",
                "/v2/models/simple/infer",
                body=header + a.tobytes() + b.tobytes(),
                headers={"Inference-Header-Content-Length": str(len(header))},
            )
            resp = conn.getresponse()
            doc = json.loads(resp.read())
        finally:
            conn.close()
        assert resp.status == 200, doc
        assert doc["outputs"][0]["data"] == (a + b).tolist()


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        (
            {"classification": "x"},
            400,
            "Output can't set both 'shared_memory_region' and 'classification'",
        ),
        (
            {"binary_data": "x"},
            500,
            "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
    ],
)
def test_an_output_in_shared_memory_is_validated_before_its_values_are_read(
    shm_server: ShoalServer, regions: Regions, params: dict[str, object], status: int, message: str
) -> None:
    """Triton's ValidateOutputParameter runs first and only asks which members exist."""
    _, region, _ = regions.make("outorder", 64)
    body = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
            for n in ("INPUT0", "INPUT1")
        ],
        "outputs": [
            {
                "name": "OUTPUT0",
                "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 64}
                | params,
            }
        ],
    }
    assert _post(shm_server, "/v2/models/simple/infer", body) == (status, message)


def test_register_twice_and_out_of_bounds(client: Any, regions: Regions) -> None:
    _, region, key = regions.make("twice", 64)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory(region, key, 64)
    assert e.value.message() == f"shared memory region '{region}' already in manager"
    assert e.value.status() in ("400", "StatusCode.ALREADY_EXISTS")
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("too_big", key, 128)
    assert e.value.message() == "failed to register shared memory region 'too_big': invalid args"
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException, match="'bad_offset': invalid args"):
        client.register_system_shared_memory("bad_offset", key, 32, offset=48)
    for offset in (0, 64):  # nothing to map, in range: Triton 2.51's mmap words (triton-peer)
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory("empty", key, 0, offset=offset)
        assert e.value.message() == (
            "failed to register shared memory region 'empty': unable to process address "
            "spaceInvalid argument"
        )
        assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    names = _status_names(client)
    assert region in names and not {"too_big", "bad_offset", "empty"} & set(names)


@pytest.mark.parametrize(
    ("offset", "size", "message"),
    [
        (64, 64, "Invalid offset for shared memory region: '{r}'"),
        (32, 64, "Invalid offset + byte size for shared memory region: '{r}'"),
        (2**63 - 8, 64, "Invalid offset for shared memory region: '{r}'"),
    ],
)
def test_inference_references_are_bounds_checked(
    client: Any, regions: Regions, offset: int, size: int, message: str
) -> None:
    mod = _mod(client)
    _, region, _ = regions.make("bounds", 64)
    inp = mod.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory(region, size, offset=offset)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_fp32", [inp])
    assert e.value.message() == message.format(r=region)


def _output_into(region: str, size: int, offset: int) -> list[httpclient.InferRequestedOutput]:
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    out.set_shared_memory(region, size, offset=offset)
    return [out]


def _simple_inputs(mod: Any) -> list[Any]:
    ins = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return ins


def test_an_offset_past_the_region_is_reported_before_an_overflow(
    shm_server: ShoalServer, regions: Regions
) -> None:
    """Triton's test_infer_offset_out_of_bound (HTTP, offset 2**64 - 32) and
    test_infer_integer_overflow (offset 32, byte size 2**64 - 32)."""
    http = httpclient.InferenceServerClient(shm_server.url)
    _, region, _ = regions.make("oob", 64)
    with pytest.raises(InferenceServerException) as e:
        http.infer(
            "simple", _simple_inputs(httpclient), outputs=_output_into(region, 64, 2**64 - 32)
        )
    assert (e.value.status(), e.value.message()) == (
        "400",
        f"Invalid offset for shared memory region: '{region}'",
    )
    with pytest.raises(InferenceServerException) as e:
        http.infer(
            "simple", _simple_inputs(httpclient), outputs=_output_into(region, 2**64 - 32, 32)
        )
    assert e.value.message() == (
        "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds "
        f"maximum value (18446744073709551615) for region '{region}'"
    )


def test_http_shared_memory_parameters_without_a_region_are_ignored(
    shm_server: ShoalServer, regions: Regions
) -> None:
    """Triton's HTTP CheckSharedMemoryData: only 'shared_memory_region' selects shared
    memory; a lone offset or byte size is parsed and ignored (an offset used to be a 500),
    and a region without a byte size has 0 bytes."""
    http = httpclient.InferenceServerClient(shm_server.url)
    ins = _simple_inputs(httpclient)
    ins[0]._parameters["shared_memory_offset"] = 8
    ins[1]._parameters["shared_memory_byte_size"] = 64
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    out._parameters["shared_memory_offset"] = 8
    result = http.infer("simple", ins, outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.int32))
    _, region, _ = regions.make("nosize", 64)
    ins = _simple_inputs(httpclient)
    ins[0] = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    ins[0]._parameters["shared_memory_region"] = region
    with pytest.raises(InferenceServerException) as e:
        http.infer("simple", ins)
    assert e.value.status() == "400"
    assert e.value.message() == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'simple'. Expected 64, got 0"
    )


def _grpc_params(t: Any) -> Any:
    """The protobuf parameter map of a tritonclient gRPC input or requested output."""
    return t._input.parameters if hasattr(t, "_input") else t._output.parameters


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "input_offset_alone",
            "'shared_memory_offset' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'INPUT0'",
        ),
        (
            "output_size_alone",
            "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'OUTPUT0'",
        ),
        (
            "region_without_size",
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            "parameter for tensor 'INPUT0'",
        ),
        (
            "offset_as_string",
            "invalid value type for 'shared_memory_offset' parameter for tensor 'INPUT0', "
            "expected int64_param.",
        ),
        (
            "region_as_int",
            "invalid value type for 'shared_memory_region' parameter for tensor 'OUTPUT0', "
            "expected string_param.",
        ),
    ],
)
def test_grpc_shared_memory_parameters_are_checked(
    shm_server: ShoalServer, case: str, message: str
) -> None:
    """Triton's ParseSharedMemoryParams (src/grpc/infer_handler.h)."""
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    ins = _simple_inputs(grpcclient)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    if case == "input_offset_alone":
        _grpc_params(ins[0])["shared_memory_offset"].int64_param = 8
    elif case == "output_size_alone":
        _grpc_params(out)["shared_memory_byte_size"].int64_param = 64
    elif case == "region_without_size":
        ins[0]._input.ClearField("contents")
        ins[0]._raw_content = None
        _grpc_params(ins[0])["shared_memory_region"].string_param = "r"
    elif case == "offset_as_string":
        ins[0].set_shared_memory("r", 64)
        _grpc_params(ins[0])["shared_memory_offset"].string_param = "8"
    else:
        _grpc_params(out)["shared_memory_region"].int64_param = 1
        _grpc_params(out)["shared_memory_byte_size"].int64_param = 64
    with pytest.raises(InferenceServerException) as e:
        g.infer("simple", ins, outputs=[out])
    assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_status_of_unknown_regions_is_not_found(shm_server: ShoalServer, regions: Regions) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    with pytest.raises(InferenceServerException) as e:
        http.get_system_shared_memory_status("nope")
    assert (e.value.status(), e.value.message()) == (
        "404",
        "Unable to find system shared memory region: 'nope'",
    )
    with pytest.raises(InferenceServerException) as e:
        http.get_cuda_shared_memory_status("nope")
    assert e.value.message() == "Unable to find cuda shared memory region: 'nope'"
    _, region, _ = regions.make("kind", 64)
    with pytest.raises(InferenceServerException) as e:
        http.get_cuda_shared_memory_status(region)
    assert (e.value.status(), e.value.message()) == (
        "404",
        f"The region named '{region}' is registered as system shared memory, not CUDA "
        "shared memory",
    )
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    with pytest.raises(InferenceServerException) as e:
        g.get_system_shared_memory_status("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_unknown_region_and_byte_size_mismatch(client: Any, regions: Regions) -> None:
    mod = _mod(client)
    inp = mod.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory("never_registered", 64)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_fp32", [inp])
    assert e.value.message() == "Unable to find shared memory region: 'never_registered'"
    assert e.value.status() in ("404", "StatusCode.NOT_FOUND")
    _, region, _ = regions.make("mismatch", 128)
    ins = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(region, 64)
    ins[1].set_shared_memory(region, 128)
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins)
    assert e.value.message() == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model "
        "'simple'. Expected 64, got 128"
    )


def _own_client(client: Any, srv: ShoalServer) -> Any:
    """A new client of the same protocol as ``client`` (one per thread)."""
    if isinstance(client, httpclient.InferenceServerClient):
        return httpclient.InferenceServerClient(srv.url, network_timeout=30)
    return grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")


def _wait_version(srv: ShoalServer, model: str, until: Callable[[dict], bool]) -> None:
    """Poll the model's state (shoal's extension) until ``until`` holds for it."""
    deadline = time.monotonic() + 30
    while True:
        conn = http.client.HTTPConnection(srv.url, timeout=5)
        conn.request("GET", f"/v2/shoal/models/{model}")
        version = json.loads(conn.getresponse().read())["versions"][0]
        conn.close()
        if until(version):
            return
        assert time.monotonic() < deadline, f"{model} never reached the state waited for"
        time.sleep(0.02)


def _status_names(client: Any) -> list[str]:
    status = client.get_system_shared_memory_status()
    if isinstance(client, httpclient.InferenceServerClient):
        return [r["name"] for r in status]
    return list(status.regions)


def test_unregister_during_inference_is_deferred(
    client: Any, shm_server: ShoalServer, regions: Regions
) -> None:
    """Triton's test_unregister_shm_during_inference_*: unregistering regions a request
    uses succeeds, but they stay registered (listed, usable by new requests, their names
    taken) until the last request using them ends; then they go without another call.
    Once unregistered the client may unlink the keys, as tritonclient's
    destroy_shared_memory_region does: the requests still reach the objects registered."""
    mod = _mod(client)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    in_handle, in_region, in_key = regions.make("inflight_in", data.nbytes)
    out_handle, out_region, out_key = regions.make("inflight_out", data.nbytes)
    shm.set_shared_memory_region(in_handle, [data])
    worker = shm_server.worker_pid("identity_fp32")
    outcomes: list[object] = []

    def call() -> None:
        inp = mod.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_shared_memory(in_region, data.nbytes)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(out_region, data.nbytes)
        own = _own_client(client, shm_server)
        try:
            outcomes.append(own.infer("identity_fp32", [inp], outputs=[out]))
        except Exception as exc:  # asserted below
            outcomes.append(exc)
        finally:
            own.close()  # in this thread: gevent's hub cannot close it from another

    threads = [threading.Thread(target=call)]
    os.kill(worker, signal.SIGSTOP)
    try:
        threads[0].start()
        _wait_version(shm_server, "identity_fp32", lambda v: v["instances"][0]["busy"])
        client.unregister_system_shared_memory(in_region)  # succeeds while in use
        client.unregister_system_shared_memory()  # and so does unregister-all
        assert {in_region, out_region} <= set(_status_names(client))
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory(in_region, in_key, data.nbytes)
        for key in (in_key, out_key):
            os.unlink(f"/dev/shm{key}")  # the client's mappings stay
        threads.append(threading.Thread(target=call))  # a new request may still use them
        threads[1].start()
        _wait_version(shm_server, "identity_fp32", lambda v: v["queued"] == 1)
    finally:
        os.kill(worker, signal.SIGCONT)
    for t in threads:
        t.join(20)
    assert len(outcomes) == 2
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [2, 4]), data)
    deadline = time.monotonic() + 5
    while in_region in _status_names(client):
        assert time.monotonic() < deadline, "the regions were never released"
        time.sleep(0.05)
    assert out_region not in _status_names(client)
    inp = mod.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_shared_memory(in_region, data.nbytes)
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
        client.infer("identity_fp32", [inp])


def test_a_registration_keeps_its_object_whatever_the_key_names_later(
    client: Any, shm_server: ShoalServer, regions: Regions
) -> None:
    """Triton maps a region when it is registered; shoal's broker holds it open from then
    on. A client that unlinks its key, or puts another file under it, still has its
    requests read and write the object it registered, the first time a worker maps it
    included; and the worker unmaps it once it is unregistered."""
    mod = _mod(client)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    handle, region, key = regions.make("kept", 2 * data.nbytes)
    shm.set_shared_memory_region(handle, [data])
    os.unlink(f"/dev/shm{key}")  # before any worker has mapped it
    impostor = shm.create_shared_memory_region(f"impostor_{regions.tag}", key, 2 * data.nbytes)
    regions.handles.append(impostor)
    shm.set_shared_memory_region(impostor, [np.full_like(data, -1.0)])
    inp = mod.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_shared_memory(region, data.nbytes)
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(region, data.nbytes, offset=data.nbytes)
    result = client.infer("identity_fp32", [inp], outputs=[out])
    assert result.get_output("OUTPUT0") is not None
    got = shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=data.nbytes)
    np.testing.assert_array_equal(got, data)
    untouched = shm.get_contents_as_numpy(impostor, np.float32, [2, 4], offset=data.nbytes)
    assert not untouched.any()
    worker = shm_server.worker_pid("identity_fp32")
    assert _mapped_regions(worker, key)  # the unlinked object, mapped by the worker
    client.unregister_system_shared_memory(region)
    deadline = time.monotonic() + 5
    while _mapped_regions(worker, key):
        assert time.monotonic() < deadline, "the worker kept the unregistered region mapped"
        time.sleep(0.05)


def _mapped_regions(pid: int, key: str) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if line.rstrip().endswith(f"/dev/shm{key} (deleted)")]


def test_a_truncated_region_is_refused_and_the_worker_survives(
    shm_server: ShoalServer, regions: Regions
) -> None:
    """A client shrinks its shm file after the worker mapped it: touching the mapping
    would kill the worker with SIGBUS. The worker checks the file first and refuses."""
    http = httpclient.InferenceServerClient(shm_server.url)
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, dtype=np.int32)
    handle, region, key = regions.make("trunc", 16384)
    shm.set_shared_memory_region(handle, [a], offset=12288)
    shm.set_shared_memory_region(handle, [b], offset=12352)

    def infer(outputs: list[httpclient.InferRequestedOutput] | None = None) -> Any:
        ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        ins[0].set_shared_memory(region, 64, offset=12288)
        ins[1].set_shared_memory(region, 64, offset=12352)
        return http.infer("simple", ins, outputs=outputs)

    np.testing.assert_array_equal(infer().as_numpy("OUTPUT0"), a + b)  # the worker maps it
    worker = shm_server.worker_pid("simple")
    os.truncate(f"/dev/shm{key}", 0)  # the client's own handle must not be touched now
    with pytest.raises(InferenceServerException) as e:
        infer()
    assert e.value.status() == "400"
    assert f"shared memory region with key '{key}' is smaller than its registration" in (
        e.value.message()
    )
    with pytest.raises(InferenceServerException, match="smaller than its registration"):
        http.infer("simple", _simple_inputs(httpclient), outputs=_output_into(region, 64, 12416))
    assert shm_server.worker_pid("simple") == worker
    assert "restarting in" not in shm_server.log()  # no process of the server ended
    in_handle, in_region, _ = regions.make("after_trunc", 128)
    shm.set_shared_memory_region(in_handle, [a, b])
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(in_region, 64)
    ins[1].set_shared_memory(in_region, 64, offset=64)
    np.testing.assert_array_equal(http.infer("simple", ins).as_numpy("OUTPUT1"), a - b)


def test_status_and_unregister_all_over_grpc(shm_server: ShoalServer, regions: Regions) -> None:
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    _, region, key = regions.make("grpc_status", 64, register=False)
    g.register_system_shared_memory(region, key, 64)
    status = g.get_system_shared_memory_status(region)
    assert status.regions[region].key == key
    assert status.regions[region].byte_size == 64
    g.unregister_system_shared_memory(region)
    assert region not in g.get_system_shared_memory_status().regions


@pytest.mark.skipif(gpu_count() > 0, reason="the host has a GPU")
def test_cuda_registration_without_a_gpu(shm_server: ShoalServer) -> None:
    """What Triton built without GPU support answers, whatever the body holds."""
    http = httpclient.InferenceServerClient(shm_server.url)
    for handle in (b"x" * 10, b"x" * 64):
        with pytest.raises(InferenceServerException) as e:
            http.register_cuda_shared_memory("c", base64.b64encode(handle), 0, 64)
        assert (e.value.status(), e.value.message()) == (
            "400",
            "failed to register CUDA shared memory region: 'c', GPUs not supported",
        )
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    with pytest.raises(InferenceServerException) as e:
        g.register_cuda_shared_memory("c", base64.b64encode(b"x" * 64), 0, 64)
    assert (e.value.status(), e.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "failed to register CUDA shared memory region: 'c', GPUs not supported",
    )
    assert http.get_cuda_shared_memory_status() == []


@pytest.mark.parametrize("kind", ["system", "cuda"])
def test_register_without_a_region_name_is_triton_s_400(shm_server: ShoalServer, kind: str) -> None:
    """Triton's route takes the name as optional and refuses its absence (before it looks
    for a GPU); a missing route would answer 404."""
    body = {"key": "/k", "byte_size": 64, "raw_handle": {"b64": ""}, "device_id": 0}
    assert _post(shm_server, f"/v2/{kind}sharedmemory/register", body) == (
        400,
        f"'region name' is necessary to register {kind} shared memory region",
    )


def test_a_fifo_planted_as_a_key_is_refused_without_hanging(shm_server: ShoalServer) -> None:
    fifo = Path(f"/dev/shm/test_fifo_{os.getpid()}")
    os.mkfifo(fifo)
    try:
        http = httpclient.InferenceServerClient(shm_server.url, network_timeout=10)
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            http.register_system_shared_memory("fifo", f"/{fifo.name}", 64)
        assert time.monotonic() - t0 < 5
        assert e.value.message() == "failed to register shared memory region 'fifo': invalid args"
        assert http.is_server_ready()
    finally:
        fifo.unlink()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        # Triton 2.51's answers (triton-peer) to the same bytes, request id included
        (
            struct.pack("<I", 100) + b"ab" + struct.pack("<I", 1) + b"c",
            "[request id: <id_unknown>] expected 2 string elements for inference input "
            "'INPUT0' for model 'identity_bytes', got 1",
        ),
        (
            struct.pack("<I", 2) + b"ab" + b"\x01\x00",
            "[request id: <id_unknown>] incomplete string length indicator for inference "
            "input 'INPUT0' for model 'identity_bytes', expecting 4 bytes but only 2 bytes "
            "available. Please make sure the string length indicator is in one buffer.",
        ),
        (
            struct.pack("<I", 2) + b"ab" + struct.pack("<I", 100) + b"c",
            "incomplete string data for inference input 'INPUT0', expecting string of length "
            "100 but only 1 bytes available",
        ),
        (
            b"".join(struct.pack("<I", 1) + c for c in (b"a", b"b", b"c")),
            "[request id: <id_unknown>] unexpected number of string elements 3 for inference "
            "input 'INPUT0' for model 'identity_bytes', expecting 2",
        ),
    ],
)
def test_malformed_bytes_in_a_region_get_triton_s_answer(
    client: Any, shm_server: ShoalServer, regions: Regions, payload: bytes, message: str
) -> None:
    """The worker reads a BYTES input from the client's region and checks its elements
    as Triton does: the same message and status, and the worker carries on. Triton
    refuses such a request before its scheduler: it counts in no statistic."""
    mod = _mod(client)
    stats = httpclient.InferenceServerClient(shm_server.url)

    def counts() -> tuple[int, int, int]:
        (s,) = stats.get_inference_statistics("identity_bytes")["model_stats"]
        i = s["inference_stats"]
        return i["success"]["count"], i["fail"]["count"], s["execution_count"]

    handle, region, _ = regions.make("badbytes", 64)
    shm.set_shared_memory_region(handle, [np.frombuffer(payload, dtype=np.uint8)])
    worker = shm_server.worker_pid("identity_bytes")
    before = counts()
    inp = mod.InferInput("INPUT0", [1, 2], "BYTES")
    inp.set_shared_memory(region, len(payload))
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_bytes", [inp])
    assert e.value.message() == message
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    good = struct.pack("<I", 1) + b"x" + struct.pack("<I", 2) + b"yz"
    shm.set_shared_memory_region(handle, [np.frombuffer(good, dtype=np.uint8)])
    inp.set_shared_memory(region, len(good))
    assert client.infer("identity_bytes", [inp]).as_numpy("OUTPUT0").tolist() == [[b"x", b"yz"]]
    assert shm_server.worker_pid("identity_bytes") == worker
    success, fail, executions = before
    assert counts() == (success + 1, fail, executions + 1)  # the good one alone


def test_outputs_over_their_own_inputs_get_the_right_values(client: Any, regions: Regions) -> None:
    """A request may name the bytes of its inputs for its outputs (in place). The model
    must then not write an output where it still reads an input: OUTPUT0 = IN0 + IN1 over
    IN0 and OUTPUT1 = IN0 - IN1 over IN1 still come out as Triton gives them."""
    mod = _mod(client)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    handle, region, _ = regions.make("inplace", 128)
    shm.set_shared_memory_region(handle, [a, b])
    ins = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(region, 64)
    ins[1].set_shared_memory(region, 64, offset=64)
    outs = [mod.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    outs[0].set_shared_memory(region, 64)
    outs[1].set_shared_memory(region, 64, offset=64)
    client.infer("simple", ins, outputs=outs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16]), a + b)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=64), a - b
    )


def test_a_region_error_comes_before_the_model_s_checks(client: Any, regions: Regions) -> None:
    """Triton looks every region up while it parses the request, before checking the
    request against the model: with both kinds of error, the region's is the answer
    (triton-peer 2.51, both protocols)."""
    mod = _mod(client)
    inp = mod.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory("nope", 60)  # unknown, and 60 bytes is not [1, 16] FP32 either
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_fp32", [inp])
    assert e.value.message() == "Unable to find shared memory region: 'nope'"
    assert e.value.status() in ("404", "StatusCode.NOT_FOUND")
    _, region, _ = regions.make("order", 128)
    ins = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(region, 64, offset=100)  # past the region's end
    ins[1].set_shared_memory(region, 60)  # a byte-size mismatch of its own
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins)
    assert e.value.message() == f"Invalid offset + byte size for shared memory region: '{region}'"
    ins = [mod.InferInput(n, [1, 7], "INT32") for n in ("INPUT0", "INPUT1")]  # bad shape
    ins[0].set_shared_memory(region, 28)
    ins[1].set_shared_memory(region, 28, offset=64)
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("never_registered", 64)
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins, outputs=[out])
    assert e.value.message() == "Unable to find shared memory region: 'never_registered'"
    ins[1].set_shared_memory(region, 64, offset=64)  # regions fine: the model's check answers
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins)
    # both shapes are wrong: Triton 2.51 names the input it walks first, the newest
    assert "unexpected shape for input 'INPUT1' for model 'simple'" in (e.value.message() or "")


BIG = 1 << 16  # INT32 elements: 256 KiB per tensor, large enough to be written in place


@pytest.fixture(scope="module")
def big_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    """add/sub on [-1, 65536] INT32, config from auto-complete: outputs of a fixed shape
    that ONNX Runtime writes straight into the client's region."""
    repo = tmp_path_factory.mktemp("big-add-sub")
    modelgen.write_model(repo, "add_sub_big", modelgen.add_sub_model("INT32", BIG), None)
    srv = ShoalServer(repo, "--allow-client-shm=true")
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("linked", [False, True], ids=["one-key", "hard-link"])
def test_large_outputs_over_their_own_inputs_get_the_right_values(
    big_server: ShoalServer, proto: str, linked: bool
) -> None:
    """Outputs named over the request's own inputs, in the same registration or in
    another registration of the same object (a hard link: another key, one inode), are
    not written in place: OUTPUT0 = IN0 + IN1 over IN0 would spoil OUTPUT1 = IN0 - IN1."""
    http = httpclient.InferenceServerClient(big_server.url)
    client: Any = (
        http
        if proto == "http"
        else grpcclient.InferenceServerClient(f"127.0.0.1:{big_server.grpc_port}")
    )
    mod = _mod(client)
    tag = secrets.token_hex(4)
    nbytes = BIG * 4
    a = np.arange(BIG, dtype=np.int32).reshape(1, BIG)
    b = np.full((1, BIG), 3, dtype=np.int32)
    handle = shm.create_shared_memory_region(f"in_{tag}", f"/big_in_{tag}", 2 * nbytes)
    out_key = f"/big_in_{tag}"
    if linked:
        out_key = f"/big_link_{tag}"
        os.link(f"/dev/shm/big_in_{tag}", f"/dev/shm{out_key}")
    try:
        shm.set_shared_memory_region(handle, [a, b])
        http.register_system_shared_memory(f"in_{tag}", f"/big_in_{tag}", 2 * nbytes)
        http.register_system_shared_memory(f"out_{tag}", out_key, 2 * nbytes)
        ins = [mod.InferInput(n, [1, BIG], "INT32") for n in ("INPUT0", "INPUT1")]
        ins[0].set_shared_memory(f"in_{tag}", nbytes)
        ins[1].set_shared_memory(f"in_{tag}", nbytes, offset=nbytes)
        outs = [mod.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outs[0].set_shared_memory(f"out_{tag}", nbytes)
        outs[1].set_shared_memory(f"out_{tag}", nbytes, offset=nbytes)
        client.infer("add_sub_big", ins, outputs=outs)
        got = shm.get_contents_as_numpy(handle, np.int32, [2, BIG])
        np.testing.assert_array_equal(got[0], (a + b)[0])
        np.testing.assert_array_equal(got[1], (a - b)[0])
    finally:
        http.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
        if linked:
            os.unlink(f"/dev/shm{out_key}")


def test_large_outputs_in_their_own_region_are_right_and_the_model_keeps_serving(
    big_server: ShoalServer,
) -> None:
    """The common case, written in place: inputs in one region, outputs in another."""
    http = httpclient.InferenceServerClient(big_server.url)
    tag = secrets.token_hex(4)
    nbytes = BIG * 4
    a = np.arange(BIG, dtype=np.int32).reshape(1, BIG)
    b = np.full((1, BIG), 7, dtype=np.int32)
    h_in = shm.create_shared_memory_region(f"i_{tag}", f"/bi_{tag}", 2 * nbytes)
    h_out = shm.create_shared_memory_region(f"o_{tag}", f"/bo_{tag}", 2 * nbytes)
    try:
        shm.set_shared_memory_region(h_in, [a, b])
        http.register_system_shared_memory(f"i_{tag}", f"/bi_{tag}", 2 * nbytes)
        http.register_system_shared_memory(f"o_{tag}", f"/bo_{tag}", 2 * nbytes)
        for round_ in range(3):  # the same destinations again: nothing stale
            shm.set_shared_memory_region(h_in, [a + round_], offset=0)
            ins = [httpclient.InferInput(n, [1, BIG], "INT32") for n in ("INPUT0", "INPUT1")]
            ins[0].set_shared_memory(f"i_{tag}", nbytes)
            ins[1].set_shared_memory(f"i_{tag}", nbytes, offset=nbytes)
            outs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            outs[0].set_shared_memory(f"o_{tag}", nbytes)
            outs[1].set_shared_memory(f"o_{tag}", nbytes, offset=nbytes)
            http.infer("add_sub_big", ins, outputs=outs)
            got = shm.get_contents_as_numpy(h_out, np.int32, [2, BIG])
            np.testing.assert_array_equal(got[0], (a + round_ + b)[0])
            np.testing.assert_array_equal(got[1], (a + round_ - b)[0])
    finally:
        http.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
