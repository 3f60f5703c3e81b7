"""Triton's PyTorch switches, read as its backend reads them, and the torch_aoti platform's
place in the config tables."""

from __future__ import annotations

import pytest

from shoal.configs.model_config import ConfigError, ModelConfig, fill_defaults, parse_config_text
from shoal.configs.torch_params import TorchExecParams, torch_exec_params


def config(text: str = 'platform: "pytorch_libtorch"', **params: str) -> ModelConfig:
    entries = "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    return parse_config_text(f'name: "m"\n{text}\n{entries}', "m")


def test_defaults_are_tritons() -> None:
    assert torch_exec_params(config()) == TorchExecParams(
        optimized_execution=True, cache_cleaning=False, inference_mode=True, cudnn=True
    )


def test_every_switch() -> None:
    got = torch_exec_params(
        config(
            DISABLE_OPTIMIZED_EXECUTION="true", ENABLE_CACHE_CLEANING="on", INFERENCE_MODE="0",
            DISABLE_CUDNN="True", ENABLE_TENSOR_FUSER="false", ENABLE_WEIGHT_SHARING="1",
            ENABLE_JIT_PROFILING="off", ENABLE_JIT_EXECUTOR="FALSE",
        )
    )  # fmt: skip
    assert got == TorchExecParams(False, True, False, False, False, True, False, False)


def test_the_first_bad_value_in_tritons_order_fails() -> None:
    with pytest.raises(ConfigError, match=r"^failed to convert 'x' to boolean$"):
        torch_exec_params(config(ENABLE_JIT_EXECUTOR="y", INFERENCE_MODE="x"))


@pytest.mark.parametrize(
    ("text", "platform", "backend", "filename"),
    [
        ('platform: "torch_aoti"', "torch_aoti", "pytorch", "model.pt2"),
        ('backend: "pytorch"', "pytorch_libtorch", "pytorch", "model.pt"),
        ('default_model_filename: "model.pt2"', "pytorch_libtorch", "pytorch", "model.pt2"),
    ],
)
def test_the_platform_backend_and_file_filled_as_tritons_core_fills_them(
    text: str, platform: str, backend: str, filename: str
) -> None:
    filled = fill_defaults(config(text), "m")
    assert (filled.platform, filled.backend, filled.default_model_filename) == (
        platform,
        backend,
        filename,
    )
