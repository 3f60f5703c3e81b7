"""KIND_GPU instances and CUDA shared memory. They need an NVIDIA GPU, onnxruntime-gpu,
cupy and cuda-python: scripts/gpu-tests.sh installs those and runs this folder."""

from __future__ import annotations

import base64
import json
import shutil
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal import modelgen
from tests.serverctl import ShoalServer

pytestmark = pytest.mark.gpu

N = 1024


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("gpu-repo")
    # Both kinds are explicit: on a GPU host a model without an instance_group gets
    # KIND_AUTO, which resolves to KIND_GPU (Triton's rule), not to a CPU instance.
    for name, group in (
        ("identity_gpu", "{ count: 1 kind: KIND_GPU gpus: [ 0 ] }"),
        ("identity_cpu", "{ count: 1 kind: KIND_CPU }"),
    ):
        modelgen.write_model(
            repo, name, modelgen.identity_model("FP32", [-1], batch=True),
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f"instance_group [ {group} ]\n",
        )  # fmt: skip
    srv = ShoalServer(repo, "--allow-client-shm=true")
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_kind_gpu_instance_serves(gpu_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(gpu_server.url)
    assert client.get_model_config("identity_gpu")["instance_group"][0]["kind"] == "KIND_GPU"
    x = np.random.default_rng(0).standard_normal((2, N)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [2, N], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("identity_gpu", [inp]).as_numpy("OUTPUT0"), x)
    with urllib.request.urlopen(
        f"http://{gpu_server.url}/v2/shoal/models/identity_gpu", timeout=5
    ) as r:
        (instance,) = json.loads(r.read())["versions"][0]["instances"]
    assert instance["state"] == "READY"
    assert instance["cores"] == []  # a GPU instance, not pinned to cores


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


def test_cuda_region_on_a_cpu_instance_is_a_clear_error(gpu_server: ShoalServer) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = httpclient.InferenceServerClient(gpu_server.url)
    h = cudashm.create_shared_memory_region("cpu_in", 4 * N, 0)
    try:
        client.register_cuda_shared_memory("cpu_in", cudashm.get_raw_handle(h), 0, 4 * N)
        inp = httpclient.InferInput("INPUT0", [1, N], "FP32")
        inp.set_shared_memory("cpu_in", 4 * N)
        with pytest.raises(InferenceServerException, match="KIND_GPU instance") as e:
            client.infer("identity_cpu", [inp])
        assert e.value.status() == "400"
        inp = httpclient.InferInput("INPUT0", [1, N], "FP32")
        inp.set_data_from_numpy(np.ones((1, N), dtype=np.float32))
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("cpu_in", 4 * N)
        with pytest.raises(InferenceServerException, match="KIND_GPU instance") as e:
            client.infer("identity_cpu", [inp], outputs=[out])
        assert e.value.status() == "400"
        assert client.is_server_live()
    finally:
        client.unregister_cuda_shared_memory("cpu_in")
        cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize("size", [63, 65])
def test_wrong_handle_sizes_are_refused(gpu_server: ShoalServer, size: int) -> None:
    client = httpclient.InferenceServerClient(gpu_server.url)
    with pytest.raises(InferenceServerException, match="raw handle must be 64 bytes"):
        client.register_cuda_shared_memory("bad", base64.b64encode(b"x" * size), 0, 64)
