"""The intra-op thread count a worker hands its backend: each backend's own keys, Triton's
failures in Triton's order, and a pool that stays on the instance's cores."""

from __future__ import annotations

import logging

import pytest

from shoal.configs.model_config import ConfigError, ModelConfig, parse_config_text
from shoal.workers.loading import thread_count

CORES = [2, 3]


def config(platform: str, **params: str) -> ModelConfig:
    entries = ", ".join(
        f'{{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in params.items()
    )
    return parse_config_text(f'name: "m" platform: "{platform}" parameters [ {entries} ]', "m")


@pytest.mark.parametrize(
    ("backend", "platform", "params", "cores", "expected"),
    [
        ("onnxruntime", "onnxruntime_onnx", {}, CORES, 2),
        ("onnxruntime", "onnxruntime_onnx", {"intra_op_thread_count": "0"}, CORES, 2),
        ("onnxruntime", "onnxruntime_onnx", {"intra_op_thread_count": "0"}, [], 0),
        ("onnxruntime", "onnxruntime_onnx", {"intra_op_thread_count": "3"}, CORES, 3),
        ("onnxruntime", "onnxruntime_onnx", {"INTRA_OP_THREAD_COUNT": "3"}, CORES, 2),
        ("pytorch", "pytorch_libtorch", {"INTRA_OP_THREAD_COUNT": "3"}, CORES, 3),
        ("pytorch", "pytorch_libtorch", {"INTRA_OP_THREAD_COUNT": "-1"}, CORES, 2),
        ("pytorch", "pytorch_libtorch", {"intra_op_thread_count": "1"}, CORES, 1),
        ("pytorch", "pytorch_libtorch", {"intra_op_thread_count": "auto"}, CORES, 2),
        ("pytorch", "pytorch_libtorch", {"execution_mode": "9"}, CORES, 2),
    ],
)
def test_each_backend_reads_its_own_keys(
    backend: str, platform: str, params: dict[str, str], cores: list[int], expected: int
) -> None:
    assert thread_count(config(platform, **params), backend, cores) == expected


BIG = 64 << 20  # a model's files, bytes: past configs.backend_params.BORROW_MIN_MODEL_BYTES


@pytest.mark.parametrize(
    ("params", "cores", "may_use", "model_bytes", "expected"),
    [
        ({}, [0], 2, BIG, 2),  # a large model beside idle cores: a thread for each
        ({}, [0], 16, BIG, 4),  # at most 4 threads a core of its own
        ({}, [0], 2, 1 << 20, 1),  # a small one: a second thread costs more than it brings
        ({}, [0], 0, BIG, 1),  # lending off
        ({"intra_op_thread_count": "1"}, [0], 2, BIG, 1),  # what the config asks for
        ({}, [], 8, BIG, 0),  # not pinned (KIND_GPU): the backend's default
    ],
)
def test_a_large_model_gets_threads_for_the_cores_it_may_borrow(
    params: dict[str, str], cores: list[int], may_use: int, model_bytes: int, expected: int
) -> None:
    cfg = config("onnxruntime_onnx", **params)
    assert thread_count(cfg, "onnxruntime", cores, may_use, model_bytes) == expected


def test_torch_warns_about_a_lower_case_value_it_ignores(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shoal.worker"):
        threads = thread_count(
            config("pytorch_libtorch", intra_op_thread_count="auto"), "pytorch", CORES
        )
    assert threads == len(CORES)
    assert "intra_op_thread_count 'auto' is not an integer; ignored" in caplog.text


@pytest.mark.parametrize(
    ("backend", "platform", "params", "message"),
    [
        (
            "onnxruntime",
            "onnxruntime_onnx",
            {"intra_op_thread_count": "x", "execution_mode": "2"},
            "Invalid configuration value provided. Expected values for  execution_mode are "
            "0 or 1 but got 2 .",
        ),
        (
            "pytorch",
            "pytorch_libtorch",
            {"INTRA_OP_THREAD_COUNT": "x", "intra_op_thread_count": "2"},
            "failed to convert 'x' to integral number",
        ),
    ],
)
def test_a_value_triton_rejects_fails_the_load(
    backend: str, platform: str, params: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        thread_count(config(platform, **params), backend, CORES)
    assert info.value.message == message
