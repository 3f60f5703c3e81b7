"""ONNX Runtime's thread and execution-mode parameters, read as Triton's backend reads them."""

from __future__ import annotations

import pytest

from configs.model_config import ConfigError, ModelConfig, parse_config_text
from configs.ort_params import (
    OrtSessionParams,
    intra_op_threads,
    ort_session_params,
    stoi,
)
from ipc.errors import Code


def config(**params: str) -> ModelConfig:
    entries = ", ".join(
        f'{{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in params.items()
    )
    return parse_config_text(
        f'name: "m" platform: "onnxruntime_onnx" parameters [ {entries} ]', "m"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4", 4),
        ("-3", -3),
        ("+2", 2),
        (" \t\n2", 2),  # leading whitespace skipped
        ("4abc", 4),  # whatever follows the digits is ignored
        ("1.5", 1),
        ("0x10", 0),  # base 10: the digits stop at 'x'
        ("1_000", 1),  # no Python digit separators
        ("2147483647", 2**31 - 1),
        ("-2147483648", -(2**31)),
        ("", None),
        ("four", None),
        ("abc4", None),
        ("- 4", None),  # no space between the sign and the digits
        ("\u00a04", None),  # not C whitespace
        ("\u0664", None),  # a Unicode digit is not a digit to std::stoi
        ("2147483648", None),  # std::out_of_range
        ("-2147483649", None),
    ],
)
def test_integers_are_read_as_std_stoi_reads_them(value: str, expected: int | None) -> None:
    assert stoi(value) == expected


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("intra_op_thread_count", "four", "failed to convert 'four' to integral number"),
        ("inter_op_thread_count", "", "failed to convert '' to integral number"),
        ("execution_mode", "parallel", "failed to convert 'parallel' to integral number"),
        (
            "execution_mode",
            "2",
            "Invalid configuration value provided. Expected values for  execution_mode are "
            "0 or 1 but got 2 .",
        ),
        (
            "execution_mode",
            "-1",
            "Invalid configuration value provided. Expected values for  execution_mode are "
            "0 or 1 but got -1 .",
        ),
        (
            "intra_op_thread_count",
            "99999999999",
            "failed to convert '99999999999' to integral number",
        ),
    ],
)
def test_bad_parameters_fail_the_load_with_tritons_message(
    key: str, value: str, message: str
) -> None:
    bad = config(**{key: value})
    with pytest.raises(ConfigError) as info:  # both readers, as a worker loading ORT runs them
        intra_op_threads(bad)
        ort_session_params(bad)
    assert info.value.message == message
    assert info.value.model == "m"
    assert info.value.code == Code.INVALID_ARG


def test_parallel_mode_and_inter_op_threads_are_honoured() -> None:
    params = ort_session_params(config(execution_mode="1", inter_op_thread_count="3"))
    assert params == OrtSessionParams(parallel=True, inter_op_threads=3)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, OrtSessionParams(parallel=False, inter_op_threads=0)),
        ({"execution_mode": "0"}, OrtSessionParams(parallel=False, inter_op_threads=0)),
        ({"execution_mode": " 1 "}, OrtSessionParams(parallel=True, inter_op_threads=0)),
        ({"execution_mode": "1", "inter_op_thread_count": "-2"}, OrtSessionParams(True, 0)),
        ({"inter_op_thread_count": "2"}, OrtSessionParams(parallel=False, inter_op_threads=2)),
    ],
)
def test_session_params_default_to_sequential_and_ort_inter_op_default(
    params: dict[str, str], expected: OrtSessionParams
) -> None:
    assert ort_session_params(config(**params)) == expected


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, None),  # unset: the caller's default (the cores the instance owns)
        ({"intra_op_thread_count": "3"}, 3),
        ({"intra_op_thread_count": "0"}, 0),  # 0: the backend's own default
        ({"intra_op_thread_count": "-4"}, 0),
        ({"shoal_intra_op_threads": "2"}, 2),
        ({"intra_op_thread_count": "5", "shoal_intra_op_threads": "2"}, 5),
        ({"execution_mode": "7"}, None),  # not intra-op's business (PyTorch ignores it)
    ],
)
def test_intra_op_threads(params: dict[str, str], expected: int | None) -> None:
    assert intra_op_threads(config(**params)) == expected


def test_bad_shoal_alias_fails_the_load_too() -> None:
    with pytest.raises(ConfigError, match="failed to convert 'two' to integral number"):
        intra_op_threads(config(shoal_intra_op_threads="two"))
