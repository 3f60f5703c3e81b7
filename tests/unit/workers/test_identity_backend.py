"""Triton's identity backend, built in (shoal/workers/identity_backend.py): its config
checks in its words, its parameters, and outputs that are the inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shoal.configs.model_spec import InputSpec, ModelSpec, OutputSpec
from shoal.configs.schema import ConfigError
from shoal.ipc.errors import Code, ServingError
from shoal.workers.batch_io import BatchAssembler
from shoal.workers.identity_backend import IdentityBackend, check_pairs


def _spec(inputs: list[InputSpec], outputs: list[OutputSpec], **params: str) -> ModelSpec:
    return ModelSpec(
        name="m", backend="identity", inputs=tuple(inputs), outputs=tuple(outputs),
        parameters=params,
    )  # fmt: skip


FP32 = InputSpec("INPUT0", "FP32", (4,))
OUT = OutputSpec("OUTPUT0", "FP32", (4,))


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        ([FP32], [], "model configuration must have equal input/output pairs"),
        ([InputSpec("X", "FP32", (4,))], [OUT],
         "expected input name to follow INPUT<index> pattern, got 'X'"),
        ([FP32], [OutputSpec("Y", "FP32", (4,))],
         "expected output name to follow OUTPUT<index> pattern, got 'Y'"),
        ([FP32], [OutputSpec("OUTPUT1", "FP32", (4,))],
         "expected input and output indices to match"),
        ([FP32], [OutputSpec("OUTPUT0", "BYTES", (4,))],
         "expected input and output datatype to match, got TYPE_FP32 and TYPE_STRING"),
        ([FP32], [OutputSpec("OUTPUT0", "FP32", (2, -1))],
         "expected input and output shape to match, got [4] and [2,-1]"),
    ],
)  # fmt: skip
def test_a_config_it_cannot_serve_is_refused_in_its_words(
    inputs: list[InputSpec], outputs: list[OutputSpec], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        check_pairs(_spec(inputs, outputs))
    assert refused.value.message == message and refused.value.code == Code.INVALID_ARG


def test_reshape_is_the_shape_it_compares() -> None:
    reshaped = InputSpec("INPUT0", "FP32", (4,), reshape=(2, 2))
    check_pairs(_spec([reshaped], [OutputSpec("OUTPUT0", "FP32", (4,), reshape=(2, 2))]))


def test_outputs_are_the_inputs_after_the_execute_delay(tmp_path: Path) -> None:
    backend = IdentityBackend()
    backend.load(tmp_path, _spec([FP32], [OUT], execute_delay_ms="20"), 1, False)
    assert backend.delay_s == 0.02
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (out,) = backend.execute({"INPUT0": x}, ["OUTPUT0"])
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize(("instance", "delay_s"), [(0, 0.1), (1, 0.4), (2, 0.8)])
def test_the_instance_wise_delay_multiplier_scales_the_delay_by_the_instance_number(
    tmp_path: Path, instance: int, delay_s: float
) -> None:
    """Triton's: ``execute_delay_ms * max(multiplier * instance, 1)``."""
    backend = IdentityBackend()
    backend.instance = instance
    params = {"execute_delay_ms": "100", "instance_wise_delay_multiplier": "4"}
    backend.load(tmp_path, _spec([FP32], [OUT], **params), 1, False)
    assert backend.delay_s == pytest.approx(delay_s)


def test_a_ragged_batch_goes_back_to_each_request_in_its_own_shape(tmp_path: Path) -> None:
    """L0_batcher's allow-ragged trial: [1, 16] and [1, 8] batched as one flat tensor, each
    answered with its own input."""
    ragged = InputSpec("INPUT0", "FP32", (-1,), allow_ragged_batch=True)
    spec = ModelSpec(
        name="m", backend="identity", max_batch_size=8, inputs=(ragged,),
        outputs=(OutputSpec("OUTPUT0", "FP32", (-1,)),),
    )  # fmt: skip
    backend = IdentityBackend()
    backend.load(tmp_path, spec, 1, False)
    assembler = BatchAssembler.from_config(spec)
    assembler.scatter_specs.update(backend.batch_outputs(spec))
    feeds = [{"INPUT0": np.arange(16, dtype=np.float32).reshape(1, 16)},
             {"INPUT0": -np.arange(8, dtype=np.float32).reshape(1, 8)}]  # fmt: skip
    arrays = backend.execute(assembler.gather(feeds), ["OUTPUT0"])
    parts = assembler.scatter(["OUTPUT0"], arrays, [1, 1], feeds)
    for feed, part in zip(feeds, parts, strict=True):
        np.testing.assert_array_equal(part["OUTPUT0"], feed["INPUT0"])


def test_an_output_whose_input_is_missing_fails_the_request(tmp_path: Path) -> None:
    backend = IdentityBackend()
    optional = InputSpec("INPUT0", "FP32", (4,), optional=True)
    backend.load(tmp_path, _spec([optional], [OUT]), 1, False)
    with pytest.raises(ServingError) as failed:
        backend.execute({}, ["OUTPUT0"])
    assert (failed.value.code, failed.value.message) == (
        Code.UNSUPPORTED,
        "failed to get input 'INPUT0'",
    )


def test_a_parameter_that_is_no_number_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parameter 'execute_delay_ms' of model 'm'"):
        IdentityBackend().load(tmp_path, _spec([FP32], [OUT], execute_delay_ms="soon"), 1, False)
