"""The frontend's ensemble runner's pure parts (frontend/ensemble.py): which steps a
request needs, and how a tensor's shape changes between models that batch and those
that do not (Triton's ReshapeTensorDims)."""

from __future__ import annotations

from frontend.ensemble import Step, _reshaped, needed

STEPS = [
    Step(0, "pre", "", {"X": "IN"}, {"Y": "A", "Z": "SIDE"}),
    Step(1, "model", "", {"X": "A"}, {"Y": "B"}),
    Step(2, "post", "", {"X": "B"}, {"Y": "OUT"}),
    Step(3, "other", "", {"X": "IN"}, {"Y": "OTHER"}),
]


def test_only_the_steps_the_wanted_outputs_depend_on() -> None:
    assert [s.index for s in needed(STEPS, {"OUT"})] == [0, 1, 2]
    assert [s.index for s in needed(STEPS, {"SIDE"})] == [0]
    assert [s.index for s in needed(STEPS, {"OTHER", "SIDE"})] == [0, 3]
    assert needed(STEPS, {"IN"}) == []


def test_a_batch_of_one_loses_its_batch_dimension_for_a_model_without_one() -> None:
    assert _reshaped([1, 4], batched=True, mbs=0, dims=(4,)) == [4]
    assert _reshaped([1, 4], batched=True, mbs=0, dims=(1, 4)) == [1, 4]  # fits as it is
    assert _reshaped([2, 4], batched=True, mbs=0, dims=(4,)) == [2, 4]  # not a batch of 1


def test_a_tensor_without_a_batch_gains_one_for_a_model_that_batches() -> None:
    assert _reshaped([4], batched=False, mbs=8, dims=(4,)) == [1, 4]
    assert _reshaped([4], batched=False, mbs=8, dims=(-1,)) == [1, 4]
    assert _reshaped([2, 4], batched=False, mbs=8, dims=(4,)) == [2, 4]  # does not fit
    assert _reshaped([2, 4], batched=True, mbs=8, dims=(4,)) == [2, 4]
