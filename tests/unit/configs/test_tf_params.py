"""A TensorFlow model's parameters as Triton's TensorFlow backend reads them, and its
platforms' place in the config tables and the repository scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.configs import repository
from shoal.configs.devices import cpu_only_backends
from shoal.configs.model_config import ConfigError, ModelConfig, fill_defaults, parse_config_text
from shoal.configs.tf_params import TfParams, tf_params


def config(**params: str) -> ModelConfig:
    entries = "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    return parse_config_text(f'name: "m" platform: "tensorflow_savedmodel"\n{entries}', "m")


def test_parameters() -> None:
    got = tf_params(
        config(
            TF_NUM_INTRA_THREADS="2", TF_NUM_INTER_THREADS="1", TF_GRAPH_TAG="serve",
            TF_SIGNATURE_DEF="other", MAX_SESSION_SHARE_COUNT="3",
        )
    )  # fmt: skip
    assert got == TfParams(2, 1, "serve", "other")
    assert tf_params(config()) == TfParams()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"MAX_SESSION_SHARE_COUNT": "0"}, "parameter 'MAX_SESSION_SHARE_COUNT' must be positive"),
        ({"TF_NUM_INTRA_THREADS": "-1"}, "parameter 'TF_NUM_INTRA_THREADS' must be non-negative"),
        ({"TF_NUM_INTER_THREADS": "many"}, "failed to convert 'many' to integral number"),
        ({"TF_USE_PER_SESSION_THREADS": "perhaps"}, "failed to convert 'perhaps' to boolean"),
    ],
)
def test_bad_values_fail_with_tritons_message(params: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tf_params(config(**params))


@pytest.mark.parametrize(
    ("text", "platform", "filename"),
    [
        ('platform: "tensorflow_savedmodel"', "tensorflow_savedmodel", "model.savedmodel"),
        ('platform: "tensorflow_graphdef"', "tensorflow_graphdef", "model.graphdef"),
        (
            'backend: "tensorflow" default_model_filename: "model.graphdef"',
            "tensorflow_graphdef",
            "model.graphdef",
        ),
    ],
)
def test_platform_backend_and_file(text: str, platform: str, filename: str) -> None:
    filled = fill_defaults(parse_config_text(f'name: "m" {text}', "m"), "m")
    assert (filled.platform, filled.backend, filled.default_model_filename) == (
        platform, "tensorflow", filename,
    )  # fmt: skip
    assert "tensorflow" in cpu_only_backends()


def test_a_savedmodel_folder_or_a_graphdef_file_names_the_platform(tmp_path: Path) -> None:
    (tmp_path / "saved" / "1" / "model.savedmodel").mkdir(parents=True)
    (tmp_path / "frozen" / "1").mkdir(parents=True)
    (tmp_path / "frozen" / "1" / "model.graphdef").write_bytes(b"")
    entries = {e.name: e for e in repository.scan(tmp_path)}
    assert entries["saved"].config is not None and entries["frozen"].config is not None
    assert entries["saved"].config.platform == "tensorflow_savedmodel"
    assert entries["frozen"].config.platform == "tensorflow_graphdef"
