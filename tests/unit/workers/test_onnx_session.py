"""The ONNX Runtime session options a worker builds from a model's config: what Triton's
onnxruntime backend would set, read back from ONNX Runtime itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.workers.onnx_backend import OnnxRuntimeBackend, _session_options, execution_providers
from tools import modelgen


def _spec(text: str, name: str) -> ModelSpec:
    return read_spec(parse_config_text(text, name))


def test_graph_level_memory_switches_and_session_entries_reach_onnx_runtime() -> None:
    config = _spec(
        'name: "m" platform: "onnxruntime_onnx" optimization { graph { level: 2 } } '
        'parameters [ { key: "enable_mem_arena" value { string_value: "0" } }, '
        '{ key: "enable_mem_pattern" value { string_value: "false" } }, '
        '{ key: "session.use_device_allocator_for_initializers" '
        'value { string_value: "1" } } ]',
        "m",
    )
    so = _session_options(config, 1)
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert so.enable_cpu_mem_arena is False
    assert so.enable_mem_pattern is False
    assert so.get_session_config_entry("session.use_device_allocator_for_initializers") == "1"


def test_without_settings_onnx_runtime_keeps_its_defaults() -> None:
    so = _session_options(_spec('name: "m" platform: "onnxruntime_onnx"', "m"), 1)
    defaults = ort.SessionOptions()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert so.enable_cpu_mem_arena == defaults.enable_cpu_mem_arena
    assert so.enable_mem_pattern == defaults.enable_mem_pattern
    with pytest.raises(RuntimeError, match="does not have configuration with key"):
        so.get_session_config_entry("session.use_device_allocator_for_initializers")


class DeviceArray:
    """Stands in for a cupy array from a client's CUDA region: what the backend asks of
    one (the CUDA array interface, and .get() for a host copy)."""

    def __init__(self, host: np.ndarray) -> None:
        self._host = host
        self.shape = host.shape
        self.__cuda_array_interface__ = {
            "shape": host.shape,
            "typestr": host.dtype.str,
            "data": (0, False),
            "version": 3,
        }

    def get(self) -> np.ndarray:
        return self._host


def _float_to_text_model() -> bytes:
    """FP32 [-1, 2] in, its values as text out (ONNX Cast to STRING)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["INPUT0"], ["OUTPUT0"], to=TensorProto.STRING)],
        "float_to_text",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, [None, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_model_with_a_string_tensor_fed_from_device_memory_runs_from_host_copies(
    tmp_path: Path,
) -> None:
    """IOBinding binds no string tensor ("Only binding non-string Tensors is currently
    supported"), so a model with one does not take the device path for a numeric input
    in a client's CUDA region (it would fail there on a GPU host): it runs from a host
    copy of it."""
    model = tmp_path / "float_to_text.onnx"
    model.write_bytes(_float_to_text_model())
    backend = OnnxRuntimeBackend()
    backend.load(model, ModelSpec(""), 1, False)
    values = np.array([[1.5, 2.0]], dtype=np.float32)
    (out,) = backend.execute({"INPUT0": DeviceArray(values)}, ["OUTPUT0"])
    assert [float(v) for v in out.reshape(-1)] == [1.5, 2.0]


def _accelerated(text: str) -> ModelSpec:
    return _spec(
        'name: "m" platform: "onnxruntime_onnx" '
        f"optimization {{ execution_accelerators {{ {text} }} }}",
        "m",
    )


CPU_ONLY = ["CPUExecutionProvider"]
EVERYTHING = [
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "OpenVINOExecutionProvider",
    "CPUExecutionProvider",
]


def test_without_accelerators_the_providers_are_the_instances_own() -> None:
    config = _spec('name: "m" platform: "onnxruntime_onnx"', "m")
    assert execution_providers(config, False, CPU_ONLY) == (["CPUExecutionProvider"], [])
    assert execution_providers(config, True, EVERYTHING) == (
        ["CUDAExecutionProvider", "CPUExecutionProvider"],
        [],
    )


def test_accelerators_come_first_with_tritons_parameters_in_onnx_runtimes_names() -> None:
    config = _accelerated(
        'gpu_execution_accelerator [ { name: "tensorrt" parameters [ '
        '{ key: "precision_mode" value: "FP16" }, '
        '{ key: "max_workspace_size_bytes" value: "1073741824" }, '
        '{ key: "trt_engine_cache_enable" value: "true" } ] }, '
        '{ name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" } } ] '
        'cpu_execution_accelerator [ { name: "openvino" } ]'
    )
    providers, notes = execution_providers(config, True, EVERYTHING)
    assert notes == []
    assert providers == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "0",
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "true",
            },
        ),
        ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"}),
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}),
        "CPUExecutionProvider",
    ]
    # A CPU instance takes only the CPU accelerators, as in Triton.
    assert execution_providers(config, False, EVERYTHING)[0] == [
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}),
        "CPUExecutionProvider",
    ]


def test_an_accelerator_this_onnxruntime_lacks_is_left_out_with_a_warning() -> None:
    config = _accelerated('cpu_execution_accelerator [ { name: "openvino" } ]')
    providers, notes = execution_providers(config, False, CPU_ONLY)
    assert providers == ["CPUExecutionProvider"]
    assert notes == [
        "model 'm': this onnxruntime has no OpenVINO execution provider "
        "(onnxruntime-openvino); the openvino accelerator is left out"
    ]


_UNKNOWN = "unknown Execution Accelerator '{}' is requested"
_FP8 = 'gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } } ]'  # noqa: E501


@pytest.mark.parametrize(
    ("text", "gpu", "message"),
    [
        ('cpu_execution_accelerator [ { name: "mkl" } ]', False, _UNKNOWN.format("mkl")),
        ('gpu_execution_accelerator [ { name: "gpu_x" } ]', True, _UNKNOWN.format("gpu_x")),
        (_FP8, True, "unsupported precision mode 'FP8' is requested"),
    ],
)
def test_an_accelerator_triton_refuses_fails_the_load(text: str, gpu: bool, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        execution_providers(_accelerated(text), gpu, EVERYTHING)
    assert e.value.message == message


def _with_ops(library: str) -> ModelSpec:
    return _spec(
        f'name: "m" platform: "onnxruntime_onnx" '
        f'model_operations {{ op_library_filename: "{library}" }}',
        "m",
    )


def test_a_custom_operations_library_is_registered_as_triton_registers_it(
    tmp_path: Path,
) -> None:
    import onnxruntime_extensions

    model = tmp_path / "upper.onnx"
    model.write_bytes(modelgen.string_upper_model())
    backend = OnnxRuntimeBackend()
    backend.load(model, _with_ops(onnxruntime_extensions.get_library_path()), 1, False)
    (out,) = backend.execute({"INPUT0": np.array([b"shoal", b"ok"], dtype=object)}, ["OUTPUT0"])
    assert [str(v) for v in out] == ["SHOAL", "OK"]
    # Without the library the model cannot load at all: the registration is what served.
    with pytest.raises(Exception, match="StringUpper"):
        OnnxRuntimeBackend().load(model, ModelSpec(""), 1, False)


def test_a_library_that_cannot_be_loaded_fails_the_load_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "libnothing.so")
    with pytest.raises(ConfigError) as e:
        _session_options(_with_ops(missing), 1)
    assert e.value.message.startswith(f"failed to register the custom operations in '{missing}': ")


def _text_to_float_model() -> bytes:
    """STRING [-1, 2] in, its values as FP32 out (ONNX Cast from STRING)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["INPUT0"], ["OUTPUT0"], to=TensorProto.FLOAT)],
        "text_to_float",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, [None, 2])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_string_input_takes_bytes_or_the_text_a_model_gave_as_its_state(tmp_path: Path) -> None:
    """A client's BYTES come as bytes; a sequence's implicit string state is what ONNX
    Runtime gave as the output state, text, fed back as it is."""
    model = tmp_path / "text_to_float.onnx"
    model.write_bytes(_text_to_float_model())
    backend = OnnxRuntimeBackend()
    backend.load(model, ModelSpec(""), 1, False)
    for values in ([[b"1.5", b"2"]], [["1.5", "2"]]):
        (out,) = backend.execute({"INPUT0": np.array(values, dtype=object)}, ["OUTPUT0"])
        assert out.tolist() == [[1.5, 2.0]]
