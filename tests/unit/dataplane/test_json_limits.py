"""shoal.dataplane.json_limits: the depth and size a control request's JSON may have."""

from __future__ import annotations

import json

import pytest

from shoal.dataplane.json_limits import (
    MAX_CONFIG_JSON_BYTES,
    MAX_JSON_DEPTH,
    check_config_override,
    check_depth,
    json_depth,
)
from shoal.ipc.errors import Code, ServingError

_DEPTH_ERROR = "JSON nesting depth exceeds maximum allowed limit (100)"


def _nested(depth: int) -> str:
    """A config whose ``parameters`` value nests to ``depth`` in all (the object is 1)."""
    return '{"parameters": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize(
    ("doc", "depth"),
    [(1, 0), ("x", 0), ([], 1), ({}, 1), ({"a": [1, {"b": []}]}, 4), ([[[]], []], 3)],
)
def test_json_depth_counts_containers(doc: object, depth: int) -> None:
    assert json_depth(doc) == depth


def test_json_depth_walks_deeper_than_the_recursion_limit() -> None:
    doc: list[object] = []
    for _ in range(5000):
        doc = [doc]
    assert json_depth(doc) == 5001


def test_check_depth_allows_the_limit_and_refuses_one_more() -> None:
    check_depth(json.loads(_nested(MAX_JSON_DEPTH)))
    with pytest.raises(ServingError) as err:
        check_depth(json.loads(_nested(MAX_JSON_DEPTH + 1)))
    assert (err.value.code, err.value.message) == (Code.INVALID_ARG, _DEPTH_ERROR)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 10_000])
def test_a_deep_config_override_is_refused_with_tritons_words(depth: int) -> None:
    with pytest.raises(ServingError) as err:
        check_config_override(_nested(depth))
    assert (err.value.code, err.value.message, err.value.http_status) == (
        Code.INVALID_ARG,
        _DEPTH_ERROR,
        400,
    )


def test_a_deep_config_override_with_nan_is_refused_too() -> None:
    """msgspec refuses NaN (the broker's json.loads takes it): read again as the broker
    reads it."""
    text = '{"x": NaN, "parameters": ' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(ServingError, match="nesting depth"):
        check_config_override(text)


@pytest.mark.parametrize("text", [_nested(MAX_JSON_DEPTH), '{"max_batch_size": 8}', "{not json"])
def test_what_the_broker_should_judge_passes(text: str) -> None:
    check_config_override(text)


def test_a_config_override_over_the_size_limit_is_refused() -> None:
    text = '{"name": "' + "x" * MAX_CONFIG_JSON_BYTES + '"}'
    with pytest.raises(ServingError) as err:
        check_config_override(text)
    assert err.value.code == Code.INVALID_ARG
    assert err.value.message == (
        f"model config JSON size of {len(text)} bytes exceeds the maximum allowed value of "
        f"{MAX_CONFIG_JSON_BYTES} bytes"
    )
