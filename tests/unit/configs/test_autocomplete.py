"""Auto-complete from model tensors and the check of a config against its model."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.autocomplete import autocomplete, can_batch, check_against_model
from shoal.configs.model_config import ConfigError, fill_defaults, parse_config_text, validate
from shoal.configs.schema import IOSpec

BATCH_IN = [IOSpec("INPUT0", "INT32", [-1, 16]), IOSpec("INPUT1", "INT32", [-1, 16])]
BATCH_OUT = [IOSpec("OUTPUT0", "INT32", [-1, 16]), IOSpec("OUTPUT1", "INT32", [-1, 16])]
FIXED_IN = [IOSpec("INPUT0", "FP32", [1, 16])]
FIXED_OUT = [IOSpec("OUTPUT0", "BYTES", [1, 16])]


def base(text: str = "") -> pb.ModelConfig:
    return fill_defaults(
        parse_config_text('platform: "onnxruntime_onnx" ' + text, "simple"), "simple"
    )


def test_no_config_batching_model() -> None:
    config = base()
    done = autocomplete(config, BATCH_IN, BATCH_OUT)
    assert done.max_batch_size == 4
    assert done.HasField("dynamic_batching")
    assert [(io.name, io.data_type, list(io.dims)) for io in done.input] == [
        ("INPUT0", pb.TYPE_INT32, [16]),
        ("INPUT1", pb.TYPE_INT32, [16]),
    ]
    assert [io.name for io in done.output] == ["OUTPUT0", "OUTPUT1"]
    assert len(config.input) == 0  # the argument is not modified
    validate(done, "simple")
    check_against_model(done, BATCH_IN, BATCH_OUT)


def test_autocomplete_fills_preferred_batch_size_like_triton() -> None:
    # Triton qa/L0_model_config/autofill_noplatform_success/onnx/no_config/expected:
    #   max_batch_size: 4 ... dynamic_batching { preferred_batch_size: 4 }
    done = autocomplete(base(), BATCH_IN, BATCH_OUT)
    assert list(done.dynamic_batching.preferred_batch_size) == [4]


def test_autocomplete_fills_preferred_for_user_empty_dynamic_batching() -> None:
    done = autocomplete(base("dynamic_batching { }"), BATCH_IN, BATCH_OUT)
    assert done.max_batch_size == 4
    assert list(done.dynamic_batching.preferred_batch_size) == [4]


def test_autocomplete_keeps_user_preferred_sizes() -> None:
    done = autocomplete(
        base("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2 ] }"),
        BATCH_IN,
        BATCH_OUT,
    )
    assert list(done.dynamic_batching.preferred_batch_size) == [2]


def test_default_max_batch_size_is_configurable() -> None:
    done = autocomplete(base(), BATCH_IN, BATCH_OUT, default_max_batch_size=1)
    assert done.max_batch_size == 1
    assert not done.HasField("dynamic_batching")  # only added when max_batch_size > 1


def test_explicit_max_batch_size_and_scheduler_kept() -> None:
    done = autocomplete(base("max_batch_size: 16 sequence_batching { }"), BATCH_IN, BATCH_OUT)
    assert done.max_batch_size == 16
    assert done.HasField("sequence_batching") and not done.HasField("dynamic_batching")


def test_non_batching_model() -> None:
    done = autocomplete(base(), FIXED_IN, FIXED_OUT)
    assert done.max_batch_size == 0
    assert not done.HasField("dynamic_batching")
    assert list(done.input[0].dims) == [1, 16]
    assert done.output[0].data_type == pb.TYPE_STRING


def test_non_batching_model_with_max_batch_size_fails() -> None:
    with pytest.raises(ConfigError) as info:
        autocomplete(base("max_batch_size: 8"), FIXED_IN, FIXED_OUT)
    assert info.value.message == (
        "autofill failed for model 'simple': model does not support batching while "
        "non-zero max_batch_size is specified"
    )


def test_scalar_tensors_get_dims_1_and_reshape_when_batching() -> None:
    done = autocomplete(base(), [IOSpec("X", "FP32", [-1])], [IOSpec("Y", "FP32", [-1])])
    assert list(done.input[0].dims) == [1]
    assert done.input[0].HasField("reshape") and list(done.input[0].reshape.shape) == []
    validate(done, "simple")
    check_against_model(done, [IOSpec("X", "FP32", [-1])], [IOSpec("Y", "FP32", [-1])])


def test_scalar_tensors_without_batching() -> None:
    done = autocomplete(base(), [IOSpec("X", "FP32", [])], [IOSpec("Y", "FP32", [])])
    assert list(done.input[0].dims) == [1]
    assert not done.input[0].HasField("reshape")
    check_against_model(done, [IOSpec("X", "FP32", [])], [IOSpec("Y", "FP32", [])])


def test_partial_config_fills_missing_fields_and_inputs() -> None:
    config = base('max_batch_size: 2 input [ { name: "INPUT1" } ]')
    done = autocomplete(config, BATCH_IN, BATCH_OUT)
    assert [io.name for io in done.input] == ["INPUT1", "INPUT0"]
    assert done.input[0].data_type == pb.TYPE_INT32 and list(done.input[0].dims) == [16]
    assert [io.name for io in done.output] == ["OUTPUT0", "OUTPUT1"]
    check_against_model(done, BATCH_IN, BATCH_OUT)


def test_listed_output_subset_is_kept() -> None:
    config = base('output [ { name: "OUTPUT1" } ]')
    done = autocomplete(config, BATCH_IN, BATCH_OUT)
    assert [io.name for io in done.output] == ["OUTPUT1"]
    assert len(done.input) == 2


def test_complete_config_is_left_alone() -> None:
    config = base(
        'max_batch_size: 0 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1, 16 ] } ]'
        ' output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1, 16 ] } ]'
    )
    done = autocomplete(config, BATCH_IN, BATCH_OUT)
    assert done == config


def test_partial_config_unknown_input() -> None:
    with pytest.raises(ConfigError) as info:
        autocomplete(base('input [ { name: "NOPE" } ]'), BATCH_IN, BATCH_OUT)
    assert info.value.message == (
        "unable to load model 'simple', unexpected inference input 'NOPE', allowed inputs "
        "are: INPUT0, INPUT1"
    )


def test_partial_config_datatype_mismatch() -> None:
    with pytest.raises(ConfigError) as info:
        autocomplete(base('input [ { name: "INPUT0" data_type: TYPE_FP32 } ]'), BATCH_IN, BATCH_OUT)
    assert info.value.message == (
        "unable to load model 'simple', configuration expects datatype TYPE_FP32 for input "
        "'INPUT0', model provides TYPE_INT32"
    )


def test_unsupported_model_datatype() -> None:
    with pytest.raises(ConfigError, match="unsupported datatype COMPLEX64"):
        autocomplete(base(), [IOSpec("X", "COMPLEX64", [2])], FIXED_OUT)


def test_can_batch() -> None:
    assert can_batch(BATCH_IN, BATCH_OUT)
    assert not can_batch(BATCH_IN, [IOSpec("Y", "FP32", [])])
    assert not can_batch(FIXED_IN, BATCH_OUT)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ] '
            'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]',
            "unable to load model 'simple', configuration expects 1 inputs, model provides 2",
        ),
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
            '{ name: "X" data_type: TYPE_INT32 dims: [ 16 ] } ]',
            "unexpected inference input 'X', allowed inputs are: INPUT0, INPUT1",
        ),
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
            '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ] '
            'output [ { name: "OUTPUT0" data_type: TYPE_FP16 dims: [ 16 ] } ]',
            "configuration expects datatype TYPE_FP16 for output 'OUTPUT0', model provides "
            "TYPE_INT32",
        ),
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 8 ] }, '
            '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]',
            "model 'simple', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) "
            "but the model configuration specifies 2 dimensions (an initial batch dimension "
            "because max_batch_size > 0 followed by the explicit tensor shape, making complete "
            "shape [-1,8])",
        ),
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] }, '
            '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]',
            "model 'simple', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) "
            "but the model configuration specifies 3 dimensions (an initial batch dimension",
        ),
        (
            'max_batch_size: 0 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
            '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ -1, 16 ] } ]',
            "the model expects 2 dimensions (shape [-1,16]) but the model configuration "
            "specifies 1 dimensions (shape [16])",
        ),
    ],
)
def test_check_against_model_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_against_model(base(text), BATCH_IN, BATCH_OUT)
    assert message in info.value.message
    assert info.value.model == "simple"


def test_check_against_model_batching_needs_dynamic_first_dim() -> None:
    config = base(
        'max_batch_size: 8 input [ { name: "X" data_type: TYPE_INT32 dims: [ 16 ] } ] '
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]'
    )
    with pytest.raises(ConfigError) as info:
        check_against_model(config, [IOSpec("X", "INT32", [4, 16])], BATCH_OUT)
    assert info.value.message == (
        "model 'simple', tensor 'X': for the model to support batching the shape should have "
        "at least 1 dimension and the first dimension must be -1; but shape expected by the "
        "model is [4,16]"
    )


def test_check_against_model_counts_sequence_controls() -> None:
    config = base(
        'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ] '
        'sequence_batching { control_input [ { name: "INPUT1" control [ { kind: '
        "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }"
    )
    check_against_model(config, BATCH_IN, BATCH_OUT)


def test_check_against_model_reshape_and_wildcards() -> None:
    config = base(
        'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4, 4 ] '
        'reshape { shape: [ 16 ] } }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]'
    )
    check_against_model(config, BATCH_IN, BATCH_OUT)


def test_sequence_controls_and_states_are_never_added_as_client_tensors() -> None:
    """The server feeds control tensors and implicit state; an output state goes to a
    client only when the config lists it."""
    cfg = parse_config_text(
        'name: "acc" sequence_batching { control_input [ { name: "START" control [ { kind: '
        'CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] state [ { input_name: "S_IN" '
        'output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] }',
        "acc",
    )
    ins = [IOSpec(n, "INT32", [-1, 1]) for n in ("INPUT", "START", "S_IN")]
    outs = [IOSpec(n, "INT32", [-1, 1]) for n in ("OUTPUT", "S_OUT")]
    done = autocomplete(cfg, ins, outs)
    assert [i.name for i in done.input] == ["INPUT"]
    assert [o.name for o in done.output] == ["OUTPUT"]
    assert not done.HasField("dynamic_batching")  # the sequence batcher schedules it
    check_against_model(done, ins, outs)
