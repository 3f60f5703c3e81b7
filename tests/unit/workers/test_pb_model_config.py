"""pb_utils.ModelConfig (shoal/workers/pb_model_config.py), what a Python model's
auto_complete_config gets: its setters, and their refusals in Triton's words."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal.workers.pb_model_config import ModelConfig


def _config(**doc: Any) -> ModelConfig:
    return ModelConfig(
        json.dumps({"name": "m", "max_batch_size": 0, "input": [], "output": [], **doc})
    )


def test_the_setters_complete_the_config() -> None:
    mc = _config()
    mc.set_max_batch_size(4)
    mc.set_dynamic_batching()
    mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    mc.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    mc.set_model_transaction_policy({"decoupled": True})
    assert mc.as_dict() == {
        "name": "m", "max_batch_size": 4, "dynamic_batching": {},
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "model_transaction_policy": {"decoupled": True},
    }  # fmt: skip


def test_a_tensor_the_config_lists_is_completed_in_place() -> None:
    mc = _config(input=[{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}])
    mc.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
    assert mc.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_INT32", "dims": [2]}]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda mc: mc.set_max_batch_size(4), "configuration specified max_batch_size 6, but in "
         "auto-complete-config function for model 'm' specified max_batch_size 4"),
        (lambda mc: mc.add_input({"name": "IN", "dims": [1]}), "input 'IN' in "
         "auto-complete-config function for model 'm' is missing 'data_type' property."),
        (lambda mc: mc.add_output({"data_type": "TYPE_FP32", "dims": [1]}), "output in "
         "auto-complete-config function for model 'm' is missing 'name' property."),
        (lambda mc: mc.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
         "input 'IN' in auto-complete-config function for model 'm' contains property other "
         "than 'name', 'data_type', 'dims' and 'optional'."),
        (lambda mc: mc.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
         "output 'O' in auto-complete-config function for model 'm' contains property other "
         "than 'name', 'data_type' and 'dims'."),
        (lambda mc: mc.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [16]}),
         "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'A', "
         "model provides TYPE_FP32"),
        (lambda mc: mc.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]}),
         "model 'm', tensor 'A': the model expects dims [4] but the model configuration "
         "specifies dims [16]"),
        (lambda mc: mc.set_model_transaction_policy({"decoupled": True, "x": 1}),
         "model transaction property in auto-complete-config function for model 'm' contains "
         "property other than 'decoupled'."),
        (lambda mc: mc.set_model_transaction_policy({"decoupled": True}), "trying to change "
         "decoupled property in auto-complete-config for model 'm', which is already set to "
         "'False'."),
    ],
)  # fmt: skip
def test_refusals_are_in_tritons_words(call: Any, message: str) -> None:
    mc = _config(
        max_batch_size=6,
        input=[{"name": "A", "data_type": "TYPE_INT32", "dims": [16]}],
        model_transaction_policy={"decoupled": False},
    )
    with pytest.raises(ValueError) as err:
        call(mc)
    assert str(err.value) == message


def test_dynamic_batching_is_refused_beside_another_scheduler() -> None:
    mc = _config(sequence_batching={})
    with pytest.raises(ValueError, match="Configuration specified scheduling_choice as "
                       "'sequence_batching', but auto-complete-config function for model 'm' "
                       "tries to set scheduling_choice as 'dynamic_batching'"):  # fmt: skip
        mc.set_dynamic_batching()
