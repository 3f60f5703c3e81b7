"""A TensorRT plan's auto-complete, parameters and profile choice, on engines described by
hand (the pure core of shoal.workers.tensorrt_backend; the engine itself needs a GPU:
tests/gpu/test_tensorrt.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shoal.configs import autocomplete as ac
from shoal.configs import trt_config as tc
from shoal.configs.model_config import parse_config_text
from shoal.configs.schema import ConfigError
from shoal.configs.spec_reader import read_spec
from shoal.workers.tensorrt_backend import TensorRtBackend


def _engine(*profile_max: int, batch: bool = True) -> tc.EngineInfo:
    """INPUT0 [b, 4] -> OUTPUT0 [b, 4]; one profile per entry of ``profile_max``, each
    taking batches 1..max with opt at max / 2 (its batch dims fixed at 2 when not ``batch``)."""
    first = -1 if batch else 2
    profiles = tuple(((1, 4), (max(m // 2, 1), 4), (m, 4)) for m in profile_max)
    if not batch:
        profiles = tuple(((2, 4), (2, 4), (2, 4)) for _ in profile_max)
    return tc.EngineInfo(
        (
            tc.TrtTensor("INPUT0", True, "FP32", (first, 4), profiles),  # type: ignore[arg-type]
            tc.TrtTensor("OUTPUT0", False, "FP32", (first, 4)),
        ),
        len(profile_max),
    )


def _config(body: str = "") -> object:
    return parse_config_text(f'name: "m"\nplatform: "tensorrt_plan"\n{body}', "m")


def test_max_batch_is_the_largest_profile_max() -> None:
    assert tc.max_supported_batch(_engine(8)) == 8
    assert tc.max_supported_batch(_engine(4, 16)) == 16
    assert tc.max_supported_batch(_engine(8, batch=False)) == 0


def test_complete_sets_engine_batch_and_dynamic_batching() -> None:
    engine = _engine(2, 16)
    out = tc.complete_max_batch(_config(), engine)  # type: ignore[arg-type]
    assert out.max_batch_size == 16
    assert out.HasField("dynamic_batching")
    ins, outs = engine.io_specs()
    full = ac.autocomplete(out, ins, outs, default_max_batch_size=4)
    assert [(i.name, list(i.dims)) for i in full.input] == [("INPUT0", [4])]
    assert [(o.name, list(o.dims)) for o in full.output] == [("OUTPUT0", [4])]


def test_complete_keeps_a_smaller_max_batch_and_a_scheduler() -> None:
    out = tc.complete_max_batch(
        _config("max_batch_size: 4\nsequence_batching {}"),  # type: ignore[arg-type]
        _engine(8),
    )
    assert out.max_batch_size == 4
    assert not out.HasField("dynamic_batching")


def test_complete_refuses_a_max_batch_above_the_engine() -> None:
    with pytest.raises(ConfigError, match="configuration specified max-batch 16 but TensorRT "
                       "engine only supports max-batch 8"):  # fmt: skip
        tc.complete_max_batch(_config("max_batch_size: 16"), _engine(8))  # type: ignore[arg-type]


def test_config_dims_with_the_batch_dimension_mean_no_batching(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]')
    with caplog.at_level(logging.WARNING):
        out = tc.complete_max_batch(config, _engine(8))  # type: ignore[arg-type]
    assert out.max_batch_size == 0
    assert "hints that batching is unavailable" in caplog.text


def test_batching_dims_on_an_engine_that_cannot_batch() -> None:
    config = _config('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    with pytest.raises(ConfigError, match="hints for dynamic batching but the underlying "
                       "engine doesn't support batching"):  # fmt: skip
        tc.complete_max_batch(config, _engine(8, batch=False))  # type: ignore[arg-type]


def test_contradicting_dims() -> None:
    config = _config(
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
    )
    with pytest.raises(ConfigError, match="model tensor configurations are contradicting"):
        tc.complete_max_batch(config, _engine(8))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "want"),
    [(None, "STATIC"), ("STATIC", "STATIC"), ("ON_PROFILE_CHANGE", "ON_PROFILE_CHANGE")],
)
def test_allocation_strategy(value: str | None, want: str) -> None:
    body = (
        f'parameters {{ key: "execution_context_allocation_strategy" value: {{ string_value: "{value}" }} }}'  # noqa: E501
        if value
        else ""
    )
    assert tc.allocation_strategy(_config(body), "m_0") == want  # type: ignore[arg-type]


def test_allocation_strategy_refused() -> None:
    body = 'parameters { key: "execution_context_allocation_strategy" value: { string_value: "LAZY" } }'  # noqa: E501
    with pytest.raises(ConfigError) as err:
        tc.allocation_strategy(_config(body), "m_0")  # type: ignore[arg-type]
    assert err.value.message == (
        "Invalid value for 'execution_context_allocation_strategy': 'LAZY' for model instance "
        "'m_0'. Supported values are 'STATIC' and 'ON_PROFILE_CHANGE'."
    )


def test_instance_profiles() -> None:
    # none listed: every profile (Triton: profile 0 alone)
    assert tc.instance_profiles([], 3, "m", "m_0") == [("0", 0), ("1", 1), ("2", 2)]
    assert tc.instance_profiles([], 1, "m", "m_0") == [("0", 0)]
    assert tc.instance_profiles(["2", "0", "2"], 3, "m", "m_0") == [("2", 2), ("0", 0)]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([""], "profile name must not be empty"),
        (["one"], "unable to parse 'one': stoi"),
        (["3"], "Can not set the specified optimization profile 3[3] for m_0. Expected "
                "optimization profile index range 0-2"),
    ],
)  # fmt: skip
def test_instance_profiles_refused(names: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        tc.instance_profiles(names, 3, "m", "m_0")
    assert err.value.message == message


def test_profile_nearest_to_the_batch() -> None:
    # profile 0 takes batches 1..4 (opt 2), profile 1 1..16 (opt 8)
    engine = _engine(4, 16)
    both = [("0", 0), ("1", 1)]
    assert tc.profile_distance(engine, 0, {"INPUT0": (3, 4)}) == 1
    assert tc.profile_distance(engine, 0, {"INPUT0": (5, 4)}) is None
    assert tc.profile_distance(engine, 0, {"INPUT0": (3, 4, 1)}) is None
    assert tc.select_profile(engine, both, {"INPUT0": (3, 4)}) == 0
    assert tc.select_profile(engine, both, {"INPUT0": (6, 4)}) == 1
    assert tc.select_profile(engine, list(reversed(both)), {"INPUT0": (2, 4)}) == 1
    assert tc.select_profile(engine, both, {"INPUT0": (17, 4)}) is None
    # a lone profile is TensorRT's to check
    assert tc.select_profile(engine, [("0", 0)], {"INPUT0": (17, 4)}) == 0
    assert tc.no_profile_message(both) == (
        "failed to find any Optimization Profile among [ 0[0] 1[1]] to support the requested "
        "dimensions (or shape values)"
    )


def test_kind_cpu_is_refused_before_tensorrt_is_needed(tmp_path: Path) -> None:
    gpu_only = "unable to load model 'm', TensorRT backend supports only GPU device"
    with pytest.raises(ConfigError) as err:
        TensorRtBackend().load(tmp_path / "model.plan", read_spec(_config()), 1, False)
    assert err.value.message == gpu_only
    backend = TensorRtBackend()
    backend.gpu = False
    with pytest.raises(ConfigError) as err:
        backend.auto_complete(tmp_path / "model.plan", _config())
    assert err.value.message == gpu_only
