"""Parsing, default filling, JSON rendering and metadata of model configs."""

from __future__ import annotations

import json

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_config import (
    DEFAULT_INSTANCE_COUNT,
    ConfigError,
    config_to_json,
    fill_defaults,
    io_specs,
    model_metadata,
    parse_config_json,
    parse_config_text,
    validate,
)
from shoal.configs.schema import IOSpec

DYNAMIC_CONFIG = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "IMAGE" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] reshape: { shape: [ -1 ] } }
]
instance_group [
  { name: "gpu_group" kind: KIND_GPU count: 2 gpus: [ 0, 1 ] },
  { kind: KIND_CPU count: 3 }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 }
  priority_queue_policy {
    key: 1
    value { max_queue_size: 4 default_timeout_microseconds: 7000000000 }
  }
}
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs {
      key: "INPUT0"
      value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true }
    }
  }
]
"""

SEQUENCE_CONFIG = """
name: "simple_sequence"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
}
instance_group [ { kind: KIND_CPU } ]
"""


def test_rich_dynamic_config_parses_fills_and_validates() -> None:
    config = parse_config_text(DYNAMIC_CONFIG, "simple")
    fill_defaults(config, "simple", gpu_count=2)
    validate(config, "simple", gpu_count=2)
    assert config.backend == "onnxruntime"
    assert config.default_model_filename == "model.onnx"
    assert [g.name for g in config.instance_group] == ["gpu_group", "simple_1"]
    assert config.dynamic_batching.priority_queue_policy[1].max_queue_size == 4
    assert list(config.version_policy.specific.versions) == [1, 3]


def test_rich_sequence_config_parses_and_validates() -> None:
    config = parse_config_text(SEQUENCE_CONFIG, "simple_sequence")
    fill_defaults(config, "simple_sequence")
    validate(config, "simple_sequence")
    assert config.platform == ""  # Triton leaves python models without a platform
    assert config.default_model_filename == "model.py"
    assert config.instance_group[0].count == 1
    assert config.version_policy.latest.num_versions == 1


def test_parse_error_names_model_and_position() -> None:
    text = 'name: "simple"\ninput [ { name: "a" data_typ: TYPE_FP32 } ]'
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, "simple")
    assert info.value.model == "simple"
    assert info.value.message.startswith("failed to load 'simple': 2:")
    assert "data_typ" in info.value.message
    assert info.value.http_status == 400


def test_parse_error_bad_enum() -> None:
    with pytest.raises(ConfigError, match="KIND_FOO"):
        parse_config_text("instance_group [ { kind: KIND_FOO } ]", "m")


def test_json_config_accepts_string_int64_and_lowercase_enums() -> None:
    text = json.dumps(
        {
            "max_batch_size": "16",
            "input": [{"name": "x", "data_type": "type_fp32", "dims": ["3", 4]}],
            "instance_group": [{"kind": "kind_cpu", "count": 2}],
            "dynamic_batching": {"max_queue_delay_microseconds": 100},
        }
    )
    config = parse_config_json(text, "m")
    assert config.max_batch_size == 16
    assert list(config.input[0].dims) == [3, 4]
    assert config.input[0].data_type == pb.TYPE_FP32
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert config.dynamic_batching.max_queue_delay_microseconds == 100


def test_json_config_takes_one_element_for_a_repeated_field() -> None:
    """Triton's parser (protobuf's legacy syntax) reads one element as a list of it
    (L0_lifecycle test_concurrent_model_instance_load_sanity sends such a config)."""
    text = json.dumps(
        {
            "instance_group": {"kind": "KIND_CPU", "count": 5},
            "input": {"name": "x", "data_type": "TYPE_FP32", "dims": 4},
            "sequence_batching": {"direct": {}, "max_sequence_idle_microseconds": 10},
            "parameters": {"k": {"string_value": "v"}},
        }
    )
    config = parse_config_json(text, "m")
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (pb.ModelInstanceGroup.KIND_CPU, 5)
    ]
    assert config.input[0].name == "x" and list(config.input[0].dims) == [4]
    assert config.parameters["k"].string_value == "v"  # (a map stays a map)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        '{"no_such_field": 1}',
        '{"max_batch_size": "x"}',
        '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}",  # past the interpreter's recursion
    ],
)
def test_json_config_errors_say_failed_to_load(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^failed to load 'm': "):
        parse_config_json(text, "m")


def test_json_rendering_matches_triton() -> None:
    config = parse_config_text(DYNAMIC_CONFIG, "simple")
    fill_defaults(config, "simple", gpu_count=2)
    doc = config_to_json(config)
    assert doc["max_batch_size"] == 8
    assert doc["input"][0]["dims"] == [16]
    assert doc["input"][0]["data_type"] == "TYPE_INT32"
    assert doc["input"][0]["format"] == "FORMAT_NONE"
    assert doc["input"][1]["format"] == "FORMAT_NCHW"
    assert doc["input"][0]["optional"] is False
    assert doc["output"][0]["reshape"]["shape"] == [-1]
    assert doc["output"][0]["label_filename"] == ""
    assert doc["instance_group"][0]["kind"] == "KIND_GPU"
    assert doc["instance_group"][0]["gpus"] == [0, 1]
    assert doc["instance_group"][1]["kind"] == "KIND_CPU"
    assert doc["version_policy"] == {"specific": {"versions": [1, 3]}}
    db = doc["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 100
    assert db["priority_levels"] == 3
    assert db["default_priority_level"] == 2
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 5000
    assert db["default_queue_policy"]["timeout_action"] == "DELAY"
    # Map keys stay strings (JSON), the 64-bit values inside become numbers.
    assert db["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7000000000
    assert db["preserve_ordering"] is False
    warmup_input = doc["model_warmup"][0]["inputs"]["INPUT0"]
    assert warmup_input["dims"] == [16]
    assert doc["parameters"] == {"intra_op_thread_count": {"string_value": "2"}}
    json.dumps(doc)  # plain JSON types only


def test_json_rendering_sequence_fields_are_numbers() -> None:
    config = parse_config_text(SEQUENCE_CONFIG, "simple_sequence")
    fill_defaults(config, "simple_sequence")
    sb = config_to_json(config)["sequence_batching"]
    assert sb["max_sequence_idle_microseconds"] == 5000000
    assert sb["oldest"]["max_queue_delay_microseconds"] == 0
    assert sb["state"][0]["dims"] == [-1, 4]
    assert sb["control_input"][0]["control"][0]["kind"] == "CONTROL_SEQUENCE_START"


def test_json_rendering_prints_defaults_of_a_minimal_config() -> None:
    config = fill_defaults(pb.ModelConfig(platform="onnxruntime_onnx"), "m")
    doc = config_to_json(config)
    assert doc["max_batch_size"] == 0
    assert doc["input"] == [] and doc["output"] == []
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}
    assert doc["instance_group"] == [
        {
            "name": "m",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert doc["optimization"] == {
        "priority": "PRIORITY_DEFAULT",
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    }
    assert "dynamic_batching" not in doc


def test_json_round_trip() -> None:
    config = parse_config_text(DYNAMIC_CONFIG, "simple")
    assert parse_config_json(json.dumps(config_to_json(config)), "simple") == config


@pytest.mark.parametrize(
    ("given", "platform", "backend", "filename"),
    [
        ({"platform": "onnxruntime_onnx"}, "onnxruntime_onnx", "onnxruntime", "model.onnx"),
        ({"backend": "onnxruntime"}, "onnxruntime_onnx", "onnxruntime", "model.onnx"),
        ({"platform": "pytorch_libtorch"}, "pytorch_libtorch", "pytorch", "model.pt"),
        ({"backend": "pytorch"}, "pytorch_libtorch", "pytorch", "model.pt"),
        ({"platform": "tensorrt_plan"}, "tensorrt_plan", "tensorrt", "model.plan"),
        ({"backend": "tensorrt"}, "tensorrt_plan", "tensorrt", "model.plan"),
        ({"backend": "python"}, "", "python", "model.py"),
        ({"default_model_filename": "model.onnx"}, "onnxruntime_onnx", "onnxruntime", "model.onnx"),
        ({"platform": "ensemble"}, "ensemble", "", ""),
    ],
)
def test_fill_defaults_pairs_platform_and_backend(
    given: dict[str, str], platform: str, backend: str, filename: str
) -> None:
    config = fill_defaults(pb.ModelConfig(**given), "m")
    assert (config.platform, config.backend, config.default_model_filename) == (
        platform,
        backend,
        filename,
    )


def test_fill_defaults_instance_groups() -> None:
    config = pb.ModelConfig(name="m", backend="python")
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_GPU)
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_AUTO, count=2)
    config.instance_group.add(name="named", kind=pb.ModelInstanceGroup.KIND_AUTO, gpus=[7])
    fill_defaults(config, "m", gpu_count=2)
    groups = config.instance_group
    assert [g.name for g in groups] == ["m_0", "m_1", "named"]
    assert list(groups[0].gpus) == [0, 1] and groups[0].count == 1
    assert groups[1].kind == pb.ModelInstanceGroup.KIND_GPU and groups[1].count == 2
    # KIND_AUTO naming a GPU that does not exist falls back to the CPU, as in Triton.
    assert groups[2].kind == pb.ModelInstanceGroup.KIND_CPU


def test_kind_auto_stays_on_the_cpu_for_a_backend_whose_runtime_has_no_gpu() -> None:
    """A GPU host with the CPU build of onnxruntime: its models' KIND_AUTO is KIND_CPU
    (as in a Triton built without GPU support), where they can run; an explicit KIND_GPU
    is kept, and fails at load with the reason; torch, with a CUDA build, gets the GPUs."""
    cpu_only = {"onnxruntime"}
    onnx = pb.ModelConfig(name="m", platform="onnxruntime_onnx")
    fill_defaults(onnx, "m", gpu_count=2, cpu_only_backends=cpu_only)
    assert onnx.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    explicit = pb.ModelConfig(name="m", platform="onnxruntime_onnx")
    explicit.instance_group.add(kind=pb.ModelInstanceGroup.KIND_GPU)
    fill_defaults(explicit, "m", gpu_count=2, cpu_only_backends=cpu_only)
    assert explicit.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    assert list(explicit.instance_group[0].gpus) == [0, 1]
    torch_model = pb.ModelConfig(name="m", platform="pytorch_libtorch")
    fill_defaults(torch_model, "m", gpu_count=2, cpu_only_backends=cpu_only)
    assert torch_model.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    assert list(torch_model.instance_group[0].gpus) == [0, 1]


def test_the_backends_found_cpu_only_are_those_whose_runtime_says_so() -> None:
    """Read from the installed files; checked here against the runtimes' own answer."""
    import onnxruntime
    import torch

    from shoal.configs.devices import cpu_only_backends

    ort_gpu = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert ("onnxruntime" in cpu_only_backends()) == (not ort_gpu)
    assert ("pytorch" in cpu_only_backends()) == (not torch.backends.cuda.is_built())


def test_default_instance_group_is_named_after_the_model() -> None:
    # Triton: group->set_name(config->name()); qa .../onnx/no_config/expected: name: "no_config"
    config = fill_defaults(pb.ModelConfig(platform="onnxruntime_onnx"), "no_config")
    assert [g.name for g in config.instance_group] == ["no_config"]


def test_unnamed_explicit_groups_still_get_an_index() -> None:
    config = pb.ModelConfig(name="m", platform="onnxruntime_onnx")
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU)
    fill_defaults(config, "m")
    assert [g.name for g in config.instance_group] == ["m_0"]


@pytest.mark.parametrize("count", [0, -1])
def test_count_below_one_becomes_the_default(count: int) -> None:
    # Triton's NormalizeInstanceGroup: count() < 1 -> SetDefaultInstanceCount.
    config = pb.ModelConfig(name="m", platform="onnxruntime_onnx")
    config.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=count)
    fill_defaults(config, "m")
    assert config.instance_group[0].count == DEFAULT_INSTANCE_COUNT


def test_fill_defaults_enables_pinned_memory_like_triton() -> None:
    doc = config_to_json(fill_defaults(pb.ModelConfig(platform="onnxruntime_onnx"), "m"))
    assert doc["optimization"]["input_pinned_memory"] == {"enable": True}
    assert doc["optimization"]["output_pinned_memory"] == {"enable": True}


def test_fill_defaults_keeps_the_pinned_memory_a_config_sets() -> None:
    text = 'platform: "onnxruntime_onnx" optimization { input_pinned_memory { enable: false } }'
    config = fill_defaults(parse_config_text(text, "m"), "m")
    assert config.optimization.input_pinned_memory.enable is False
    assert config.optimization.output_pinned_memory.enable is True


def test_fill_defaults_default_group_uses_gpus_when_present() -> None:
    config = fill_defaults(pb.ModelConfig(backend="onnxruntime"), "m", gpu_count=2)
    (group,) = config.instance_group
    assert group.kind == pb.ModelInstanceGroup.KIND_GPU
    assert list(group.gpus) == [0, 1]


def test_fill_defaults_leaves_scheduling_and_ensembles_alone() -> None:
    config = pb.ModelConfig(platform="ensemble")
    config.ensemble_scheduling.step.add(model_name="a")
    fill_defaults(config, "e")
    assert len(config.instance_group) == 0
    assert not config.HasField("optimization")  # Triton rejects it on an ensemble
    assert not config.HasField("dynamic_batching")


def test_metadata_shape_and_datatypes() -> None:
    config = parse_config_text(DYNAMIC_CONFIG, "simple")
    assert model_metadata(config, [1, 3]) == {
        "name": "simple",
        "versions": ["1", "3"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "IMAGE", "datatype": "FP32", "shape": [-1, 3, 224, 224]},
        ],
        "outputs": [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [-1, -1]}],
    }


def test_metadata_without_batching_and_backend_only() -> None:
    config = parse_config_text(
        'name: "p" backend: "python" input [ { name: "X" data_type: TYPE_BF16 dims: [2, 3] } ]',
        "p",
    )
    meta = model_metadata(config, [2])
    assert meta["platform"] == "python"
    assert meta["inputs"] == [{"name": "X", "datatype": "BF16", "shape": [2, 3]}]
    assert meta["outputs"] == []


def test_io_specs_include_batch_dim() -> None:
    config = parse_config_text(DYNAMIC_CONFIG, "simple")
    inputs, outputs = io_specs(config)
    assert inputs[0] == IOSpec("INPUT0", "INT32", [-1, 16])
    assert outputs[0] == IOSpec("OUTPUT0", "BYTES", [-1, -1])


def test_dynamic_batching_without_preferred_sizes_prefers_max_batch_size() -> None:
    batching = fill_defaults(parse_config_text("max_batch_size: 16 dynamic_batching {}", "m"), "m")
    assert list(batching.dynamic_batching.preferred_batch_size) == [16]
    text = "max_batch_size: 16 dynamic_batching { preferred_batch_size: 4 }"
    given = fill_defaults(parse_config_text(text, "m"), "m")
    assert list(given.dynamic_batching.preferred_batch_size) == [4]
    no_batch = fill_defaults(parse_config_text("max_batch_size: 0 dynamic_batching {}", "m"), "m")
    assert list(no_batch.dynamic_batching.preferred_batch_size) == []
