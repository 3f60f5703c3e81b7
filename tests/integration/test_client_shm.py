"""Client system shared memory with tritonclient's own utilities, over HTTP and gRPC."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.conftest import ALL_DATATYPES
from tests.integration.test_http_infer import _sample
from tests.serverctl import ShoalServer


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
def client(request: pytest.FixtureRequest, shm_server: ShoalServer) -> object:
    if request.param == "http":
        return httpclient.InferenceServerClient(shm_server.url)
    return grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")


def _mod(client: object) -> object:
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
def test_round_trip_of_every_datatype(client: object, regions: Regions, datatype: str) -> None:
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


def test_mixed_shm_and_inline_tensors(client: object, regions: Regions) -> None:
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
        ("/no_such_key_at_all", "Unable to open shared memory region: '/no_such_key_at_all'"),
    ],
)
def test_register_refuses_bad_keys(shm_server: ShoalServer, key: str, message: str) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    with pytest.raises(InferenceServerException) as e:
        http.register_system_shared_memory("badkey", key, 64)
    assert e.value.message() == message.format(n="badkey")
    assert e.value.status() == "400"


def test_register_twice_and_out_of_bounds(shm_server: ShoalServer, regions: Regions) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    _, region, key = regions.make("twice", 64)
    with pytest.raises(InferenceServerException) as e:
        http.register_system_shared_memory(region, key, 64)
    assert e.value.message() == f"shared memory region '{region}' already in manager"
    with pytest.raises(InferenceServerException) as e:
        http.register_system_shared_memory("too_big", key, 128)
    assert e.value.message() == "failed to register shared memory region 'too_big': invalid args"
    with pytest.raises(InferenceServerException):
        http.register_system_shared_memory("bad_offset", key, 32, offset=48)
    names = [r["name"] for r in http.get_system_shared_memory_status()]
    assert "too_big" not in names and "bad_offset" not in names
    assert http.get_system_shared_memory_status(region)[0]["byte_size"] == 64


@pytest.mark.parametrize(
    ("offset", "size", "message"),
    [
        (64, 64, "Invalid offset for shared memory region: '{r}'"),
        (32, 64, "Invalid offset + byte size for shared memory region: '{r}'"),
        (2**63 - 8, 64, "Integer overflow detected"),
    ],
)
def test_inference_references_are_bounds_checked(
    client: object, regions: Regions, offset: int, size: int, message: str
) -> None:
    mod = _mod(client)
    _, region, _ = regions.make("bounds", 64)
    inp = mod.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory(region, size, offset=offset)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_fp32", [inp])
    assert message.format(r=region) in e.value.message()


def test_unknown_region_and_byte_size_mismatch(client: object, regions: Regions) -> None:
    mod = _mod(client)
    inp = mod.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory("never_registered", 64)
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_fp32", [inp])
    assert "Unable to find system shared memory region: 'never_registered'" in e.value.message()
    _, region, _ = regions.make("mismatch", 128)
    ins = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    ins[0].set_shared_memory(region, 64)
    ins[1].set_shared_memory(region, 128)
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", ins)
    assert e.value.message() == (
        "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128"
    )


def test_unregister_during_inference_is_deferred(shm_server: ShoalServer, regions: Regions) -> None:
    http = httpclient.InferenceServerClient(shm_server.url, network_timeout=30)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    in_handle, in_region, _ = regions.make("inflight_in", data.nbytes)
    out_handle, out_region, _ = regions.make("inflight_out", data.nbytes)
    shm.set_shared_memory_region(in_handle, [data])
    worker = shm_server.worker_pid("identity_fp32")
    os.kill(worker, signal.SIGSTOP)
    outcome: dict[str, object] = {}

    def call() -> None:
        inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_shared_memory(in_region, data.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(out_region, data.nbytes)
        own = httpclient.InferenceServerClient(shm_server.url, network_timeout=30)  # per thread
        try:
            outcome["result"] = own.infer("identity_fp32", [inp], outputs=[out])
        except Exception as exc:  # asserted below
            outcome["result"] = exc

    t = threading.Thread(target=call)
    t.start()
    try:
        time.sleep(0.5)
        http.unregister_system_shared_memory(in_region)  # succeeds while in use
        http.unregister_system_shared_memory(out_region)
        names = [r["name"] for r in http.get_system_shared_memory_status()]
        assert in_region not in names and out_region not in names
    finally:
        os.kill(worker, signal.SIGCONT)
    t.join(20)
    assert not isinstance(outcome["result"], Exception), outcome["result"]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [2, 4]), data)
    inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_shared_memory(in_region, data.nbytes)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory"):
        http.infer("identity_fp32", [inp])


def test_status_and_unregister_all_over_grpc(shm_server: ShoalServer, regions: Regions) -> None:
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{shm_server.grpc_port}")
    _, region, key = regions.make("grpc_status", 64, register=False)
    g.register_system_shared_memory(region, key, 64)
    status = g.get_system_shared_memory_status(region)
    assert status.regions[region].key == key
    assert status.regions[region].byte_size == 64
    g.unregister_system_shared_memory(region)
    assert region not in g.get_system_shared_memory_status().regions


def test_cuda_registration_without_a_gpu(shm_server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(shm_server.url)
    import base64

    with pytest.raises(InferenceServerException) as e:
        http.register_cuda_shared_memory("c", base64.b64encode(b"x" * 10), 0, 64)
    assert "the raw handle must be 64 bytes, got 10" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        http.register_cuda_shared_memory("c", base64.b64encode(b"x" * 64), 0, 64)
    assert e.value.status() == "501"
    assert "this server has no GPU" in e.value.message()
    assert http.get_cuda_shared_memory_status() == []


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
