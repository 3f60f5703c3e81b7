"""A generative model's engine settings from its config parameters."""

from __future__ import annotations

import pytest

from shoal.workers.generative.settings import EngineSettings


def test_defaults_and_given_values() -> None:
    s = EngineSettings.from_parameters({"kv_block_size": "8", "request_timeout_s": "2.5", "x": "y"})
    assert s.kv_block_size == 8 and s.request_timeout_s == 2.5 and s.max_running_sequences == 32
    assert s.num_blocks(bytes_per_token=1024) == (256 << 20) // (1024 * 8)
    assert EngineSettings.from_parameters({"kv_cache_blocks": "7"}).num_blocks(1024) == 7


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kv_block_size": "x"}, "parameter kv_block_size: 'x' is not an integer"),
        ({"prefill_chunk": "0"}, "parameter prefill_chunk: '0' is out of range"),
        ({"request_timeout_s": "-1"}, "parameter request_timeout_s: '-1' is out of range"),
        ({"max_step_tokens": "4"}, "max_step_tokens must be at least max_running_sequences"),
    ],
)
def test_a_bad_value_names_its_parameter(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineSettings.from_parameters(params)
