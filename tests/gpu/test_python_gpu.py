"""Python models' GPU tensors: ``Tensor.from_dlpack`` / ``to_dlpack`` / ``is_cpu`` with
torch and cupy on the device, and a KIND_GPU instance's inputs left on the GPU when the
client sent them in CUDA shared memory and the config sets FORCE_CPU_ONLY_INPUT_TENSORS
"no" (in host memory otherwise, as in Triton). Run by scripts/gpu-tests.sh."""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer

pytestmark = pytest.mark.gpu

N = 256
_ONE_GPU = {
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
}
# OUTPUT0 = 2 * INPUT0, computed where the input is (torch on the GPU, through DLPack);
# ON_CPU: whether the input came in host memory.
TORCH_MODEL = """
import numpy as np
import torch
from torch.utils.dlpack import to_dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            t = torch.from_dlpack(x).cuda()
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(t * 2))
            assert not out.is_cpu()
            on_cpu = pb_utils.Tensor("ON_CPU", np.array([x.is_cpu()]))
            responses.append(pb_utils.InferenceResponse([out, on_cpu]))
        return responses
"""
# The same with cupy, the output a __dlpack__ object.
CUPY_MODEL = """
import cupy
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if x.is_cpu():
                array = cupy.asarray(x.as_numpy())
            else:
                array = cupy.from_dlpack(x)
                try:
                    x.as_numpy()
                except pb_utils.TritonModelException as exc:
                    assert "stored in GPU" in str(exc)
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", array * 2)
            on_cpu = pb_utils.Tensor("ON_CPU", np.array([x.is_cpu()]))
            responses.append(pb_utils.InferenceResponse([out, on_cpu]))
        return responses
"""
# A BLS call whose answer is asked for on the GPU (PreferredMemory): OUTPUT0 as it came.
BLS_TO_GPU = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="torch_cpu_inputs", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0),
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            on_cpu = pb_utils.Tensor("ON_CPU", np.array([out.is_cpu()]))
            responses.append(pb_utils.InferenceResponse([out, on_cpu]))
        return responses
"""
IO = (
    f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {N} ] }} ]\n'
    f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {N} ] }}, '
    '{ name: "ON_CPU" data_type: TYPE_BOOL dims: [ 1 ] } ]\n'
    "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n"
)
GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }'
MODELS = {
    "torch_gpu_inputs": (TORCH_MODEL, GPU_INPUTS),
    "torch_cpu_inputs": (TORCH_MODEL, ""),
    "cupy_gpu_inputs": (CUPY_MODEL, GPU_INPUTS),
    "bls_to_gpu": (BLS_TO_GPU, ""),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("python-gpu")
    for name, (source, extra) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{IO}{extra}\n'
        )
    srv = ShoalServer(repo, "--allow-client-shm=true", env=_ONE_GPU)
    yield srv
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@pytest.mark.parametrize(
    ("model", "on_cpu"),
    [("torch_gpu_inputs", False), ("torch_cpu_inputs", True), ("cupy_gpu_inputs", False)],
)
def test_cuda_shared_memory_inputs_reach_the_model_where_its_config_says(
    server: ShoalServer, model: str, on_cpu: bool
) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(N, dtype=np.float32)
    region_in, region_out = f"{model}_in", f"{model}_out"
    in_h = cudashm.create_shared_memory_region(region_in, x.nbytes, 0)
    out_h = cudashm.create_shared_memory_region(region_out, x.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(in_h, [x])
        client.register_cuda_shared_memory(region_in, cudashm.get_raw_handle(in_h), 0, x.nbytes)
        client.register_cuda_shared_memory(region_out, cudashm.get_raw_handle(out_h), 0, x.nbytes)
        inp = httpclient.InferInput("INPUT0", [N], "FP32")
        inp.set_shared_memory(region_in, x.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(region_out, x.nbytes)
        result = client.infer(
            model, [inp], outputs=[out, httpclient.InferRequestedOutput("ON_CPU")]
        )
        assert result.as_numpy("ON_CPU").tolist() == [on_cpu]
        got = cudashm.get_contents_as_numpy(out_h, np.float32, [N])
        np.testing.assert_array_equal(got, 2 * x)
        inline = client.infer(model, [_host_input(x)])  # (host inputs: on the CPU always)
        np.testing.assert_array_equal(inline.as_numpy("OUTPUT0"), 2 * x)
        assert inline.as_numpy("ON_CPU").tolist() == [True]
    finally:
        client.unregister_cuda_shared_memory(region_in)
        client.unregister_cuda_shared_memory(region_out)
        cudashm.destroy_shared_memory_region(in_h)
        cudashm.destroy_shared_memory_region(out_h)


def test_a_scripted_requests_answer_on_the_gpu(server: ShoalServer) -> None:
    """PreferredMemory(TRITONSERVER_MEMORY_GPU, 0): the answer's tensor is on the GPU."""
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(N, dtype=np.float32)
    result = client.infer("bls_to_gpu", [_host_input(x)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x)
    assert result.as_numpy("ON_CPU").tolist() == [False]


def _host_input(x: np.ndarray) -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def test_dlpack_round_trips_on_the_device() -> None:
    """pb_utils.Tensor over torch and cupy device memory, with no copy either way."""
    import cupy
    import torch
    from torch.utils import dlpack as torch_dlpack

    from shoal.workers import pb_utils as pb

    t = torch.arange(8, dtype=torch.float32, device="cuda")
    tensor = pb.Tensor.from_dlpack("T", torch_dlpack.to_dlpack(t))
    assert not tensor.is_cpu() and tensor.shape() == [8] and tensor.triton_dtype() == 11
    with pytest.raises(pb.TritonModelException, match="stored in GPU"):
        tensor.as_numpy()
    view = torch.from_dlpack(tensor)
    view[0] = 42.0
    assert t[0].item() == 42.0  # the same device memory
    c = cupy.from_dlpack(tensor)
    assert int(c[0]) == 42
    back = pb.Tensor.from_dlpack("C", c)
    assert back.__dlpack_device__() == (2, 0)
    assert torch_dlpack.from_dlpack(back.to_dlpack()).data_ptr() == t.data_ptr()
