"""Each validation rule, with the message Triton gives for it."""

from __future__ import annotations

import pytest

from shoal.configs.model_config import (
    DEFAULT_INSTANCE_COUNT,
    ConfigError,
    fill_defaults,
    parse_config_text,
    validate,
    validate_io,
)

IO = """
input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def check(text: str, *, name: str = "m", gpu_count: int = 0, io: str = IO) -> None:
    config = parse_config_text(io + text, name)
    fill_defaults(config, name, gpu_count=gpu_count)
    validate(config, name, gpu_count=gpu_count)


def test_valid_minimal_config_passes() -> None:
    check('platform: "onnxruntime_onnx" max_batch_size: 8')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name: "other" platform: "onnxruntime_onnx"',
            "unexpected directory name 'm' for model 'other', directory name must equal model name",
        ),
        (  # the directory name is checked last, as in Triton's core
            'name: "other" platform: "ensemble"',
            "ensemble scheduling must be set for ensemble other whose platform is ensemble",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: -1',
            "'max_batch_size' must be non-negative value for m",
        ),
        ("", "must specify 'platform' or 'backend' for 'm'"),
        ('platform: "caffe2_netdef"', "unexpected platform type 'caffe2_netdef'"),
        ('backend: "repeat"', "unable to find backend library for backend 'repeat'"),
        (
            'platform: "onnxruntime_onnx" backend: "pytorch"',
            "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch",
        ),
        (  # the file name implies the backend, as core's AutoCompleteBackendFields
            'platform: "onnxruntim" default_model_filename: "model.onnx"',
            "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime",
        ),
        (
            'platform: "ensemble" backend: "python"',
            "Ensemble model 'm' must have platform type 'ensemble' and empty backend type",
        ),
        (
            'backend: "python" ensemble_scheduling { step [ { model_name: "a" } ] }',
            "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
        ),
        (
            'platform: "ensemble"',
            "ensemble scheduling must be set for ensemble m whose platform is ensemble",
        ),
        (
            'platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" } ] }',
            "must specify 'input_map' in step 0 of ensemble 'm'",
        ),
        (
            'platform: "ensemble" ensemble_scheduling { }',
            "must specify 'step' for ensemble 'm'",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 '
            "dynamic_batching { preferred_batch_size: [ 8 ] }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 '
            "dynamic_batching { priority_levels: 3 default_priority_level: 4 }",
            "default priority level must be in range [1, 3] for m",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 '
            "dynamic_batching { priority_levels: 3 }",
            "default priority level must be in range [1, 3]",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 dynamic_batching { priority_levels: 2 '
            "default_priority_level: 1 priority_queue_policy { key: 5 value { } } }",
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 dynamic_batching { '
            "preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 dynamic_batching { '
            "preserve_ordering: true default_queue_policy { timeout_action: DELAY "
            "default_timeout_microseconds: 10 } }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering'",
        ),
        (
            'platform: "onnxruntime_onnx" instance_group [ { kind: KIND_GPU } ]',
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available",
        ),
        (
            'platform: "onnxruntime_onnx" instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]',
            "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs",
        ),
        (
            'platform: "onnxruntime_onnx" response_cache { enable: true } '
            "model_transaction_policy { decoupled: true }",
            "Response Cache does not currently support model m with 'decoupled'",
        ),
        (
            'platform: "onnxruntime_onnx" model_metrics { metric_control [ { } ] }',
            "metric control must specify 'metric_identifier'",
        ),
        (
            'platform: "onnxruntime_onnx" metric_tags { key: "cost-centre" value: "x" }',
            "metric_tags key 'cost-centre' cannot be a metric label ('_cost-centre')",
        ),
        (
            'platform: "onnxruntime_onnx" metric_tags { key: "_team" value: "x" }',
            "metric_tags key '_team' cannot be a metric label",
        ),
    ],
)
def test_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check(text)
    assert message in info.value.message
    assert info.value.model in ("m", "other")


def test_invalid_gpu_id_uses_triton_wording() -> None:
    text = (
        'platform: "onnxruntime_onnx" instance_group [ { name: "g" kind: KIND_GPU gpus: [ 42 ] } ]'
    )
    with pytest.raises(ConfigError) as info:
        check(text, gpu_count=2)
    assert info.value.message == (
        "instance group g of model m specifies invalid or unsupported gpu id 42. GPUs with "
        "at least the minimum required CUDA compute compatibility of 6.000000 are: 0, 1"
    )


def test_profile_message_is_triton_verbatim() -> None:
    text = (
        'platform: "onnxruntime_onnx" instance_group [ { name: "g" kind: KIND_CPU profile: "0" } ]'
    )
    with pytest.raises(ConfigError) as info:
        check(text)
    # Triton's message has no space between the platform and "specifies".
    assert info.value.message == (
        "instance group g of model m and platform onnxruntime_onnxspecifies profile field "
        "which is only supported for TensorRT models"
    )


def test_negative_count_becomes_the_default_like_triton() -> None:
    config = parse_config_text(
        IO + 'platform: "onnxruntime_onnx" instance_group [ { kind: KIND_CPU count: -1 } ]', "m"
    )
    fill_defaults(config, "m")
    validate(config, "m")  # Triton accepts it: ValidateInstanceGroup has no count rule
    assert config.instance_group[0].count == DEFAULT_INSTANCE_COUNT


def test_valid_gpu_group_passes() -> None:
    check(
        'platform: "onnxruntime_onnx" instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]',
        gpu_count=2,
    )


def test_empty_config_name_is_rejected_without_defaults() -> None:
    config = parse_config_text('platform: "onnxruntime_onnx"', "m")
    with pytest.raises(ConfigError, match="model configuration must specify 'name'"):
        validate(config, "m")


def test_unfilled_kind_auto_is_rejected_without_defaults() -> None:
    config = parse_config_text(
        'name: "m" platform: "onnxruntime_onnx" version_policy { all { } } '
        'instance_group [ { name: "g" count: 1 } ]',
        "m",
    )
    with pytest.raises(ConfigError, match="has unexpected kind KIND_AUTO"):
        validate(config, "m")


@pytest.mark.parametrize(
    ("io", "message"),
    [
        (
            'input [ { name: "input" dims: [ 4 ] } ]',
            "model input 'input' must specify 'data_type' for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 0 ] } ]',
            "model input 'input' dimension must be integer >= 1, or -1 to indicate a "
            "variable-size dimension for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ -2 ] } ]',
            "model input 'input' dimension must be integer >= 1, or -1",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 } ]',
            "model input 'input' must specify 'dims' for m",
        ),
        (
            "input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]",
            "model input must specify 'name' for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 2, 3 ] '
            "reshape { shape: [ 5 ] } } ]",
            "model input 'input' has different size for dims and reshape for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 2, -1 ] '
            "reshape { shape: [ -1, 2, -1 ] } } ]",
            "model input 'input' has different number of variable-size dimensions",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 2, -1 ] '
            "reshape { shape: [ 3, -1 ] } } ]",
            "model input 'input' has different size for dims and reshape",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ 0 ] } } ]',
            "reshape dimensions must be integer >= 1",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 4 ] } ]',
            "model input NHWC/NCHW require 3 dims for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] is_shape_tensor: true } ]',
            "shape tensors are only supported for TensorRT platform for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] }, '
            '{ name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "model input 'input' is specified more than once for m",
        ),
        (
            'output [ { name: "out" data_type: TYPE_FP32 dims: [ 4 ] }, '
            '{ name: "out" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "model output 'out' is specified more than once for m",
        ),
        (
            'output [ { name: "out" dims: [ 4 ] } ]',
            "model output 'out' must specify 'data_type' for m",
        ),
        (
            'input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ] batch_input [ { '
            'kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 source_input: "x" } ]',
            "unknown source input name 'x' for m",
        ),
    ],
)
def test_io_errors(io: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check('platform: "onnxruntime_onnx" max_batch_size: 0', io=io)
    assert message in info.value.message


def test_io_valid_reshapes_pass() -> None:
    check(
        'platform: "onnxruntime_onnx" max_batch_size: 8',
        io='input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }, '
        '{ name: "b" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] '
        "reshape { shape: [ 8, -1, 1, 6 ] } } ]",
    )


def test_empty_reshape_needs_batching() -> None:
    with pytest.raises(ConfigError, match="cannot have empty reshape for non-batching model"):
        check(
            'platform: "onnxruntime_onnx"',
            io='input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]',
        )


def test_io_check_can_be_deferred() -> None:
    config = parse_config_text('platform: "onnxruntime_onnx" input [ { name: "input" } ]', "m")
    fill_defaults(config, "m")
    validate(config, "m", check_io=False)
    with pytest.raises(ConfigError, match="must specify 'data_type'"):
        validate_io(config)


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_START '
            'int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: '
            "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]",
            "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_END } ] } ]',
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_END for m",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY '
            "int32_false_true: [ 0, 1, 2 ] } ] } ]",
            "sequence batching control 'int32_false_true' must have exactly 2 entries",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_FP32 } ] } ]",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_START '
            'int32_false_true: [ 0, 1 ] } ] }, { name: "A" control [ { kind: '
            "CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]",
            "sequence batching control tensor 'A' is specified for multiple control kinds",
        ),
        (
            "direct { minimum_slot_utilization: 1.5 }",
            "sequence batching minimum slot utilization must be in range (0.0, 1.0]",
        ),
        (
            "oldest { preferred_batch_size: [ 16 ] }",
            "sequence batching preferred batch size must be <= max batch size for m",
        ),
    ],
)
def test_sequence_errors(sequence: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check(f'platform: "onnxruntime_onnx" max_batch_size: 4 sequence_batching {{ {sequence} }}')
    assert message in info.value.message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "failed to convert 'soon' to integral number"),
        ("-2", "shoal_share_min_compute_us must be -1 (never share) or >= 0 for m"),
    ],
)
@pytest.mark.parametrize("batching", ["dynamic_batching { }", ""])  # auto-complete may add it
def test_share_min_compute_must_be_an_integer_from_minus_one(
    value: str, message: str, batching: str
) -> None:
    text = (
        f'platform: "onnxruntime_onnx" max_batch_size: 8 {batching} '
        f'parameters {{ key: "shoal_share_min_compute_us" value {{ string_value: "{value}" }} }}'
    )
    with pytest.raises(ConfigError) as e:
        check(text)
    assert message in str(e.value)
    for good in ("0", "-1", "5000"):
        check(text.replace(f'"{value}"', f'"{good}"'))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("lots", "failed to convert 'lots' to integral number"),
        ("-1", "shoal_instance_memory_limit_mb must be 0 (no limit) or a number of MiB for m"),
    ],
)
def test_instance_memory_limit_must_be_a_whole_number_of_mib(value: str, message: str) -> None:
    text = (
        'platform: "onnxruntime_onnx" max_batch_size: 8 parameters { key: '
        f'"shoal_instance_memory_limit_mb" value {{ string_value: "{value}" }} }}'
    )
    with pytest.raises(ConfigError) as e:
        check(text)
    assert message in str(e.value)
    for good in ("0", "2048"):
        check(text.replace(f'"{value}"', f'"{good}"'))
