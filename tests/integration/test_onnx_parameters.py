"""Thread, execution-mode, graph-level and memory `parameters` through the real server
and tritonclient:
values Triton rejects fail that model's load with Triton's message (the first in
Triton's order) while the rest of the repository serves; ORT_PARALLEL and its inter-op
pool are honoured; "the backend's default" thread count keeps a pinned instance's
threads on its own cores; TorchScript models read Triton's upper-case keys, and shoal's
lower-case one leniently; a TensorRT plan without a GPU fails with Triton's reason."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime_extensions
import pytest
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer, settled_server
from tools import modelgen, torchgen

INTER_OP_THREADS = 3


def _parameters(params: dict[str, str]) -> str:
    entries = ", ".join(
        f'{{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items()
    )
    return f"parameters [ {entries} ]\n"


def _add_sub(repo: Path, name: str, params: dict[str, str], extra: str = "") -> None:
    modelgen.write_model(
        repo, name, modelgen.add_sub_model("FP32", 4),
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        + _parameters(params) + extra,
    )  # fmt: skip


def _torch_add_sub(repo: Path, name: str, params: dict[str, str]) -> None:
    modelgen.write_model(
        repo, name, torchgen.add_sub_model(),
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0__0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "OUTPUT1__1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' + _parameters(params),
        filename="model.pt",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("ort-params-repo")
    # One intra-op thread each, so that the two workers differ only by the inter-op pool.
    _add_sub(repo, "sequential", {"intra_op_thread_count": "1"})
    _add_sub(
        repo, "parallel",
        {
            "intra_op_thread_count": "1", "execution_mode": "1",
            "inter_op_thread_count": str(INTER_OP_THREADS),
        },
    )  # fmt: skip
    _add_sub(repo, "bad_mode", {"execution_mode": "2"})
    _add_sub(repo, "bad_intra", {"intra_op_thread_count": "four"})
    # Both bad: Triton checks execution_mode first.
    _add_sub(repo, "both_bad", {"intra_op_thread_count": "x", "execution_mode": "2"})
    # "The backend's default": ONNX Runtime's own would pin a host-sized pool, one thread
    # per core of the host but the first, onto other instances' cores. Two instances: on
    # a host of two cores, one of them owns the first (the other's escapee would land on
    # its own core).
    _add_sub(
        repo, "intra_default", {"intra_op_thread_count": "0"},
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n",
    )  # fmt: skip
    # The same for the inter-op pool of a parallel session.
    _add_sub(
        repo, "inter_default",
        {"intra_op_thread_count": "1", "execution_mode": "1", "inter_op_thread_count": "0"},
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n",
    )  # fmt: skip
    # Triton's pytorch backend reads only the upper-case keys; the lower-case one is
    # shoal's lenient extension there.
    # Graph level and memory switches, as Triton's onnxruntime backend reads them.
    _add_sub(
        repo, "unoptimized",
        {"enable_mem_arena": "off", "enable_mem_pattern": "0",
         "share_session_between_instances": "true"},
        "optimization { graph { level: 2 } }\n",
    )  # fmt: skip
    _add_sub(repo, "bad_arena", {"enable_mem_arena": "maybe"})
    # Execution accelerators: one this onnxruntime lacks is left out; an unknown one fails.
    accelerated = (
        "optimization {{ execution_accelerators {{ "
        "cpu_execution_accelerator [ {{ name: {} }} ] }} }}\n"
    )
    _add_sub(repo, "openvino", {}, accelerated.format('"openvino"'))
    _add_sub(repo, "bad_accelerator", {}, accelerated.format('"mkl"'))
    # Custom operations: onnxruntime-extensions' library, registered as Triton does.
    upper = (
        'name: "{}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ {{ name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }} ]\n'
        'output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }} ]\n'
        'model_operations {{ op_library_filename: "{}" }}\n'
    )
    library = onnxruntime_extensions.get_library_path()
    for name, path in (("custom_ops", library), ("no_ops_library", "/nonexistent.so")):
        modelgen.write_model(repo, name, modelgen.string_upper_model(), upper.format(name, path))
    # A TensorRT plan on a host (or instance) without a GPU: Triton's refusal, found by its
    # file alone (tests/gpu/test_tensorrt.py serves real plans).
    modelgen.write_model(repo, "plan_on_cpu", b"not a plan", None, filename="model.plan")
    _torch_add_sub(repo, "torch_lower_auto", {"intra_op_thread_count": "auto"})
    _torch_add_sub(repo, "torch_upper_bad", {"INTRA_OP_THREAD_COUNT": "x"})
    with settled_server(repo, MODELS) as srv:
        yield srv


MODELS = (
    "sequential", "parallel", "bad_mode", "bad_intra", "both_bad", "intra_default",
    "inter_default", "torch_lower_auto", "torch_upper_bad", "unoptimized", "bad_arena",
    "openvino", "bad_accelerator", "custom_ops", "no_ops_library", "plan_on_cpu",
)  # fmt: skip


def _add_sub_infer(
    srv: ShoalServer, model: str, outputs: tuple[str, str] = ("OUTPUT0", "OUTPUT1")
) -> None:
    client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    inputs = [httpclient.InferInput(n, [2, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy(outputs[0]), a + b)
    np.testing.assert_array_equal(result.as_numpy(outputs[1]), a - b)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "bad_mode",
            "failed to load 'bad_mode' version 1: Invalid configuration value provided. "
            "Expected values for  execution_mode are 0 or 1 but got 2 .",
        ),
        (
            "bad_intra",
            "failed to load 'bad_intra' version 1: failed to convert 'four' to integral number",
        ),
        (
            "both_bad",
            "failed to load 'both_bad' version 1: Invalid configuration value provided. "
            "Expected values for  execution_mode are 0 or 1 but got 2 .",
        ),
        ("bad_arena", "failed to load 'bad_arena' version 1: failed to convert 'maybe' to boolean"),
        (
            "bad_accelerator",
            "failed to load 'bad_accelerator' version 1: unknown Execution Accelerator 'mkl' "
            "is requested",
        ),
        (
            "torch_upper_bad",
            "failed to load 'torch_upper_bad' version 1: failed to convert 'x' to integral number",
        ),
        (
            "plan_on_cpu",
            "failed to load 'plan_on_cpu' version 1: unable to load model 'plan_on_cpu', "
            "TensorRT backend supports only GPU device",
        ),
    ],
)
def test_a_parameter_triton_rejects_fails_only_that_models_load(
    server: ShoalServer, model: str, message: str
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    version = server.model_version(model)
    assert version["state"] == "UNAVAILABLE"
    assert version["reason"] == message
    assert not client.is_model_ready(model)
    assert client.is_model_ready("sequential")  # the rest of the repository serves
    _add_sub_infer(server, "sequential")


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_parallel_execution_mode_serves_and_sizes_the_inter_op_pool(server: ShoalServer) -> None:
    assert server.model_version("parallel")["state"] == "READY"
    _add_sub_infer(server, "parallel")
    _add_sub_infer(server, "sequential")
    # ONNX Runtime's inter-op pool runs n - 1 threads beside the caller's; a sequential
    # session has none. Everything else in the two workers is the same.
    extra = _threads(server.worker_pid("parallel")) - _threads(server.worker_pid("sequential"))
    assert extra == INTER_OP_THREADS - 1


def test_the_default_inter_op_pool_is_sized_to_the_instances_cores(server: ShoalServer) -> None:
    """Two instances on this host: each owns a share of its cores (intra-op 1, as
    `sequential`, which owns them all and has no inter-op pool)."""
    _add_sub_infer(server, "inter_default")
    base = _threads(server.worker_pid("sequential"))
    for instance in server.model_version("inter_default")["instances"]:
        assert instance["cores"]
        assert _threads(instance["pid"]) - base == len(instance["cores"]) - 1


def _cpu_set(cpu_list: str) -> set[int]:
    """A kernel CPU list ("0-2,5") as a set."""
    cpus: set[int] = set()
    for part in cpu_list.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


@pytest.mark.parametrize("model", ["intra_default", "inter_default"])
def test_the_backends_default_thread_count_keeps_every_thread_on_the_instances_cores(
    server: ShoalServer, model: str
) -> None:
    for _ in range(4):  # the pools exist and have run (requests go to both instances)
        _add_sub_infer(server, model)
    instances = server.model_version(model)["instances"]
    assert len(instances) == 2
    for instance in instances:
        cores, pid = set(instance["cores"]), instance["pid"]
        assert cores, "a KIND_CPU instance is pinned"
        allowed = {}
        for task in os.listdir(f"/proc/{pid}/task"):
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
            line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
            allowed[task] = _cpu_set(line.split(":", 1)[1])
        assert all(cpus <= cores for cpus in allowed.values()), (cores, allowed)


def test_torch_reads_the_lower_case_key_leniently(server: ShoalServer) -> None:
    assert server.model_version("torch_lower_auto")["state"] == "READY"
    _add_sub_infer(server, "torch_lower_auto", ("OUTPUT0__0", "OUTPUT1__1"))
    assert "intra_op_thread_count 'auto' is not an integer; ignored" in server.log()


def test_graph_level_and_memory_switches_load_and_serve(server: ShoalServer) -> None:
    """Optimizations off, no memory arena or pattern: the same answers (the options
    themselves are read back from ONNX Runtime in tests/unit/workers)."""
    _add_sub_infer(server, "unoptimized")


def test_an_accelerator_this_onnxruntime_lacks_is_left_out_with_a_warning(
    server: ShoalServer,
) -> None:
    _add_sub_infer(server, "openvino")
    assert (
        "model 'openvino': this onnxruntime has no OpenVINO execution provider "
        "(onnxruntime-openvino); the openvino accelerator is left out"
    ) in server.log()


def test_a_model_with_custom_operations_serves_once_their_library_is_registered(
    server: ShoalServer,
) -> None:
    client = httpclient.InferenceServerClient(server.url)
    text = httpclient.InferInput("INPUT0", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"shoal", b"serves"], dtype=object))
    out = client.infer("custom_ops", [text]).as_numpy("OUTPUT0")
    assert out is not None and out.tolist() == [b"SHOAL", b"SERVES"]
    version = server.model_version("no_ops_library")
    assert version["state"] == "UNAVAILABLE"
    assert version["reason"].startswith(
        "failed to load 'no_ops_library' version 1: failed to register the custom operations "
        "in '/nonexistent.so': "
    )
