"""Validation of `sequence_batching`: control tensors and strategy settings.

Mirrors Triton's GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties
and the sequence part of ValidateModelConfig, with Triton's messages.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.schema import ConfigError

_Control = pb.ModelSequenceBatching.Control
_BOOLEAN_KINDS = (
    _Control.CONTROL_SEQUENCE_START,
    _Control.CONTROL_SEQUENCE_END,
    _Control.CONTROL_SEQUENCE_READY,
)
_CORRID_TYPES = frozenset(
    {pb.TYPE_UINT64, pb.TYPE_INT64, pb.TYPE_UINT32, pb.TYPE_INT32, pb.TYPE_STRING}
)


def validate_sequence_batching(config: pb.ModelConfig) -> None:
    """Raise ConfigError if the sequence batcher settings of `config` are invalid."""
    name, sb = config.name, config.sequence_batching
    if config.response_cache.enable:
        raise ConfigError(
            name,
            f"Response Cache does not currently support model {name} with sequence "
            "batching scheduler. Please disable the response cache.",
        )
    _check_control_names(sb, name)
    for kind in _BOOLEAN_KINDS:
        for control in _controls_of_kind(sb, kind, name):
            _check_boolean_control(control, name)
    for control in _controls_of_kind(sb, _Control.CONTROL_SEQUENCE_CORRID, name):
        _check_corrid_control(control, name)
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                raise ConfigError(
                    name, f"sequence batching preferred batch size must be positive for {name}"
                )
            if size > config.max_batch_size:
                raise ConfigError(
                    name,
                    f"sequence batching preferred batch size must be <= max batch size for {name}",
                )
    if sb.HasField("direct"):
        utilization = sb.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise ConfigError(
                name,
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] "
                f"for {name}",
            )


def control_input_names(sb: pb.ModelSequenceBatching) -> list[str]:
    """Names of the control tensors the sequence batcher feeds to the model."""
    return [ci.name for ci in sb.control_input if len(ci.control) > 0]


def _check_control_names(sb: pb.ModelSequenceBatching, name: str) -> None:
    seen: set[str] = set()
    for ci in sb.control_input:
        if not ci.name:
            raise ConfigError(name, f"sequence batching control tensor must have a name for {name}")
        if ci.name in seen:
            raise ConfigError(
                name,
                f"sequence batching control tensor '{ci.name}' is specified for multiple "
                f"control kinds for {name}",
            )
        seen.add(ci.name)


def _controls_of_kind(
    sb: pb.ModelSequenceBatching, kind: int, name: str
) -> list[pb.ModelSequenceBatching.Control]:
    found = [c for ci in sb.control_input for c in ci.control if c.kind == kind]
    if len(found) > 1:
        raise ConfigError(
            name,
            f"sequence batching specifies multiple {_Control.Kind.Name(kind)} tensors for {name}",
        )
    return found


def _check_boolean_control(c: pb.ModelSequenceBatching.Control, name: str) -> None:
    kind = _Control.Kind.Name(c.kind)
    lists = {
        "int32_false_true": len(c.int32_false_true),
        "fp32_false_true": len(c.fp32_false_true),
        "bool_false_true": len(c.bool_false_true),
    }
    given = [field for field, n in lists.items() if n > 0]
    if not given:
        raise ConfigError(
            name,
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' "
            f"or 'bool_false_true' for {kind} for {name}",
        )
    if len(given) > 1:
        raise ConfigError(
            name,
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}",
        )
    if lists[given[0]] != 2:
        raise ConfigError(
            name,
            f"sequence batching control '{given[0]}' must have exactly 2 entries for "
            f"{kind} for {name}",
        )


def _check_corrid_control(c: pb.ModelSequenceBatching.Control, name: str) -> None:
    kind = _Control.Kind.Name(c.kind)
    if len(c.int32_false_true) or len(c.fp32_false_true) or len(c.bool_false_true):
        raise ConfigError(
            name,
            "sequence batching must not specify either 'int32_false_true', "
            f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}",
        )
    if c.data_type not in _CORRID_TYPES:
        raise ConfigError(
            name,
            f"unexpected data type for control {kind} for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        )
