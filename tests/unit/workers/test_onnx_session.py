"""The ONNX Runtime session options a worker builds from a model's config: what Triton's
onnxruntime backend would set, read back from ONNX Runtime itself."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from configs.model_config import parse_config_text
from workers.onnx_backend import _session_options


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
