"""Thread and execution-mode parameters, read as Triton's onnxruntime and pytorch backends
read them, and the thread count an instance gets from them."""

from __future__ import annotations

import pytest

from shoal.configs.backend_params import (
    OrtSessionParams,
    TorchThreadParams,
    instance_threads,
    ort_session_params,
    stoi,
    torch_thread_params,
)
from shoal.configs.model_config import ConfigError, ModelConfig, parse_config_text
from shoal.ipc.errors import Code


def config(platform: str = "onnxruntime_onnx", **params: str) -> ModelConfig:
    entries = ", ".join(
        f'{{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in params.items()
    )
    return parse_config_text(f'name: "m" platform: "{platform}" parameters [ {entries} ]', "m")


def torch_config(**params: str) -> ModelConfig:
    return config("pytorch_libtorch", **params)


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
    with pytest.raises(ConfigError) as info:
        ort_session_params(config(**{key: value}))
    assert info.value.message == message
    assert info.value.model == "m"
    assert info.value.code == Code.INVALID_ARG


MODE_2 = (
    "Invalid configuration value provided. Expected values for  execution_mode are 0 or 1 "
    "but got 2 ."
)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        # Triton's order: execution_mode, intra_op_thread_count, inter_op_thread_count.
        ({"intra_op_thread_count": "x", "execution_mode": "2"}, MODE_2),
        ({"inter_op_thread_count": "y", "execution_mode": "z"}, "failed to convert 'z' "),
        ({"inter_op_thread_count": "y", "intra_op_thread_count": "x"}, "failed to convert 'x' "),
        ({"inter_op_thread_count": "y", "shoal_intra_op_threads": "x"}, "failed to convert 'x' "),
    ],
)
def test_the_first_bad_value_in_tritons_order_is_reported(
    params: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ort_session_params(config(**params))
    assert info.value.message.startswith(message)


def test_parallel_mode_and_inter_op_threads_are_honoured() -> None:
    params = ort_session_params(config(execution_mode="1", inter_op_thread_count="3"))
    assert params == OrtSessionParams(parallel=True, inter_op_threads=3)
    assert params.intra_op_threads is None  # unset: the caller sizes it


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, OrtSessionParams(parallel=False, inter_op_threads=0)),
        ({"execution_mode": "0"}, OrtSessionParams(parallel=False, inter_op_threads=0)),
        ({"execution_mode": " 1 "}, OrtSessionParams(parallel=True, inter_op_threads=0)),
        (
            {"execution_mode": "1", "inter_op_thread_count": "-2"},
            OrtSessionParams(parallel=True, inter_op_threads=0),
        ),
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
        ({"intra_op_thread_count": "-0"}, 0),
        ({"shoal_intra_op_threads": "2"}, 2),
        ({"intra_op_thread_count": "5", "shoal_intra_op_threads": "2"}, 5),
        ({"INTRA_OP_THREAD_COUNT": "7"}, None),  # the pytorch backend's key
    ],
)
def test_ort_intra_op_threads(params: dict[str, str], expected: int | None) -> None:
    assert ort_session_params(config(**params)).intra_op_threads == expected


def test_bad_shoal_alias_fails_the_load_too() -> None:
    with pytest.raises(ConfigError, match="failed to convert 'two' to integral number"):
        ort_session_params(config(shoal_intra_op_threads="two"))


@pytest.mark.parametrize(
    ("requested", "cores", "expected"),
    [
        (None, [4, 5, 6], 3),  # unset: one thread per core owned
        (None, [], 0),  # not pinned (KIND_GPU): the backend's default, as Triton's
        (2, [4, 5, 6], 2),
        (8, [4], 8),  # asked for: more threads than cores is the config's choice
        # "The backend's default", seen from inside the instance's cores: ONNX Runtime's
        # own would pin a host-sized pool onto other instances' cores.
        (0, [4, 5, 6], 3),
        (0, [], 0),  # not pinned: the backend picks
    ],
)
def test_instance_threads(requested: int | None, cores: list[int], expected: int) -> None:
    assert instance_threads(requested, cores) == expected


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, TorchThreadParams()),
        ({"INTRA_OP_THREAD_COUNT": "3"}, TorchThreadParams(intra_op_threads=3)),
        ({"INTRA_OP_THREAD_COUNT": " 2abc"}, TorchThreadParams(intra_op_threads=2)),  # stoi
        ({"INTRA_OP_THREAD_COUNT": "-1"}, TorchThreadParams(intra_op_threads=0)),
        ({"INTER_OP_THREAD_COUNT": "4"}, TorchThreadParams(inter_op_threads=4)),
        ({"INTER_OP_THREAD_COUNT": "-4"}, TorchThreadParams(inter_op_threads=0)),
        # shoal's lower-case extension, only without the upper-case key
        ({"intra_op_thread_count": "2"}, TorchThreadParams(intra_op_threads=2)),
        (
            {"INTRA_OP_THREAD_COUNT": "3", "intra_op_thread_count": "2"},
            TorchThreadParams(intra_op_threads=3),
        ),
        # an upper-case key wins without the lower-case one being read at all
        (
            {"INTRA_OP_THREAD_COUNT": "2", "intra_op_thread_count": "auto"},
            TorchThreadParams(intra_op_threads=2),
        ),
        # lenient: a lower-case value that is not an integer is skipped, to be warned about
        (
            {"intra_op_thread_count": "auto"},
            TorchThreadParams(ignored=(("intra_op_thread_count", "auto"),)),
        ),
        (
            {"intra_op_thread_count": "auto", "shoal_intra_op_threads": "2"},
            TorchThreadParams(intra_op_threads=2, ignored=(("intra_op_thread_count", "auto"),)),
        ),
        # the onnxruntime keys mean nothing to Triton's pytorch backend
        ({"execution_mode": "7", "inter_op_thread_count": "x"}, TorchThreadParams()),
    ],
)
def test_torch_thread_params(params: dict[str, str], expected: TorchThreadParams) -> None:
    assert torch_thread_params(torch_config(**params)) == expected


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"INTRA_OP_THREAD_COUNT": "x"}, "failed to convert 'x' to integral number"),
        ({"INTER_OP_THREAD_COUNT": ""}, "failed to convert '' to integral number"),
        (
            {"INTRA_OP_THREAD_COUNT": "99999999999"},
            "failed to convert '99999999999' to integral number",
        ),
        # Triton's order: INTRA_OP_THREAD_COUNT, then INTER_OP_THREAD_COUNT
        ({"INTER_OP_THREAD_COUNT": "y", "INTRA_OP_THREAD_COUNT": "x"}, "failed to convert 'x'"),
        # strict even beside a lenient lower-case key that would parse
        (
            {"INTRA_OP_THREAD_COUNT": "x", "intra_op_thread_count": "2"},
            "failed to convert 'x'",
        ),
    ],
)
def test_torch_upper_case_keys_fail_the_load_as_in_triton(
    params: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        torch_thread_params(torch_config(**params))
    assert info.value.message.startswith(message)
    assert info.value.code == Code.INVALID_ARG


@pytest.mark.parametrize(
    ("level", "expected"),
    [(None, "ORT_ENABLE_ALL"), (0, "ORT_ENABLE_ALL"), (-1, "ORT_ENABLE_BASIC"),
     (1, "ORT_ENABLE_EXTENDED"), (2, "ORT_DISABLE_ALL"), (7, "ORT_ENABLE_ALL")],
)  # fmt: skip
def test_the_graph_level_maps_as_tritons_onnxruntime_backend_maps_it(
    level: int | None, expected: str
) -> None:
    text = 'name: "m" platform: "onnxruntime_onnx"'
    if level is not None:
        text += f" optimization {{ graph {{ level: {level} }} }}"
    assert ort_session_params(parse_config_text(text, "m")).graph_level == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("ON", True), ("1", True), ("False", False), ("off", False), ("0", False)],
)
def test_memory_switches_read_as_tritons_parse_bool_value(value: str, expected: bool) -> None:
    params = ort_session_params(config(enable_mem_arena=value, enable_mem_pattern=value))
    assert (params.mem_arena, params.mem_pattern) == (expected, expected)
    unset = ort_session_params(config())
    assert (unset.mem_arena, unset.mem_pattern, unset.device_allocator_for_initializers) == (
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"enable_mem_arena": "yes"}, "failed to convert 'yes' to boolean"),
        ({"enable_mem_pattern": "", "enable_mem_arena": "2"}, "failed to convert '2' to boolean"),
        ({"share_session_between_instances": "sure"}, "failed to convert 'sure' to boolean"),
        # Triton's order: the thread counts before the memory switches
        ({"enable_mem_arena": "yes", "inter_op_thread_count": "x"}, "failed to convert 'x' "),
    ],
)
def test_a_switch_that_is_no_boolean_fails_the_load(params: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ort_session_params(config(**params))
    assert info.value.message.startswith(message)
