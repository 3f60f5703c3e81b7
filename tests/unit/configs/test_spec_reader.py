"""`read_spec`: every field of the roles' structs filled from a config text, and the
defaults when the config leaves them out."""

from __future__ import annotations

import dataclasses

import pytest

from shoal.configs.model_config import parse_config_text
from shoal.configs.model_spec import (
    Accelerator,
    BatchInput,
    BatchOutput,
    DynamicBatching,
    EnsembleScheduling,
    EnsembleStep,
    InitialState,
    InputSpec,
    InstanceGroup,
    ModelSpec,
    Optimization,
    OutputSpec,
    QueuePolicy,
    RateLimiter,
    RateLimiterResource,
    SequenceBatching,
    SequenceControl,
    SequenceState,
    VersionPolicy,
    WarmupInput,
    WarmupSample,
)
from shoal.configs.spec_reader import read_spec, spec_from_bytes

FULL = """
name: "full"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libtriton_onnxruntime.so"
version_policy: { specific: { versions: [1, 3] } }
max_batch_size: 8
default_model_filename: "m.onnx"
cc_model_filenames { key: "8.6" value: "m86.onnx" }
metric_tags { key: "team" value: "vision" }
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
model_operations { op_library_filename: ["libops.so"] }
model_transaction_policy { decoupled: true }
response_cache { enable: true }
input [
  { name: "IN" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, -1] reshape { shape: [3, 2, -1] }
    optional: true allow_ragged_batch: true },
  { name: "SHAPE" data_type: TYPE_INT64 dims: [2] is_shape_tensor: true
    is_non_linear_format_io: true }
]
output [
  { name: "OUT" data_type: TYPE_STRING dims: [4] reshape { shape: [2, 2] }
    label_filename: "labels.txt" is_shape_tensor: true is_non_linear_format_io: true }
]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: ["ACC"] data_type: TYPE_INT32
    source_input: ["IN"] }
]
batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ["OUT"] source_input: ["IN"] } ]
instance_group [
  { name: "g" kind: KIND_GPU count: 2 gpus: [0, 1] passive: true host_policy: "numa0"
    profile: ["p1"]
    rate_limiter { resources [ { name: "R" global: true count: 3 } ] priority: 2 } }
]
dynamic_batching {
  preferred_batch_size: [2, 4] max_queue_delay_microseconds: 100 preserve_ordering: true
  priority_levels: 3 default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 7
    allow_timeout_override: true max_queue_size: 5 }
  priority_queue_policy { key: 1 value: { max_queue_size: 9 } }
}
model_warmup [
  { name: "w" batch_size: 2 count: 3
    inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [3, 4] input_data_file: "in.bin" } }
    inputs { key: "SHAPE" value: { data_type: TYPE_INT64 dims: [2] random_data: true } } }
]
optimization {
  priority: PRIORITY_MAX
  graph { level: -1 }
  execution_accelerators {
    gpu_execution_accelerator [
      { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }
    ]
    cpu_execution_accelerator [ { name: "openvino" } ]
  }
  input_pinned_memory { enable: true }
  output_pinned_memory { enable: false }
  gather_kernel_buffer_threshold: 4
  eager_batching: true
}
"""

SEQUENCE = """
name: "seq"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000
  iterative_sequence: true
  oldest { max_candidate_sequences: 6 preferred_batch_size: [2] max_queue_delay_microseconds: 30
    preserve_ordering: true }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [
    { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [-1]
      use_same_buffer_for_input_output: true use_growable_memory: true
      initial_state [ { name: "init" data_type: TYPE_INT32 dims: [2] data_file: "s.bin" } ] },
    { input_name: "Z_IN" output_name: "Z_OUT" data_type: TYPE_FP32 dims: [1]
      initial_state [ { name: "zero" data_type: TYPE_FP32 dims: [1] zero_data: true } ] }
  ]
}
"""

ENSEMBLE = """
name: "ens"
platform: "ensemble"
ensemble_scheduling {
  max_inflight_requests: 4
  step [
    { model_name: "a" model_version: 2 input_map { key: "X" value: "IN" }
      output_map { key: "Y" value: "MID" } },
    { model_name: "b" model_version: -1 model_namespace: "ns"
      input_map { key: "X" value: "MID" } output_map { key: "Y" value: "OUT" } }
  ]
}
"""


def test_every_field_of_a_full_config() -> None:
    spec = read_spec(parse_config_text(FULL, "full"))
    # (a protobuf map has no order: the warmup inputs are compared by name)
    (sample,) = spec.model_warmup
    assert sample == WarmupSample("w", 2, sample.inputs, 3)
    assert sorted(sample.inputs, key=lambda i: i.name) == [
        WarmupInput("IN", "FP32", (3, 4), "input_data_file", "in.bin"),
        WarmupInput("SHAPE", "INT64", (2,), "random_data", ""),
    ]
    assert dataclasses.replace(spec, model_warmup=()) == ModelSpec(
        name="full",
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        runtime="libtriton_onnxruntime.so",
        version_policy=VersionPolicy("specific", 0, (1, 3)),
        max_batch_size=8,
        inputs=(
            InputSpec("IN", "FP32", (3, -1), (3, 2, -1), "FORMAT_NCHW", True, False, True, False),
            InputSpec("SHAPE", "INT64", (2,), None, "FORMAT_NONE", False, True, False, True),
        ),
        outputs=(OutputSpec("OUT", "BYTES", (4,), (2, 2), "labels.txt", True, True),),
        batch_inputs=(BatchInput("BATCH_ACCUMULATED_ELEMENT_COUNT", ("ACC",), "INT32", ("IN",)),),
        batch_outputs=(BatchOutput("BATCH_SCATTER_WITH_INPUT_SHAPE", ("OUT",), ("IN",)),),
        instance_groups=(
            InstanceGroup(
                "g",
                "KIND_GPU",
                2,
                (0, 1),
                True,
                "numa0",
                ("p1",),
                RateLimiter((RateLimiterResource("R", 3, True),), 2),
            ),
        ),
        default_model_filename="m.onnx",
        cc_model_filenames={"8.6": "m86.onnx"},
        metric_tags={"team": "vision"},
        parameters={"intra_op_thread_count": "2"},
        op_library_filenames=("libops.so",),
        dynamic_batching=DynamicBatching(
            (2, 4),
            100,
            True,
            3,
            2,
            QueuePolicy("DELAY", 7, True, 5),
            {1: QueuePolicy("REJECT", 0, False, 9)},
        ),
        sequence_batching=None,
        ensemble_scheduling=None,
        optimization=Optimization(
            "PRIORITY_MAX",
            -1,
            (Accelerator("tensorrt", {"precision_mode": "FP16"}),),
            (Accelerator("openvino", {}),),
            True,
            False,
            4,
            True,
        ),
        response_cache=True,
        decoupled=True,
    )
    assert not spec.is_ensemble and spec.batching
    assert spec.input("SHAPE") is spec.inputs[1] and spec.input("NONE") is None
    assert spec.output("OUT") is spec.outputs[0]


def test_sequence_batching_oldest_with_controls_and_states() -> None:
    spec = read_spec(parse_config_text(SEQUENCE, "seq"))
    assert spec.sequence_batching == SequenceBatching(
        strategy="oldest",
        max_sequence_idle_us=5000,
        controls=(
            SequenceControl("START", "START", "INVALID", (), (0.0, 1.0)),
            SequenceControl("READY", "READY", "INVALID", (), (), (False, True)),
            SequenceControl("END", "END", "INVALID", (0, 1)),
            SequenceControl("CORRID", "CORRID", "BYTES"),
        ),
        states=(
            SequenceState(
                "S_IN",
                "S_OUT",
                "INT32",
                (-1,),
                (InitialState("init", "INT32", (2,), "s.bin"),),
                True,
                True,
            ),
            SequenceState("Z_IN", "Z_OUT", "FP32", (1,), (InitialState("zero", "FP32", (1,)),)),
        ),
        iterative_sequence=True,
        max_queue_delay_us=30,
        max_candidate_sequences=6,
        preferred_batch_sizes=(2,),
        preserve_ordering=True,
    )


def test_sequence_batching_direct_is_the_default_strategy() -> None:
    text = (
        'name: "d" sequence_batching { direct { max_queue_delay_microseconds: 9 '
        "minimum_slot_utilization: 0.5 } }"
    )
    sb = read_spec(parse_config_text(text, "d")).sequence_batching
    assert sb == SequenceBatching("direct", max_queue_delay_us=9, minimum_slot_utilization=0.5)
    bare = read_spec(parse_config_text('name: "d" sequence_batching {}', "d")).sequence_batching
    assert bare == SequenceBatching()


def test_ensemble_steps() -> None:
    spec = read_spec(parse_config_text(ENSEMBLE, "ens"))
    assert spec.is_ensemble and not spec.batching
    assert spec.ensemble_scheduling == EnsembleScheduling(
        (
            EnsembleStep("a", 2, {"X": "IN"}, {"Y": "MID"}),
            EnsembleStep("b", -1, {"X": "MID"}, {"Y": "OUT"}, "ns"),
        ),
        4,
    )


def test_defaults_when_absent() -> None:
    spec = read_spec(parse_config_text('name: "bare"', "bare"))
    assert spec == ModelSpec("bare")
    assert spec.version_policy == VersionPolicy("latest", 1)
    assert spec.dynamic_batching is None and spec.sequence_batching is None
    assert spec.ensemble_scheduling is None and spec.optimization == Optimization()
    assert not spec.response_cache and not spec.decoupled
    # a bare message gets the protobuf's defaults, as Triton reads them
    db = read_spec(parse_config_text('name: "b" dynamic_batching {}', "b")).dynamic_batching
    assert db == DynamicBatching()


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("version_policy { all {} }", VersionPolicy("all", 0)),
        ("version_policy { latest { num_versions: 3 } }", VersionPolicy("latest", 3)),
    ],
)
def test_version_policies(text: str, policy: VersionPolicy) -> None:
    assert read_spec(parse_config_text(f'name: "v" {text}', "v")).version_policy == policy


def test_from_bytes_and_immutable() -> None:
    config = parse_config_text(FULL, "full")
    spec = spec_from_bytes(config.SerializeToString())
    # (the warmup map's order may differ between two parses)
    assert dataclasses.replace(spec, model_warmup=()) == dataclasses.replace(
        read_spec(config), model_warmup=()
    )
    assert spec.model_warmup[0].batch_size == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.max_batch_size = 1  # type: ignore[misc]
