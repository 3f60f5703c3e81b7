"""Triton's ``identity`` backend (``backend: "identity"``), built in: each requested output
``OUTPUT<i>`` is the request's input ``INPUT<i>``, unchanged. Triton ships it for testing,
and Triton's QA suites (L0_lifecycle, L0_batcher, L0_decoupled, L0_model_config...) name
it in their configs; no model file is read (the version folder may be empty).

As Triton's identity backend, at load it checks the config: as many inputs as outputs,
named ``INPUT<i>`` and ``OUTPUT<i>`` with the same indices, each pair of one data type
and one shape (``reshape`` where given), refused in its words (INVALID_ARG: "model
configuration must have equal input/output pairs", "expected input name to follow
INPUT<index> pattern, got 'X'", "expected input and output indices to match",
"expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32", "expected
input and output shape to match, got [4] and [8]"). Its parameters (``string_value``s):

* ``creation_delay_sec``: the load sleeps that many seconds (Triton's lifecycle tests
  load slow models with it);
* ``execute_delay_ms``: each batch sleeps that many milliseconds before it answers;
  ``instance_wise_delay_multiplier`` M makes it ``max(M * index, 1)`` times that, ``index``
  being the instance's number within its model (0, 1, ...), as Triton's does (L0_batcher's
  preserve-ordering test: a 100 ms and a 400 ms instance).

An input with ``allow_ragged_batch`` reaches it as the batch's one flat tensor; its output
goes back to each request in the shape of that request's input (``batch_outputs``), as
Triton's, which answers each request of a batch from its own input.

A requested output whose input the request lacks (an optional input) fails the request
with UNSUPPORTED "failed to get input 'INPUT<i>'". The outputs are the inputs' arrays,
which the worker writes where each request asked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from shoal.configs.model_spec import InputSpec, ModelSpec, OutputSpec
from shoal.configs.schema import ConfigError
from shoal.ipc.errors import Code, ServingError
from shoal.workers.batch_io import ScatterSpec

log = logging.getLogger("shoal.worker")


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _shape(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _dims(tensor: InputSpec | OutputSpec) -> tuple[int, ...]:
    """Its shape as Triton's identity backend compares them: ``reshape`` where given."""
    return tuple(tensor.reshape if tensor.reshape is not None else tensor.dims)


def check_pairs(config: ModelSpec) -> None:
    """Triton's identity backend's checks of the config's inputs and outputs; raises
    ConfigError in its words."""
    name = config.name
    if len(config.inputs) != len(config.outputs):
        raise ConfigError(name, "model configuration must have equal input/output pairs")
    inputs, outputs = {}, {}
    for i, o in zip(config.inputs, config.outputs, strict=True):
        if not i.name.startswith("INPUT"):
            raise ConfigError(
                name, f"expected input name to follow INPUT<index> pattern, got '{i.name}'"
            )
        if not o.name.startswith("OUTPUT"):
            raise ConfigError(
                name, f"expected output name to follow OUTPUT<index> pattern, got '{o.name}'"
            )
        inputs[i.name[len("INPUT") :]] = (
            i.datatype,
            i.reshape if i.reshape is not None else i.dims,
        )
        outputs[o.name[len("OUTPUT") :]] = (
            o.datatype,
            o.reshape if o.reshape is not None else o.dims,
        )
    for index, (datatype, dims) in outputs.items():
        if index not in inputs:
            raise ConfigError(name, "expected input and output indices to match")
        in_type, in_dims = inputs[index]
        if in_type != datatype:
            raise ConfigError(
                name,
                "expected input and output datatype to match, got "
                f"{_config_type(in_type)} and {_config_type(datatype)}",
            )
        if in_dims != dims:
            raise ConfigError(
                name,
                f"expected input and output shape to match, got {_shape(in_dims)} and "
                f"{_shape(dims)}",
            )


def _int_parameter(config: ModelSpec, key: str) -> int:
    value = config.parameters.get(key, "")
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            config.name, f"parameter '{key}' of model '{config.name}' must be an integer"
        ) from None


class IdentityBackend:
    def __init__(self) -> None:
        self.delay_s = 0.0  # each batch's (execute_delay_ms)
        self.instance = 0  # the worker sets its instance number within the model

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        check_pairs(config)
        creation = _int_parameter(config, "creation_delay_sec")
        multiplier = _int_parameter(config, "instance_wise_delay_multiplier")
        times = max(multiplier * self.instance, 1)
        self.delay_s = _int_parameter(config, "execute_delay_ms") * times / 1000
        if creation > 0:
            log.info("Creation delay is set to : %d", creation)
            time.sleep(creation)

    @staticmethod
    def batch_outputs(config: ModelSpec) -> dict[str, ScatterSpec]:
        """OUTPUT<i> of each ragged INPUT<i>: split among the requests by their inputs'
        shapes (as a config's BATCH_SCATTER_WITH_INPUT_SHAPE would)."""
        out: dict[str, ScatterSpec] = {}
        for i in config.inputs:
            if i.allow_ragged_batch:
                dims = _dims(i)
                batch = (-1,) if config.max_batch_size > 0 else ()
                out["OUTPUT" + i.name[len("INPUT") :]] = ScatterSpec(i.name, (*batch, *dims))
        return out

    def io_spec(self) -> None:
        return None  # the config lists them

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        out = []
        for name in outputs:
            source = "INPUT" + name[len("OUTPUT") :]
            if source not in inputs:
                raise ServingError(Code.UNSUPPORTED, f"failed to get input '{source}'")
            out.append(inputs[source])
        return out

    def unload(self) -> None:
        return None
