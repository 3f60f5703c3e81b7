"""The traffic policy between a model's versions, read from its config's ``parameters``."""

from __future__ import annotations

import pytest

from shoal.configs.model_config import ConfigError, ModelConfig, fill_defaults, parse_config_text
from shoal.configs.traffic import NO_POLICY, TrafficPolicy, shadow_due, traffic_policy
from shoal.configs.validation import validate


def config(**params: str) -> ModelConfig:
    entries = ", ".join(
        f'{{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in params.items()
    )
    return parse_config_text(
        f'name: "m" platform: "onnxruntime_onnx" parameters [ {entries} ]', "m"
    )


def test_weights_and_shadow_are_read() -> None:
    policy = traffic_policy(config(shoal_version_weights=" 2:10, 1:90 ", shoal_shadow="3:2.5"))
    assert policy == TrafficPolicy(((1, 90), (2, 10)), 3, 25_000)
    assert policy.routed == {1, 2} and policy.active


def test_no_keys_is_no_policy() -> None:
    assert traffic_policy(config()) is NO_POLICY
    assert traffic_policy(config(shoal_version_weights="")) is NO_POLICY
    assert not NO_POLICY.active


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"shoal_version_weights": "1=90"}, "expected '<version>:<positive number>'"),
        ({"shoal_version_weights": "1:0"}, "got '1:0'"),
        ({"shoal_version_weights": "0:5"}, "got '0:5'"),
        ({"shoal_version_weights": "1:2.5"}, "integer weight"),
        ({"shoal_version_weights": "1:2,1:3"}, "each version once"),
        ({"shoal_shadow": "2:101"}, "at most 100"),
        ({"shoal_shadow": "2:nan"}, "got '2:nan'"),
        ({"shoal_version_weights": "1:1,2:1", "shoal_shadow": "2:5"}, "also has a weight"),
    ],
)
def test_a_bad_policy_fails_with_its_key_named(params: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        traffic_policy(config(**params))
    assert words in err.value.message
    assert next(iter(params)) in err.value.message


@pytest.mark.parametrize("ppm", [1, 50_000, 333_333, 1_000_000])
def test_shadow_share_is_exact_over_a_million_and_spread(ppm: int) -> None:
    due = [shadow_due(n, ppm) for n in range(1_000_000)]
    assert sum(due) == ppm
    if ppm == 50_000:  # one in twenty, each run of twenty holds exactly one
        assert all(sum(due[i : i + 20]) == 1 for i in range(0, 1000, 20))


def test_the_validator_refuses_a_bad_policy_at_load() -> None:
    text = (
        'name: "m" platform: "onnxruntime_onnx" max_batch_size: 1 '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'parameters [ { key: "shoal_version_weights" value { string_value: "%s" } } ]'
    )
    validate(fill_defaults(parse_config_text(text % "1:9,2:1", "m"), "m"), "m")
    with pytest.raises(ConfigError, match="shoal_version_weights"):
        validate(fill_defaults(parse_config_text(text % "1:9,2", "m"), "m"), "m")
