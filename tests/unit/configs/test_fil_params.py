"""The FIL backend's parameters, read as Triton's FIL backend reads them (RAPIDS-Triton's
get_config_param: C++ stream reads, defaults for bad values where a key has one, and its
messages where it has none)."""

from __future__ import annotations

import pytest

from shoal.configs.devices import cpu_only_backends
from shoal.configs.fil_params import FilParams, fil_params
from shoal.configs.model_config import ConfigError, ModelConfig, parse_config_text
from shoal.configs.schema import KNOWN_BACKENDS


def config(**params: str) -> ModelConfig:
    entries = ", ".join(
        f'{{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in params.items()
    )
    return parse_config_text(f'name: "t" backend: "fil" parameters [ {entries} ]', "t")


def test_fil_is_a_known_backend_run_on_the_cpu() -> None:
    assert "fil" in KNOWN_BACKENDS
    assert "fil" in cpu_only_backends()  # KIND_AUTO is KIND_CPU, whatever GPUs there are


def test_defaults_for_a_regressor() -> None:
    assert fil_params(config(is_classifier="false")) == FilParams(
        model_type="xgboost", is_classifier=False, predict_proba=False, threshold=0.5
    )


def test_a_classifier_with_every_key() -> None:
    got = fil_params(
        config(
            model_type="lightgbm", is_classifier="true", predict_proba="true", threshold="0.3",
            xgboost_allow_unknown_field="true", cpu_nthread="2",
        )
    )  # fmt: skip
    assert got == FilParams("lightgbm", True, True, 0.3, True, 2)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("false", False), ("  true", True), ("trueish", True)],
)
def test_booleans_are_read_with_boolalpha(value: str, expected: bool) -> None:
    assert fil_params(config(is_classifier=value, threshold="0.5")).is_classifier is expected


@pytest.mark.parametrize("value", ["1", "TRUE", "yes", ""])
def test_a_bool_that_does_not_read_fails_a_required_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^Bad input for parameter is_classifier$"):
        fil_params(config(is_classifier=value))


def test_a_bool_that_does_not_read_takes_the_default_of_a_key_that_has_one() -> None:
    assert fil_params(config(is_classifier="false", predict_proba="yes")).predict_proba is False


def test_numbers_are_their_longest_prefix() -> None:
    got = fil_params(config(is_classifier="true", threshold="0.25abc", cpu_nthread="3.9"))
    assert (got.threshold, got.cpu_nthread) == (0.25, 3)
    with pytest.raises(ConfigError, match=r"^Bad input for parameter threshold$"):
        fil_params(config(is_classifier="true", threshold="high"))


def test_required_keys_and_triton_order() -> None:
    with pytest.raises(ConfigError, match=r"^Required parameter is_classifier not found"):
        fil_params(config(model_type="xgboost_json"))
    with pytest.raises(ConfigError, match=r"^Required parameter threshold not found in config$"):
        fil_params(config(is_classifier="true"))
    # model_type is read before is_classifier: its error comes first
    with pytest.raises(ConfigError, match=r"^xgb not recognized as a valid serialization format"):
        fil_params(config(model_type="xgb"))


def test_output_class_is_the_older_name_of_is_classifier() -> None:
    assert fil_params(config(output_class="false", is_classifier="true")).is_classifier is False
    got = fil_params(config(output_class="true", threshold="0.7"))
    assert (got.is_classifier, got.threshold) == (True, 0.7)
    # not exactly true or false: is_classifier is read instead
    assert fil_params(config(output_class="yes", is_classifier="false")).is_classifier is False


def test_a_model_type_is_its_first_word() -> None:
    got = fil_params(config(model_type=" xgboost_ubj extra", is_classifier="false"))
    assert got.model_type == "xgboost_ubj"


def test_gpu_tuning_keys_are_noted_as_doing_nothing() -> None:
    got = fil_params(config(is_classifier="false", storage_type="DENSE", threads_per_tree="4"))
    assert len(got.notes) == 2
    assert all("does nothing" in note for note in got.notes)
