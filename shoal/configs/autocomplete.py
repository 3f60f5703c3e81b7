"""Auto-complete of a model config from the tensors a model file declares.

Follows Triton's ONNX Runtime backend (AutoCompleteConfig / AutoCompleteMaxBatch /
AutoCompleteIO and the ValidateInputs / ValidateOutputs checks done at load), with one
shoal extension: a config that lists some inputs only by name gets the missing fields
and the missing inputs filled instead of failing at load.

Pure functions over protobuf copies: callers pass the IO the backend read from the
model file (as IOSpec, full shapes with the batch dimension) and get a new config back.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_config import fill_preferred_batch_size
from shoal.configs.schema import ConfigError, IOSpec, shape_str
from shoal.configs.sequence_rules import control_input_names
from shoal.ipc.datatypes import datatype

_WILDCARD = -1


def autocomplete(
    config: pb.ModelConfig,
    inputs: list[IOSpec],
    outputs: list[IOSpec],
    *,
    default_max_batch_size: int = 4,
) -> pb.ModelConfig:
    """Return a copy of `config` completed from the model's `inputs` and `outputs`.

    - A config that already lists inputs and outputs, every one with a data_type and
      dims, is returned unchanged (Triton skips auto-complete then).
    - If every model tensor has a dynamic first dimension the model can batch: a
      max_batch_size of 0 becomes `default_max_batch_size`, and when the result is > 1
      and no scheduler is set an empty `dynamic_batching {}` is added. A model that
      cannot batch with max_batch_size > 0 is an error. An empty preferred_batch_size
      then becomes [max_batch_size] (Triton's NormalizeModelConfig, run again).
    - No inputs listed: all come from the model. Some listed: their missing data_type
      and dims are filled and unlisted model inputs appended. Outputs likewise, except
      that a listed subset of outputs is kept as the subset. Batch input targets are
      never added as inputs, nor are sequence control tensors and implicit states
      (nor output states as outputs).
    Config dims are the model shape minus the batch dim when batching; a tensor left
    with no dims gets dims [1] (plus an empty reshape when batching), as in Triton. A
    listed ragged input without dims gets [-1] (shoal's extension).
    Raises ConfigError for a tensor the model lacks or a datatype mismatch.
    """
    out = pb.ModelConfig()
    out.CopyFrom(config)
    if _is_complete(out):
        return out
    _complete_max_batch(out, inputs, outputs, default_max_batch_size)
    # Triton normalizes the config again after a backend auto-completes it.
    fill_preferred_batch_size(out)
    _complete_ios(out, out.input, inputs, "input", add_unlisted=True)
    _complete_ios(out, out.output, outputs, "output", add_unlisted=len(out.output) == 0)
    return out


def _is_complete(config: pb.ModelConfig) -> bool:
    has_inputs = len(config.input) + len(config.batch_input) > 0
    tensors = [*config.input, *config.output]
    return (
        has_inputs
        and len(config.output) > 0
        and all(io.data_type != pb.TYPE_INVALID and len(io.dims) > 0 for io in tensors)
    )


def can_batch(inputs: Sequence[IOSpec], outputs: Sequence[IOSpec]) -> bool:
    """True when every model tensor has a first dimension of -1 (Triton's test)."""
    return all(len(io.shape) > 0 and io.shape[0] == _WILDCARD for io in [*inputs, *outputs])


def _complete_max_batch(
    config: pb.ModelConfig, inputs: list[IOSpec], outputs: list[IOSpec], default: int
) -> None:
    if not can_batch(inputs, outputs):
        if config.max_batch_size != 0:
            raise ConfigError(
                config.name,
                f"autofill failed for model '{config.name}': model does not support "
                "batching while non-zero max_batch_size is specified",
            )
        return
    if config.max_batch_size == 0:
        config.max_batch_size = max(default, 0)
    no_scheduler = not (config.HasField("dynamic_batching") or config.HasField("sequence_batching"))
    if config.max_batch_size > 1 and no_scheduler:
        config.dynamic_batching.SetInParent()


def _complete_ios(
    config: pb.ModelConfig,
    listed: Sequence[pb.ModelInput] | Sequence[pb.ModelOutput],
    model_ios: list[IOSpec],
    kind: str,
    *,
    add_unlisted: bool,
) -> None:
    by_name = {io.name: io for io in model_ios}
    for io in listed:
        spec = by_name.get(io.name)
        if spec is None:
            raise _unexpected_tensor(config.name, kind, io.name, model_ios)
        _fill_tensor(config, io, spec, kind)
    if not add_unlisted:
        return
    present = {io.name for io in listed}
    states = config.sequence_batching.state
    # Computed by the server, never requested: batch input targets, sequence control
    # tensors and implicit states. An output state goes to a client only when listed.
    if kind == "input":
        present |= batch_input_targets(config)
        present |= set(control_input_names(config.sequence_batching))
        present |= {st.input_name for st in states}
    else:
        present |= {st.output_name for st in states}
    for spec in model_ios:
        if spec.name not in present:
            new = config.input.add() if kind == "input" else config.output.add()
            new.name = spec.name
            _fill_tensor(config, new, spec, kind)


def _fill_tensor(
    config: pb.ModelConfig, io: pb.ModelInput | pb.ModelOutput, spec: IOSpec, kind: str
) -> None:
    model_type = config_datatype(config.name, spec)
    if io.data_type == pb.TYPE_INVALID:
        io.data_type = model_type
    elif io.data_type != model_type:
        raise _datatype_mismatch(config.name, kind, io, model_type)
    if len(io.dims) > 0:
        return
    if isinstance(io, pb.ModelInput) and io.allow_ragged_batch:
        io.dims.append(_WILDCARD)  # the model takes the batch flattened: any request shape
        return
    dims = spec.shape[1:] if config.max_batch_size > 0 else list(spec.shape)
    if dims:
        io.dims.extend(dims)
        return
    io.dims.append(1)
    if config.max_batch_size > 0:
        io.reshape.SetInParent()


def config_datatype(model: str, spec: IOSpec) -> int:
    """The config DataType enum value for a model tensor's v2 datatype."""
    dt = datatype(spec.datatype)
    if dt is None:
        raise ConfigError(
            model, f"unsupported datatype {spec.datatype} for '{spec.name}' of model '{model}'"
        )
    return pb.DataType.Value(dt.config_name)


def check_against_model(
    config: pb.ModelConfig, inputs: list[IOSpec], outputs: list[IOSpec]
) -> None:
    """Raise ConfigError if a complete config does not match the model's tensors.

    Triton's load-time checks: every config tensor exists in the model with the same
    datatype and compatible dims (reshape used when given; -1 matches anything); the
    model's input count equals the config's non-optional inputs plus batch inputs,
    sequence control tensors and implicit states. Outputs may be a subset. A ragged input
    (allow_ragged_batch) must be a 1-D [-1] model input, whatever its config dims (the
    batch is fed flattened), and cannot be optional; a batch output's dims are not
    compared (its per-request shape comes from its source input). A shoal extension: a
    batch input's targets must be model inputs of its data_type (Triton would fail every
    inference instead).
    """
    name = config.name
    for io in config.input:
        if io.allow_ragged_batch and io.optional:
            raise ConfigError(
                name,
                f"unable to load model '{name}', configuration expects model provides input "
                f"with shape [-1] for ragged input '{io.name}', which is not supported for "
                "optional input",
            )
    expected = (
        sum(1 for io in config.input if not io.optional)
        + len(config.batch_input)
        + len(control_input_names(config.sequence_batching))
        + len(config.sequence_batching.state)
    )
    if len(inputs) != expected:
        raise ConfigError(
            name,
            f"unable to load model '{name}', configuration expects {expected} inputs, "
            f"model provides {len(inputs)}",
        )
    scattered = {t for bo in config.batch_output for t in bo.target_name}
    for kind, listed, model_ios in (
        ("input", config.input, inputs),
        ("output", config.output, outputs),
    ):
        by_name = {io.name: io for io in model_ios}
        for io in listed:
            spec = by_name.get(io.name)
            if spec is None:
                raise _unexpected_tensor(name, kind, io.name, model_ios)
            model_type = config_datatype(name, spec)
            if io.data_type != model_type:
                raise _datatype_mismatch(name, kind, io, model_type)
            if isinstance(io, pb.ModelInput) and io.allow_ragged_batch:
                _check_ragged(name, io, spec.shape)
            elif io.name not in scattered:
                dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
                _compare_dims(name, io.name, spec.shape, dims, config.max_batch_size)
    _check_batch_inputs(config, inputs)


def batch_input_targets(config: pb.ModelConfig) -> set[str]:
    """The model inputs that the config's batch_input entries feed."""
    return {target for bi in config.batch_input for target in bi.target_name}


def _check_ragged(model: str, io: pb.ModelInput, model_shape: list[int]) -> None:
    """The ONNX Runtime backend's check: a ragged input reaches the model as one 1-D
    tensor of the batch's elements, so the model must take [-1]."""
    if model_shape != [_WILDCARD]:
        raise ConfigError(
            model,
            f"unable to load model '{model}', configuration expects model provides input "
            f"with shape [-1]  for ragged input '{io.name}', model provides "
            f"{shape_str(model_shape)}",
        )


def _check_batch_inputs(config: pb.ModelConfig, inputs: list[IOSpec]) -> None:
    name = config.name
    by_name = {io.name: io for io in inputs}
    for bi in config.batch_input:
        kind = pb.BatchInput.Kind.Name(bi.kind)
        for target in bi.target_name:
            spec = by_name.get(target)
            if spec is None:
                allowed = ", ".join(sorted(by_name))
                raise ConfigError(
                    name,
                    f"unable to load model '{name}', batch input '{target}' ({kind}) is not "
                    f"an input of the model, allowed inputs are: {allowed}",
                )
            model_type = config_datatype(name, spec)
            if bi.data_type != model_type:
                raise ConfigError(
                    name,
                    f"unable to load model '{name}', configuration expects datatype "
                    f"{pb.DataType.Name(bi.data_type)} for batch input '{target}', model "
                    f"provides {pb.DataType.Name(model_type)}",
                )


def _compare_dims(
    model: str, tensor: str, model_shape: list[int], dims: list[int], max_batch_size: int
) -> None:
    """Triton's CompareDimsSupported (non-exact), with its scalar special case."""
    prefix = f"model '{model}', tensor '{tensor}': "
    if not model_shape:
        if any(d != 1 for d in dims):
            raise ConfigError(
                model,
                f"unable to load model '{model}', scalar tensor '{tensor}', should only "
                "provide 1 in the model configuration when the model doesn't support "
                f"batching. Model configuration provided: {shape_str(dims)}.",
            )
        return
    batching = max_batch_size > 0
    if batching and model_shape[0] != _WILDCARD:
        raise ConfigError(
            model,
            f"{prefix}for the model to support batching the shape should have at least 1 "
            "dimension and the first dimension must be -1; but shape expected by the "
            f"model is {shape_str(model_shape)}",
        )
    full = [_WILDCARD, *dims] if batching else dims
    same_rank = len(model_shape) == len(full)
    if same_rank and all(
        m == d or _WILDCARD in (m, d) for m, d in zip(model_shape, full, strict=True)
    ):
        return
    # (one message for a rank and a size that differ: Triton's L0_model_config
    # bad_output_dims expects it for [-1,16] against [-1,1])
    detail = (
        "an initial batch dimension because max_batch_size > 0 followed by the explicit "
        f"tensor shape, making complete shape {shape_str(full)}"
        if batching
        else f"shape {shape_str(full)}"
    )
    raise ConfigError(
        model,
        f"{prefix}the model expects {len(model_shape)} dimensions (shape "
        f"{shape_str(model_shape)}) but the model configuration specifies {len(full)} "
        f"dimensions ({detail})",
    )


def _unexpected_tensor(model: str, kind: str, tensor: str, model_ios: list[IOSpec]) -> ConfigError:
    allowed = ", ".join(sorted(io.name for io in model_ios))
    return ConfigError(
        model,
        f"unable to load model '{model}', unexpected inference {kind} '{tensor}', "
        f"allowed {kind}s are: {allowed}",
    )


def _datatype_mismatch(
    model: str, kind: str, io: pb.ModelInput | pb.ModelOutput, model_type: int
) -> ConfigError:
    return ConfigError(
        model,
        f"unable to load model '{model}', configuration expects datatype "
        f"{pb.DataType.Name(io.data_type)} for {kind} '{io.name}', model provides "
        f"{pb.DataType.Name(model_type)}",
    )
