"""The ONNX Runtime session options a worker builds from a model's config: what Triton's
onnxruntime backend would set, read back from ONNX Runtime itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tritonclient.grpc import model_config_pb2 as pb

from configs.model_config import parse_config_text
from shoal import modelgen
from workers.onnx_backend import OnnxRuntimeBackend, _session_options


def test_graph_level_memory_switches_and_session_entries_reach_onnx_runtime() -> None:
    config = parse_config_text(
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
    so = _session_options(parse_config_text('name: "m" platform: "onnxruntime_onnx"', "m"), 1)
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
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": "|O", "version": 3}

    def get(self) -> np.ndarray:
        return self._host


def test_a_string_model_fed_from_device_memory_runs_from_host_copies(tmp_path: Path) -> None:
    """IOBinding binds no string tensor, so such a model does not take the device path
    (it would fail there on a GPU host) but runs from host copies of its inputs."""
    model = tmp_path / "identity.onnx"
    model.write_bytes(modelgen.identity_model("BYTES", [-1], batch=True))
    backend = OnnxRuntimeBackend()
    backend.load(model, pb.ModelConfig(), 1, False)
    text = np.array([[b"a", b"bc"]], dtype=object)
    (out,) = backend.execute({"INPUT0": DeviceArray(text)}, ["OUTPUT0"])
    assert [str(v) for v in out.reshape(-1)] == ["a", "bc"]
