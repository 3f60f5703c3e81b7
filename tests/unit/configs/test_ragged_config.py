"""Configs with ragged inputs, batch inputs and batch outputs: the load-time checks of
Triton's core (ValidateBatchIO) and ONNX Runtime backend (ValidateInputs/ValidateOutputs),
and auto-complete around them."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.autocomplete import autocomplete, check_against_model
from shoal.configs.model_config import ConfigError, fill_defaults, parse_config_text, validate
from shoal.configs.schema import IOSpec
from shoal.workers.batch_io import BATCH_INPUT_KINDS
from tools import modelgen

# What ONNX Runtime reports for modelgen.ragged_sum_model().
RAGGED_IN = [
    IOSpec("INPUT0", "FP32", [-1]),
    IOSpec("INDEX", "INT32", [-1]),
    IOSpec("COUNT", "FP32", [-1]),
]
RAGGED_OUT = [
    IOSpec("SUM", "FP32", [-1, 1]),
    IOSpec("LENGTH", "FP32", [-1, 1]),
    IOSpec("DOUBLED", "FP32", [-1]),
]


def config(text: str) -> pb.ModelConfig:
    return fill_defaults(parse_config_text(text, "m"), "m")


def ragged_sum(extra: str = "") -> pb.ModelConfig:
    return config(modelgen.RAGGED_SUM_CONFIG.format(name="m", extra=extra))


def test_a_one_dimensional_ragged_model_loads() -> None:
    # The bug: "the model expects 1 dimensions ... specifies 2 dimensions".
    done = ragged_sum()
    validate(done, "m")
    check_against_model(done, RAGGED_IN, RAGGED_OUT)
    assert autocomplete(done, RAGGED_IN, RAGGED_OUT) == done  # complete: left alone


def test_ragged_config_dims_are_not_compared_with_the_model() -> None:
    text = modelgen.RAGGED_SUM_CONFIG.format(name="m", extra="")
    check_against_model(
        config(text.replace("dims: [ -1 ]\n    allow", "dims: [ 2, -1 ]\n    allow")),
        RAGGED_IN,
        RAGGED_OUT,
    )


def test_a_ragged_input_must_be_one_dimensional_in_the_model() -> None:
    model_in = [IOSpec("INPUT0", "FP32", [-1, -1]), *RAGGED_IN[1:]]
    with pytest.raises(ConfigError) as info:
        check_against_model(ragged_sum(), model_in, RAGGED_OUT)
    assert info.value.message == (
        "unable to load model 'm', configuration expects model provides input with shape "
        "[-1]  for ragged input 'INPUT0', model provides [-1,-1]"
    )
    with pytest.raises(ConfigError, match=r"model provides \[8\]"):
        check_against_model(
            ragged_sum(), [IOSpec("INPUT0", "FP32", [8]), *RAGGED_IN[1:]], RAGGED_OUT
        )


def test_a_ragged_input_cannot_be_optional() -> None:
    text = modelgen.RAGGED_SUM_CONFIG.format(name="m", extra="")
    optional = config(
        text.replace("allow_ragged_batch: true", "allow_ragged_batch: true\n optional: true")
    )
    with pytest.raises(ConfigError) as info:
        check_against_model(optional, RAGGED_IN, RAGGED_OUT)
    assert info.value.message == (
        "unable to load model 'm', configuration expects model provides input with shape "
        "[-1] for ragged input 'INPUT0', which is not supported for optional input"
    )


def test_batch_inputs_count_as_model_inputs() -> None:
    with pytest.raises(ConfigError) as info:
        check_against_model(ragged_sum(), RAGGED_IN[:2], RAGGED_OUT)
    assert info.value.message == (
        "unable to load model 'm', configuration expects 3 inputs, model provides 2"
    )


def test_a_batch_input_target_the_model_lacks() -> None:
    model_in = [*RAGGED_IN[:2], IOSpec("LENGTHS", "FP32", [-1])]
    with pytest.raises(ConfigError) as info:
        check_against_model(ragged_sum(), model_in, RAGGED_OUT)
    assert info.value.message == (
        "unable to load model 'm', batch input 'COUNT' (BATCH_ELEMENT_COUNT) is not an input "
        "of the model, allowed inputs are: INDEX, INPUT0, LENGTHS"
    )


def test_a_batch_input_of_another_type_than_the_model_s() -> None:
    model_in = [RAGGED_IN[0], IOSpec("INDEX", "INT64", [-1]), RAGGED_IN[2]]
    with pytest.raises(ConfigError) as info:
        check_against_model(ragged_sum(), model_in, RAGGED_OUT)
    assert info.value.message == (
        "unable to load model 'm', configuration expects datatype TYPE_INT32 for batch "
        "input 'INDEX', model provides TYPE_INT64"
    )


def test_batch_output_dims_are_not_compared() -> None:
    # DOUBLED is [-1] in the model while the config (batching) makes it [-1, -1].
    check_against_model(ragged_sum(), RAGGED_IN, RAGGED_OUT)
    text = modelgen.RAGGED_SUM_CONFIG.format(name="m", extra="")
    without = config(text[: text.index("batch_output")])
    with pytest.raises(ConfigError, match="tensor 'DOUBLED': the model expects 1 dimensions"):
        check_against_model(without, RAGGED_IN, RAGGED_OUT)


# -- ValidateBatchIO (Triton core) -------------------------------------------------------

ONE_INPUT = 'max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ] '


@pytest.mark.parametrize(
    ("batch_input", "message"),
    [
        (
            'kind: BATCH_ITEM_SHAPE target_name: "S" data_type: TYPE_INT64 source_input: "X"',
            "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
        ),
        (
            'kind: BATCH_ELEMENT_COUNT target_name: "S" data_type: TYPE_FP16 source_input: "X"',
            "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
        ),
        (
            'kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "S" data_type: TYPE_INT32 '
            'source_input: "Y"',
            "unknown source input name 'Y' for m",
        ),
        (
            'kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "S" data_type: TYPE_INT32 '
            'source_input: [ "X", "X" ]',
            "batch input kind 'BATCH_ITEM_SHAPE_FLATTEN' expects 1 source input, got 2 for m",
        ),
        (
            'kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "S" data_type: TYPE_INT32',
            "batch input kind 'BATCH_ACCUMULATED_ELEMENT_COUNT' expects 1 source input, got 0",
        ),
    ],
)
def test_batch_input_errors(batch_input: str, message: str) -> None:
    bad = config(
        'platform: "onnxruntime_onnx" ' + ONE_INPUT + f"batch_input [ {{ {batch_input} }} ]"
    )
    with pytest.raises(ConfigError) as info:
        validate(bad, "m")
    assert message in info.value.message


@pytest.mark.parametrize("kind", BATCH_INPUT_KINDS)
def test_every_batch_input_kind_is_valid_with_int32_or_fp32(kind: str) -> None:
    for dtype in ("TYPE_INT32", "TYPE_FP32"):
        validate(
            config(
                'platform: "onnxruntime_onnx" ' + ONE_INPUT + f"batch_input [ {{ kind: {kind} "
                f'target_name: "S" data_type: {dtype} source_input: "X" }} ]'
            ),
            "m",
        )


# -- auto-complete -----------------------------------------------------------------------


def test_autocomplete_does_not_make_batch_input_targets_request_inputs() -> None:
    partial = config(
        'platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [ { name: "INPUT0" allow_ragged_batch: true } ] '
        'batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" '
        'data_type: TYPE_INT32 source_input: "INPUT0" }, { kind: BATCH_ELEMENT_COUNT '
        'target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT0" } ]'
    )
    done = autocomplete(partial, RAGGED_IN, RAGGED_OUT)
    assert [(io.name, list(io.dims)) for io in done.input] == [("INPUT0", [-1])]
    assert done.input[0].data_type == pb.TYPE_FP32
    assert [io.name for io in done.output] == ["SUM", "LENGTH", "DOUBLED"]
    validate(done, "m")
    check_against_model(done, RAGGED_IN, RAGGED_OUT)
