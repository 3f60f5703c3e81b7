"""TensorRT plans (platform tensorrt_plan) through the real server and tritonclient, on a
GPU host: engines built at test time from a small ONNX model with TensorRT's builder, and
their answers compared with ONNX Runtime's on the CPU for the same model and inputs.

They need TensorRT's builder (the ``tensorrt`` package with its libraries), whose libraries
PyPI does not carry as wheels (docs/backends.md, "Where it is tested"): without it they skip.
scripts/gpu-tests.sh runs this folder.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer
from tools import modelgen

pytestmark = pytest.mark.gpu
trtgen = pytest.importorskip(
    "tools.trtgen", reason="TensorRT's builder (tensorrt, or tensorrt_bindings) is not installed"
)

DIM = 16
_ONE_GPU = {
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
}


def _plan_model(repo: Path, name: str, plan: bytes, config: str | None) -> None:
    modelgen.write_model(
        repo, name, plan, None if config is None else f'name: "{name}"\n{config}',
        filename="model.plan",
    )  # fmt: skip


@pytest.fixture(scope="module")
def onnx_model() -> bytes:
    return modelgen.add_sub_model("FP32", DIM)


@pytest.fixture(scope="module")
def trt_server(
    tmp_path_factory: pytest.TempPathFactory, onnx_model: bytes
) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("trt-repo")
    plan = trtgen.build_plan(onnx_model, [(1, 2, 4), (1, 8, 16)])
    # no config: found by model.plan, completed; it runs both profiles (none listed)
    _plan_model(repo, "trt_auto", plan, None)
    _plan_model(
        repo, "trt_profiles", plan,
        'platform: "tensorrt_plan"\nmax_batch_size: 16\n'
        'instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] profile: [ "0", "1" ] } ]\n',
    )  # fmt: skip
    _plan_model(
        repo, "trt_cpu", plan,
        'platform: "tensorrt_plan"\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n',
    )  # fmt: skip
    _plan_model(repo, "trt_too_big", plan, 'platform: "tensorrt_plan"\nmax_batch_size: 32\n')
    srv = ShoalServer(
        repo, "--allow-client-shm=true", "--exit-on-error=false", "--strict-readiness=false",
        env=_ONE_GPU,
    )  # fmt: skip
    try:
        srv.wait_settled(("trt_auto", "trt_profiles", "trt_cpu", "trt_too_big"))
    except BaseException:
        srv.stop()
        raise
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _reference(onnx_model: bytes, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    sess = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    return list(sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b}))


def _infer(srv: ShoalServer, model: str, a: np.ndarray, b: np.ndarray, protocol: str) -> Any:
    mod = httpclient if protocol == "http" else grpcclient
    url = srv.url if protocol == "http" else f"127.0.0.1:{srv.grpc_port}"
    client = mod.InferenceServerClient(url)
    inputs = [mod.InferInput(n, list(a.shape), "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    try:
        return client.infer(model, inputs)
    finally:
        client.close()


def test_a_plan_alone_is_completed_from_its_engine(trt_server: ShoalServer) -> None:
    with urllib.request.urlopen(f"http://{trt_server.url}/v2/models/trt_auto/config") as r:
        config = json.loads(r.read())
    assert (config["platform"], config["backend"]) == ("tensorrt_plan", "tensorrt")
    assert config["max_batch_size"] == 16  # the largest profile's max batch
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [DIM]), ("INPUT1", "TYPE_FP32", [DIM]),
    ]  # fmt: skip


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("batch", [1, 3, 12])
@pytest.mark.parametrize("model", ["trt_auto", "trt_profiles"])
def test_answers_match_onnx_runtime(
    trt_server: ShoalServer, onnx_model: bytes, model: str, batch: int, protocol: str
) -> None:
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, DIM), dtype=np.float32)
    b = rng.standard_normal((batch, DIM), dtype=np.float32)
    result = _infer(trt_server, model, a, b, protocol)
    want = _reference(onnx_model, a, b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), want[1], rtol=1e-5, atol=1e-6)


def test_cuda_shared_memory_inputs_are_bound_in_place(
    trt_server: ShoalServer, onnx_model: bytes
) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = httpclient.InferenceServerClient(trt_server.url)
    a = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM)
    b = np.full((4, DIM), 0.25, dtype=np.float32)
    h = cudashm.create_shared_memory_region("trt_in", 3 * a.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(h, [a, b])
        client.register_cuda_shared_memory("trt_in", cudashm.get_raw_handle(h), 0, 3 * a.nbytes)
        inputs = [httpclient.InferInput(n, [4, DIM], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("trt_in", a.nbytes)
        inputs[1].set_shared_memory("trt_in", b.nbytes, offset=a.nbytes)
        out0 = httpclient.InferRequestedOutput("OUTPUT0")
        out0.set_shared_memory("trt_in", a.nbytes, offset=2 * a.nbytes)
        out1 = httpclient.InferRequestedOutput("OUTPUT1")
        result = client.infer("trt_auto", inputs, outputs=[out0, out1])
        want = _reference(onnx_model, a, b)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), want[1], rtol=1e-5)
        contents = cudashm.get_contents_as_numpy(h, np.float32, [12, DIM])
        np.testing.assert_array_equal(contents[:4], a)  # the inputs, untouched
        np.testing.assert_allclose(contents[8:], want[0], rtol=1e-5)
    finally:
        client.unregister_cuda_shared_memory("trt_in")
        cudashm.destroy_shared_memory_region(h)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("trt_cpu", "unable to load model 'trt_cpu', TensorRT backend supports only GPU device"),
        ("trt_too_big", "configuration specified max-batch 32 but TensorRT engine only "
         "supports max-batch 16"),
    ],
)  # fmt: skip
def test_a_bad_plan_config_fails_its_load_with_tritons_reason(
    trt_server: ShoalServer, model: str, reason: str
) -> None:
    version = trt_server.model_version(model)
    assert version["state"] == "UNAVAILABLE"
    assert reason in version["reason"], version["reason"]
