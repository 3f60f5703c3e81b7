"""An OpenVINO model's config (``backend: "openvino"``): its parameters and its
auto-complete, as Triton's OpenVINO backend (src/openvino.cc) reads and completes them.

Parameters (each a ``string_value``):

- ``SKIP_OV_DYNAMIC_BATCHSIZE``, ``ENABLE_BATCH_PADDING``, ``RESHAPE_IO_LAYERS``: true
  only for ``YES`` (any case); any other value is false, silently.
- ``TARGET_DEVICE``: the OpenVINO device, upper-cased (default ``CPU``).
- ``CPU_EXTENSION_PATH``: a library of custom CPU kernels, added to the OpenVINO core.
- the device properties, each checked as Triton checks it (the value lower-cased first,
  and quoted so in the message): ``INFERENCE_NUM_THREADS`` and
  ``COMPILATION_NUM_THREADS`` (digits only: "expected the parameter '<k>' to be a
  non-negative number, got <v>"), ``HINT_BF16`` (``YES`` only), ``NUM_STREAMS``
  (``AUTO``, ``NUMA`` or digits), ``PERFORMANCE_HINT`` (``LATENCY``, ``THROUGHPUT``,
  ``CUMULATIVE_THROUGHPUT``).

Auto-complete (Triton's AutoCompleteConfig): a model can batch when every input and
output has a layout with a batch dimension; then a max_batch_size of 0 becomes the
server's default (at least 1), and above 1 ``dynamic_batching`` is added where no
scheduler is set. A model that cannot batch keeps its max_batch_size (a non-zero one
only gets a warning). Inputs are filled only when the config lists none, outputs
likewise: name, data type and dims (the shape without its batch dimension when
batching), -1 for a dynamic one. (Triton's code writes -1 for every dim of a tensor with
any dynamic one, a config its own load-time check then refuses where an output has a
static dim: shoal keeps the static dims.)

Pure: no openvino import; the worker passes the model's tensors as `OvTensor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.backend_params import ParamSource, parameters
from shoal.configs.model_config import fill_preferred_batch_size
from shoal.configs.schema import ConfigError

OPENVINO_BACKEND: Final = "openvino"
_PROPERTY_KEYS: Final = (
    "INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS", "HINT_BF16", "NUM_STREAMS",
    "PERFORMANCE_HINT",
)  # fmt: skip
_YES_KEYS: Final = ("SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS")
_HINTS: Final = {
    "latency": "LATENCY",
    "throughput": "THROUGHPUT",
    "cumulative_throughput": "CUMULATIVE_THROUGHPUT",
}


@dataclass(frozen=True, slots=True)
class OvParams:
    skip_dynamic_batch: bool = False
    batch_padding: bool = False
    reshape_io: bool = False
    target_device: str = "CPU"
    cpu_extension: str = ""


@dataclass(frozen=True, slots=True)
class OvTensor:
    """One model input or output: its config data type name ("" where Triton's backend
    has none), its shape (-1 for a dynamic dimension; None for a dynamic rank) and
    whether its layout names a batch dimension."""

    name: str
    data_type: str
    shape: list[int] | None
    has_batch: bool


def _value(config: ParamSource, key: str) -> str:
    return parameters(config).get(key, "")


def ov_params(config: ParamSource) -> OvParams:
    """The parameters that shape how the model is read (never an error)."""
    yes = {k: _value(config, k).lower() == "yes" for k in _YES_KEYS}
    return OvParams(
        skip_dynamic_batch=yes["SKIP_OV_DYNAMIC_BATCHSIZE"],
        batch_padding=yes["ENABLE_BATCH_PADDING"],
        reshape_io=yes["RESHAPE_IO_LAYERS"],
        target_device=_value(config, "TARGET_DEVICE").upper() or "CPU",
        cpu_extension=_value(config, "CPU_EXTENSION_PATH"),
    )


def ov_properties(config: ParamSource) -> dict[str, str | int]:
    """The device properties the parameters set, as OpenVINO's property names and values,
    in Triton's order; raises ConfigError with Triton's message for a bad value."""
    out: dict[str, str | int] = {}
    for key in _PROPERTY_KEYS:
        value = _value(config, key).lower()
        if not value:
            continue
        if key.endswith("_NUM_THREADS"):
            if not value.isdigit():
                raise _bad(config, key, "a non-negative number", value)
            out[key] = int(value)
        elif key == "HINT_BF16":
            if value != "yes":
                raise _bad(config, key, "YES", value)
            out["INFERENCE_PRECISION_HINT"] = "bf16"
        elif key == "NUM_STREAMS":
            if value not in ("auto", "numa") and not value.isdigit():
                raise _bad(config, key, "either AUTO/NUMA/<int_value>", value)
            out[key] = value.upper()
        elif value in _HINTS:
            out[key] = _HINTS[value]
        else:
            raise _bad(config, key, "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT", value)
    return out


def _bad(config: ParamSource, key: str, want: str, got: str) -> ConfigError:
    return ConfigError(config.name, f"expected the parameter '{key}' to be {want}, got {got}")


def autocomplete(
    config: pb.ModelConfig,
    inputs: Sequence[OvTensor],
    outputs: Sequence[OvTensor],
    default_max_batch_size: int,
) -> tuple[pb.ModelConfig, list[str]]:
    """A completed copy of ``config`` and the warnings Triton logs while completing it."""
    out = pb.ModelConfig()
    out.CopyFrom(config)
    notes: list[str] = []
    if all(t.has_batch for t in [*inputs, *outputs]):
        if out.max_batch_size == 0:
            out.max_batch_size = max(default_max_batch_size, 1)
            notes.append(
                f"autofilled max_batch_size to {out.max_batch_size} for model '{out.name}' "
                "since batching is supported but no max_batch_size is specified in model "
                "configuration. Must specify max_batch_size to utilize autofill with a "
                "larger max batch size"
            )
        scheduled = out.HasField("dynamic_batching") or out.HasField("sequence_batching")
        if out.max_batch_size > 1 and not scheduled:
            out.dynamic_batching.SetInParent()
    elif out.max_batch_size != 0:
        notes.append(
            f"model layout for model {out.name} does not support batching while non-zero "
            "max_batch_size is specified"
        )
    fill_preferred_batch_size(out)  # (Triton normalizes the config after a backend's)
    for kind, listed, tensors in (("input", out.input, inputs), ("output", out.output, outputs)):
        if len(listed):
            notes.append(
                f"skipping {kind} model configuration auto-complete for '{out.name}': "
                f"{kind} already specified"
            )
            continue
        for t in tensors:
            io = out.input.add() if kind == "input" else out.output.add()
            io.name = t.name
            io.data_type = pb.DataType.Value(t.data_type or "TYPE_INVALID")
            shape = t.shape if t.shape is not None else []
            io.dims.extend(shape[1:] if out.max_batch_size > 0 else shape)
    return out, notes
