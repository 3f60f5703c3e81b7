"""KIND_GPU instances, CUDA shared memory and GPU metrics, through the real server and
tritonclient.

They need an NVIDIA GPU, cupy, torch with CUDA and cuda-python (tritonclient's CUDA
shared-memory utilities); scripts/gpu-tests.sh checks for them and runs this folder.
ONNX Runtime's KIND_GPU path also needs onnxruntime-gpu: where the installed onnxruntime
has no CUDAExecutionProvider those tests skip, and the TorchScript ones cover KIND_GPU.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.conftest import ALL_DATATYPES, identity_config
from tests.integration.test_http_infer import _sample
from tests.serverctl import ShoalServer
from tools import modelgen

pytestmark = pytest.mark.gpu

N = 1024
# scripts/gpu-tests.sh's preflight says whether ONNX Runtime created its CUDA provider;
# without it, the provider list (fixed when onnxruntime was built) is all there is.
ORT_CUDA = (
    os.environ.get(
        "SHOAL_TEST_ORT_CUDA",
        "1" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "0",
    )
    == "1"
)
needs_ort_cuda = pytest.mark.skipif(
    not ORT_CUDA, reason="this onnxruntime cannot run on CUDA (no CUDAExecutionProvider)"
)
# The server sees one GPU, the test client's device 0, whatever the host has: the tests
# count instances and read the GPU ids of KIND_AUTO models.
_ONE_GPU = {
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
}


def _identity(repo: Path, name: str, group: str, extra: str = "") -> None:
    """An ONNX identity model; ``group`` "" leaves out the instance_group (KIND_AUTO)."""
    modelgen.write_model(
        repo, name, modelgen.identity_model("FP32", [-1], batch=True),
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        + (f"instance_group [ {group} ]\n" if group else "") + extra,
    )  # fmt: skip


# Triton's way to pick ONNX Runtime's CUDA provider's options (the "tensorrt" accelerator
# needs TensorRT's libraries, which no GPU host of this project has: docs/backends.md).
_CUDA_ACCELERATOR = (
    'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "cuda" '
    'parameters { key: "do_copy_in_default_stream" value: "true" } } ] } }\n'
)


_BATCH_BY_4 = (
    "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000000 }\n"
)


def _addsub_gpu(
    repo: Path,
    name: str = "addsub_gpu",
    group: str = "{ count: 1 kind: KIND_GPU gpus: [ 0 ] }",
    batching: str = _BATCH_BY_4,
) -> None:
    """A TorchScript add/sub model; ``group`` "" leaves out the instance_group."""
    from tools import torchgen

    modelgen.write_model(
        repo, name, torchgen.add_sub_model(),
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] },'
        ' { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        + (f"instance_group [ {group} ]\n" if group else "")
        + batching,
        filename="model.pt",
    )  # fmt: skip


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("gpu-repo")
    # Kinds are explicit but in the *_auto models: on a GPU host a model without an
    # instance_group gets KIND_AUTO, which is KIND_GPU where its backend can use the GPU.
    _identity(repo, "identity_cpu", "{ count: 1 kind: KIND_CPU }")
    _identity(repo, "identity_auto", "")
    if ORT_CUDA:
        _identity(repo, "identity_gpu", "{ count: 1 kind: KIND_GPU gpus: [ 0 ] }")
        _identity(
            repo, "identity_cuda_accelerator", "{ count: 1 kind: KIND_GPU gpus: [ 0 ] }",
            _CUDA_ACCELERATOR,
        )  # fmt: skip
    _addsub_gpu(repo)
    _addsub_gpu(repo, "addsub_auto", "", batching="")
    for dt in ALL_DATATYPES:  # CPU instances, as the image's onnxruntime has no CUDA
        name = f"identity_{dt.lower()}"
        modelgen.write_model(
            repo, name, modelgen.identity_model(dt, [-1], batch=True),
            identity_config(name, dt, "[ -1 ]", 8)
            + "instance_group [ { count: 1 kind: KIND_CPU } ]\n",
        )  # fmt: skip
    srv = ShoalServer(repo, "--allow-client-shm=true", env=_ONE_GPU)
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _client(srv: ShoalServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(srv.url)
    return grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")


def _instance(srv: ShoalServer, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{srv.url}/v2/shoal/models/{model}", timeout=5) as r:
        (instance,) = json.loads(r.read())["versions"][0]["instances"]
    return dict(instance)


@needs_ort_cuda
def test_kind_gpu_onnx_instance_serves(gpu_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(gpu_server.url)
    assert client.get_model_config("identity_gpu")["instance_group"][0]["kind"] == "KIND_GPU"
    x = np.random.default_rng(0).standard_normal((2, N)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [2, N], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("identity_gpu", [inp]).as_numpy("OUTPUT0"), x)
    instance = _instance(gpu_server, "identity_gpu")
    assert instance["state"] == "READY"
    assert instance["cores"] == []  # a GPU instance, not pinned to cores


@needs_ort_cuda
def test_a_cuda_execution_accelerator_serves_on_the_gpu(gpu_server: ShoalServer) -> None:
    """``optimization { execution_accelerators { gpu_execution_accelerator [ { name:
    "cuda" ... } ] } }``: ONNX Runtime's CUDA provider with the accelerator's options."""
    client = httpclient.InferenceServerClient(gpu_server.url)
    config = client.get_model_config("identity_cuda_accelerator")
    (accelerator,) = config["optimization"]["execution_accelerators"]["gpu_execution_accelerator"]
    assert accelerator["name"] == "cuda"
    x = np.random.default_rng(2).standard_normal((2, N)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [2, N], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("identity_cuda_accelerator", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert _instance(gpu_server, "identity_cuda_accelerator")["gpu"] == 0


def test_kind_gpu_torch_instance_serves(gpu_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(gpu_server.url)
    assert client.get_model_config("addsub_gpu")["instance_group"][0]["kind"] == "KIND_GPU"
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((3, N)).astype(np.float32) for _ in range(2))
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        inp = httpclient.InferInput(name, [3, N], "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("addsub_gpu", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), a - b, rtol=1e-6)
    instance = _instance(gpu_server, "addsub_gpu")
    assert (instance["cores"], instance["gpu"]) == ([], 0)  # the broker knows its GPU
    assert "GPU 0" in gpu_server.log()  # the worker logged where it loaded


def test_kind_auto_is_the_gpu_where_the_backend_can_use_it(gpu_server: ShoalServer) -> None:
    """torch (a CUDA build) gets the GPU; ONNX Runtime only as onnxruntime-gpu: the CPU
    build serves on the CPU rather than failing to load. Both answer."""
    client = httpclient.InferenceServerClient(gpu_server.url)
    kind = client.get_model_config("identity_auto")["instance_group"][0]["kind"]
    assert kind == ("KIND_GPU" if ORT_CUDA else "KIND_CPU")
    assert (_instance(gpu_server, "identity_auto")["gpu"] is None) == (not ORT_CUDA)
    x = np.arange(N, dtype=np.float32).reshape(1, N)
    inp = httpclient.InferInput("INPUT0", [1, N], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("identity_auto", [inp]).as_numpy("OUTPUT0"), x)
    config = client.get_model_config("addsub_auto")
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    assert config["instance_group"][0]["gpus"] == [0]
    assert _instance(gpu_server, "addsub_auto")["gpu"] == 0
    inputs = [httpclient.InferInput(n, [1, N], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("addsub_auto", inputs).as_numpy("OUTPUT__0"), 2 * x)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_torch_cuda_shared_memory_in_and_out(gpu_server: ShoalServer, protocol: str) -> None:
    """INPUT0 from a CUDA region, INPUT1 inline; OUTPUT__0 into the region at an offset,
    OUTPUT__1 inline: DLPack in, device copy out, nothing through the host for the region."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    mod = httpclient if protocol == "http" else grpcclient
    client = _client(gpu_server, protocol)
    a = np.arange(2 * N, dtype=np.float32).reshape(2, N)
    b = np.full((2, N), 0.5, dtype=np.float32)
    region = f"torch_{protocol}"
    h = cudashm.create_shared_memory_region(region, 2 * a.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(h, [a])
        client.register_cuda_shared_memory(region, cudashm.get_raw_handle(h), 0, 2 * a.nbytes)
        in0 = mod.InferInput("INPUT0", [2, N], "FP32")
        in0.set_shared_memory(region, a.nbytes)
        in1 = mod.InferInput("INPUT1", [2, N], "FP32")
        in1.set_data_from_numpy(b)
        out0 = mod.InferRequestedOutput("OUTPUT__0")
        out0.set_shared_memory(region, a.nbytes, offset=a.nbytes)
        out1 = mod.InferRequestedOutput("OUTPUT__1")
        result = client.infer("addsub_gpu", [in0, in1], outputs=[out0, out1])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
        contents = cudashm.get_contents_as_numpy(h, np.float32, [4, N])
        np.testing.assert_array_equal(contents[:2], a)  # the input, untouched
        np.testing.assert_array_equal(contents[2:], a + b)
    finally:
        client.unregister_cuda_shared_memory(region)
        cudashm.destroy_shared_memory_region(h)


def test_cuda_shared_memory_inputs_are_batched_on_the_device(gpu_server: ShoalServer) -> None:
    """Concurrent requests whose INPUT0 lie at different offsets of one CUDA region form
    one batch (gathered on the device); each gets its own rows back."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    rows = np.arange(4 * N, dtype=np.float32).reshape(4, N)
    h = cudashm.create_shared_memory_region("batched", rows.nbytes, 0)
    client = httpclient.InferenceServerClient(gpu_server.url)
    try:
        cudashm.set_shared_memory_region(h, [rows])
        client.register_cuda_shared_memory("batched", cudashm.get_raw_handle(h), 0, rows.nbytes)
        before = client.get_inference_statistics("addsub_gpu")["model_stats"][0]

        def one(i: int) -> np.ndarray:
            c = httpclient.InferenceServerClient(gpu_server.url)
            in0 = httpclient.InferInput("INPUT0", [1, N], "FP32")
            in0.set_shared_memory("batched", 4 * N, offset=i * 4 * N)
            in1 = httpclient.InferInput("INPUT1", [1, N], "FP32")
            in1.set_data_from_numpy(np.full((1, N), i, dtype=np.float32))
            return c.infer("addsub_gpu", [in0, in1]).as_numpy("OUTPUT__0")  # type: ignore[no-any-return]

        with ThreadPoolExecutor(4) as pool:
            sums = list(pool.map(one, range(4)))
        for i, got in enumerate(sums):
            np.testing.assert_array_equal(got[0], rows[i] + i)
        after = client.get_inference_statistics("addsub_gpu")["model_stats"][0]
        requests = after["inference_count"] - before["inference_count"]
        executions = after["execution_count"] - before["execution_count"]
        assert requests == 4
        assert executions < 4  # at least two of them ran as one batch
    finally:
        client.unregister_cuda_shared_memory("batched")
        cudashm.destroy_shared_memory_region(h)


@needs_ort_cuda
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_round_trip(gpu_server: ShoalServer, protocol: str) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    mod = httpclient if protocol == "http" else grpcclient
    client = (
        httpclient.InferenceServerClient(gpu_server.url) if protocol == "http"
        else grpcclient.InferenceServerClient(f"127.0.0.1:{gpu_server.grpc_port}")
    )  # fmt: skip
    x = np.arange(2 * N, dtype=np.float32).reshape(2, N)
    nbytes = x.nbytes
    in_h = cudashm.create_shared_memory_region(f"in_{protocol}", nbytes, 0)
    out_h = cudashm.create_shared_memory_region(f"out_{protocol}", nbytes, 0)
    try:
        cudashm.set_shared_memory_region(in_h, [x])
        client.register_cuda_shared_memory(
            f"in_{protocol}", cudashm.get_raw_handle(in_h), 0, nbytes
        )
        client.register_cuda_shared_memory(
            f"out_{protocol}", cudashm.get_raw_handle(out_h), 0, nbytes
        )
        inp = mod.InferInput("INPUT0", [2, N], "FP32")
        inp.set_shared_memory(f"in_{protocol}", nbytes)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"out_{protocol}", nbytes)
        client.infer("identity_gpu", [inp], outputs=[out])
        got = cudashm.get_contents_as_numpy(out_h, np.float32, [2, N])
        np.testing.assert_array_equal(got, x)
        status = client.get_cuda_shared_memory_status()
        names = [s["name"] for s in status] if protocol == "http" else list(status.regions)
        assert f"in_{protocol}" in names
    finally:
        client.unregister_cuda_shared_memory(f"in_{protocol}")
        client.unregister_cuda_shared_memory(f"out_{protocol}")
        cudashm.destroy_shared_memory_region(in_h)
        cudashm.destroy_shared_memory_region(out_h)


@needs_ort_cuda
def test_cuda_shared_memory_one_way(gpu_server: ShoalServer) -> None:
    """Input in CUDA shared memory with the output inline (device -> host), then input
    inline with the output in CUDA shared memory (host -> device), at an offset."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = httpclient.InferenceServerClient(gpu_server.url)
    x = np.arange(N, dtype=np.float32).reshape(1, N) - 7.5
    h = cudashm.create_shared_memory_region("oneway", 3 * x.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(h, [x])
        client.register_cuda_shared_memory("oneway", cudashm.get_raw_handle(h), 0, 3 * x.nbytes)
        inp = httpclient.InferInput("INPUT0", [1, N], "FP32")
        inp.set_shared_memory("oneway", x.nbytes)
        got = client.infer("identity_gpu", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(got, x)

        y = -x
        inp = httpclient.InferInput("INPUT0", [1, N], "FP32")
        inp.set_data_from_numpy(y)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("oneway", x.nbytes, offset=2 * x.nbytes)
        client.infer("identity_gpu", [inp], outputs=[out])
        region = cudashm.get_contents_as_numpy(h, np.float32, [3, N])
        np.testing.assert_array_equal(region[0], x[0])  # the input, untouched
        np.testing.assert_array_equal(region[2], y[0])
    finally:
        client.unregister_cuda_shared_memory("oneway")
        cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_cpu_instance_serves_cuda_regions_through_the_host(
    gpu_server: ShoalServer, protocol: str
) -> None:
    """As Triton does for a model on the CPU: the input is copied down from the client's
    device memory and the output up into it, at an offset; inline outputs as usual."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    mod = httpclient if protocol == "http" else grpcclient
    client = _client(gpu_server, protocol)
    x = np.arange(2 * N, dtype=np.float32).reshape(2, N) - 3.25
    region = f"cpu_{protocol}"
    h = cudashm.create_shared_memory_region(region, 2 * x.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(h, [x, np.full_like(x, -99.0)])  # a sentinel after x
        client.register_cuda_shared_memory(region, cudashm.get_raw_handle(h), 0, 2 * x.nbytes)
        inp = mod.InferInput("INPUT0", [2, N], "FP32")
        inp.set_shared_memory(region, x.nbytes)
        got = client.infer("identity_cpu", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(got, x)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(region, x.nbytes, offset=x.nbytes)
        client.infer("identity_cpu", [inp], outputs=[out])
        contents = cudashm.get_contents_as_numpy(h, np.float32, [4, N])
        np.testing.assert_array_equal(contents[:2], x)  # the input, untouched
        np.testing.assert_array_equal(contents[2:], x)
        instance = _instance(gpu_server, "identity_cpu")
        assert instance["gpu"] is None and instance["cores"]
    finally:
        client.unregister_cuda_shared_memory(region)
        cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_cuda_shared_memory_round_trip_of_every_datatype(
    gpu_server: ShoalServer, protocol: str, datatype: str
) -> None:
    """Every datatype in and out through tritonclient's CUDA shared-memory utilities,
    BYTES included (serialized in the region, as the client writes and reads them)."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    mod = httpclient if protocol == "http" else grpcclient
    client = _client(gpu_server, protocol)
    data = _sample(datatype, 8).reshape(2, 4)
    wire = serialize_byte_tensor(data) if datatype == "BYTES" else data
    size = len(wire.item()) if datatype == "BYTES" else data.nbytes
    regions = [f"dt_{datatype}_{protocol}_in", f"dt_{datatype}_{protocol}_out"]
    in_h, out_h = (cudashm.create_shared_memory_region(r, size, 0) for r in regions)
    try:
        cudashm.set_shared_memory_region(in_h, [wire])
        for region, h in zip(regions, (in_h, out_h), strict=True):
            client.register_cuda_shared_memory(region, cudashm.get_raw_handle(h), 0, size)
        inp = mod.InferInput("INPUT0", [2, 4], datatype)
        inp.set_shared_memory(regions[0], size)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(regions[1], size)
        result = client.infer(f"identity_{datatype.lower()}", [inp], outputs=[out])
        meta = result.get_output("OUTPUT0")
        shape = list(meta["shape"] if protocol == "http" else meta.shape)
        dt = meta["datatype"] if protocol == "http" else meta.datatype
        assert (shape, dt) == ([2, 4], datatype)
        if datatype == "BYTES":
            got = cudashm.get_contents_as_numpy(out_h, np.object_, [2, 4])
            assert list(got.reshape(-1)) == list(data.reshape(-1))
        else:
            got = cudashm.get_contents_as_numpy(out_h, data.dtype, [2, 4])
            assert got.tobytes() == data.tobytes()
    finally:
        for region in regions:
            client.unregister_cuda_shared_memory(region)
        cudashm.destroy_shared_memory_region(in_h)
        cudashm.destroy_shared_memory_region(out_h)


def test_a_bytes_output_too_large_for_its_cuda_region_is_refused(gpu_server: ShoalServer) -> None:
    """The serialized BYTES output (4-byte lengths included) must fit the client's region:
    one byte short is refused with Triton's message and nothing is written."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = httpclient.InferenceServerClient(gpu_server.url)
    data = np.array([b"abc", b"defgh"], dtype=np.object_).reshape(1, 2)
    size = len(serialize_byte_tensor(data).item())  # 4 + 3 + 4 + 5 = 16
    h = cudashm.create_shared_memory_region("bytes_short", size - 1, 0)
    try:
        cudashm.set_shared_memory_region(h, [np.zeros(size - 1, dtype=np.uint8)])
        client.register_cuda_shared_memory("bytes_short", cudashm.get_raw_handle(h), 0, size - 1)
        inp = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
        inp.set_data_from_numpy(data)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("bytes_short", size - 1)
        with pytest.raises(InferenceServerException) as e:
            client.infer("identity_bytes", [inp], outputs=[out])
        assert e.value.status() == "500"
        assert e.value.message().endswith(
            "shared memory size specified with the request for output 'OUTPUT0' "
            f"({size - 1} bytes) should be at least {size} bytes to hold the results"
        )
        region = cudashm.get_contents_as_numpy(h, np.uint8, [size - 1])
        assert not region.any()
    finally:
        client.unregister_cuda_shared_memory("bytes_short")
        cudashm.destroy_shared_memory_region(h)


def test_a_region_larger_than_its_device_allocation_is_refused(gpu_server: ShoalServer) -> None:
    """The client says 64 MiB over a 64-byte allocation: the worker asks the driver and
    refuses, rather than reading past the allocation; it stays up for the next request."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = httpclient.InferenceServerClient(gpu_server.url)
    h = cudashm.create_shared_memory_region("tiny", 64, 0)
    try:
        client.register_cuda_shared_memory("tiny", cudashm.get_raw_handle(h), 0, 64 << 20)
        a = httpclient.InferInput("INPUT0", [2, N], "FP32")
        a.set_shared_memory("tiny", 8 * N)
        b = httpclient.InferInput("INPUT1", [2, N], "FP32")
        b.set_data_from_numpy(np.ones((2, N), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="larger than the device allocation"):
            client.infer("addsub_gpu", [a, b])
        a.set_data_from_numpy(np.ones((2, N), dtype=np.float32))
        result = client.infer("addsub_gpu", [a, b])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), np.full((2, N), 2.0))
    finally:
        client.unregister_cuda_shared_memory("tiny")
        cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("size", [63, 65])
def test_wrong_handle_sizes_are_refused(gpu_server: ShoalServer, size: int) -> None:
    client = httpclient.InferenceServerClient(gpu_server.url)
    with pytest.raises(
        InferenceServerException, match="must be a valid base64 encoded cudaIpcMemHandle_t"
    ):
        client.register_cuda_shared_memory("bad", base64.b64encode(b"x" * size), 0, 64)


def test_register_bodies_and_handles_read_as_triton_reads_them(gpu_server: ShoalServer) -> None:
    """raw_handle that is no object or lacks b64, and b64 that is no string: Triton's JSON
    layer answers (500). b64 is decoded as libb64 does: padding optional, characters
    outside the alphabet skipped."""
    import http.client

    import tritonclient.utils.cuda_shared_memory as cudashm

    def post(body: object) -> tuple[int, str]:
        conn = http.client.HTTPConnection(gpu_server.url, timeout=10)
        try:
            conn.request("POST", "/v2/cudasharedmemory/region/shape/register", json.dumps(body))
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw)["error"] if raw else ""
        finally:
            conn.close()

    member = (500, "attempt to access non-existing object member 'b64'")
    for raw_handle in ("x", [], {}):
        assert post({"raw_handle": raw_handle, "device_id": 0, "byte_size": 64}) == member
    assert post({"raw_handle": {"b64": 5}, "device_id": 0, "byte_size": 64}) == (
        500,
        "attempt to access JSON non-string as string",
    )
    client = httpclient.InferenceServerClient(gpu_server.url)
    h = cudashm.create_shared_memory_region("lenient", 64, 0)
    try:
        b64 = cudashm.get_raw_handle(h).decode().rstrip("=")
        b64 = b64[:40] + "\n" + b64[40:]  # no padding, a stray newline: libb64 takes it
        assert post({"raw_handle": {"b64": b64}, "device_id": 0, "byte_size": 64}) == (200, "")
        assert "shape" in [s["name"] for s in client.get_cuda_shared_memory_status()]
    finally:
        client.unregister_cuda_shared_memory("shape")
        cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_device_the_server_lacks_is_refused(gpu_server: ShoalServer, protocol: str) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = _client(gpu_server, protocol)
    h = cudashm.create_shared_memory_region(f"dev_{protocol}", 64, 0)
    try:
        with pytest.raises(InferenceServerException, match="invalid args"):
            client.register_cuda_shared_memory(f"dev_{protocol}", cudashm.get_raw_handle(h), 99, 64)
        status = client.get_cuda_shared_memory_status()
        names = [s["name"] for s in status] if protocol == "http" else list(status.regions)
        assert f"dev_{protocol}" not in names
    finally:
        cudashm.destroy_shared_memory_region(h)


def test_a_kind_gpu_worker_started_alone_runs_on_its_gpu(tmp_path: Path) -> None:
    """As under supervisord: no --gpu given, the worker places itself on its GPU."""
    from tests.fault.test_broker_restart import Roles

    _addsub_gpu(tmp_path)
    roles = Roles(tmp_path)
    try:
        for role in ("broker", "frontend", "worker"):
            roles.start(role, model="addsub_gpu")
        assert roles.ready(), "server did not become ready"
        url = f"http://127.0.0.1:{roles.port}/v2/shoal/models/addsub_gpu"
        with urllib.request.urlopen(url, timeout=5) as r:
            (instance,) = json.loads(r.read())["versions"][0]["instances"]
        assert (instance["gpu"], instance["cores"]) == (0, [])
        client = httpclient.InferenceServerClient(f"127.0.0.1:{roles.port}")
        a = np.ones((1, N), dtype=np.float32)
        inputs = [httpclient.InferInput(n, [1, N], "FP32") for n in ("INPUT0", "INPUT1")]
        for inp in inputs:
            inp.set_data_from_numpy(a)
        got = client.infer("addsub_gpu", inputs).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(got, 2 * a)
    finally:
        roles.stop()
        shutil.rmtree(roles.runtime, ignore_errors=True)


def _gpu_families(port: int) -> dict[str, dict[str, float]]:
    """The page's GPU families: name -> {gpu_uuid: value}."""
    from tests.integration.test_metrics import _scrape

    return {
        name: {labels["gpu_uuid"]: value for labels, value in samples}
        for name, samples in _scrape(port).items()
        if name.startswith(("nv_gpu", "nv_energy"))
    }


def test_gpu_metrics_are_the_visible_gpus_own_figures(tmp_path: Path) -> None:
    """nv_gpu_* as Triton shows them, labelled with the UUID of the one GPU the server
    sees, each figure checked against NVML read here or against what this test does."""
    import time

    import cupy
    import pynvml

    from shoal.frontend.gpu_metrics import FAMILIES
    from tests.integration.test_metrics import _page, _scrape, _until

    _identity(tmp_path, "identity_cpu", "{ count: 1 kind: KIND_CPU }")
    _addsub_gpu(tmp_path)
    srv = ShoalServer(tmp_path, "--metrics-interval-ms=100", env=_ONE_GPU)
    pynvml.nvmlInit()
    try:
        visible = _ONE_GPU["CUDA_VISIBLE_DEVICES"]
        handle = (
            pynvml.nvmlDeviceGetHandleByIndex(int(visible))
            if visible.isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(visible)
        )
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        page = _gpu_families(srv.metrics_port)
        # every family (their names and order: tests/unit/frontend/test_gpu_metrics.py)
        assert sorted(page) == sorted(name for name, *_ in FAMILIES)
        assert all(list(series) == [uuid] for series in page.values()), page
        # The per-model series of a model on the GPU carry its UUID; a CPU model's none.
        counts = {
            labels["model"]: labels for labels, _ in _scrape(srv.metrics_port)["nv_inference_count"]
        }
        assert counts["addsub_gpu"].get("gpu_uuid") == uuid
        assert "gpu_uuid" not in counts["identity_cpu"]
        assert (
            page["nv_gpu_memory_total_bytes"][uuid] == pynvml.nvmlDeviceGetMemoryInfo(handle).total
        )
        assert (
            page["nv_gpu_power_limit"][uuid]
            == pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000
        )
        assert 0.0 <= page["nv_gpu_utilization"][uuid] <= 1.0
        assert page["nv_gpu_power_usage"][uuid] > 0.0
        # Energy since the server started grows while the GPU draws power.
        energy = page["nv_energy_consumption"][uuid]
        time.sleep(0.5)
        _until(lambda: _gpu_families(srv.metrics_port)["nv_energy_consumption"][uuid] > energy)
        # Memory used follows an allocation of 4 GiB made here.
        used = _gpu_families(srv.metrics_port)["nv_gpu_memory_used_bytes"][uuid]
        block = cupy.empty(4 << 30, dtype=cupy.uint8)
        try:
            _until(
                lambda: (
                    _gpu_families(srv.metrics_port)["nv_gpu_memory_used_bytes"][uuid]
                    >= used + (3.5 * (1 << 30))
                )
            )
        finally:
            del block
            cupy.get_default_memory_pool().free_all_blocks()
    finally:
        pynvml.nvmlShutdown()
        assert srv.stop() == 0
    off = ShoalServer(tmp_path, "--allow-gpu-metrics=false", env=_ONE_GPU)
    try:
        assert _gpu_families(off.metrics_port) == {}
        assert "nv_cpu_utilization" in _page(off.metrics_port)[1]
    finally:
        assert off.stop() == 0
