"""`ModelSpec` from Triton's `ModelConfig` protobuf: the one place the roles' structs are
made (shoal/configs/model_spec.py).

Read a config once it is complete (parsed, filled, auto-completed, validated): this
module checks nothing and fills no default beyond the protobuf's own. Pure functions.

Between processes the completed config travels as its serialized protobuf (the worker
completes it; the broker and the frontends receive it): the frontends render all of it
for ``/config`` and gRPC's ModelConfig, fields no role reads included. A process that
receives those bytes reads them once with `spec_from_bytes`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_config import config_to_json, model_metadata, v2_datatype
from shoal.configs.model_spec import (
    Accelerator,
    BatchInput,
    BatchOutput,
    ControlKind,
    DynamicBatching,
    EnsembleScheduling,
    EnsembleStep,
    InitialState,
    InputSpec,
    InstanceGroup,
    ModelSpec,
    Optimization,
    OutputSpec,
    QueuePolicy,
    RateLimiter,
    RateLimiterResource,
    SequenceBatching,
    SequenceControl,
    SequenceState,
    VersionPolicy,
    WarmupInput,
    WarmupSample,
    WarmupSource,
)

_CONTROL_KINDS: dict[int, ControlKind] = {
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}


def spec_from_bytes(data: bytes) -> ModelSpec:
    """The spec of a serialized, completed ModelConfig."""
    return read_spec(pb.ModelConfig.FromString(data))


def served_view(
    data: bytes, versions: list[int]
) -> tuple[ModelSpec, dict[str, Any], dict[str, Any]]:
    """A serialized, completed config (as a frontend gets it from the broker), parsed
    once: its spec, Triton's ``/config`` JSON (`config_to_json`) and its metadata
    (`model_metadata`)."""
    config = pb.ModelConfig.FromString(data)
    return read_spec(config), config_to_json(config), model_metadata(config, versions)


def read_spec(config: pb.ModelConfig) -> ModelSpec:
    """The spec of a completed ModelConfig (``config`` is not changed)."""
    return ModelSpec(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        runtime=config.runtime,
        version_policy=_version_policy(config),
        max_batch_size=config.max_batch_size,
        inputs=tuple(_input(i) for i in config.input),
        outputs=tuple(_output(o) for o in config.output),
        batch_inputs=tuple(_batch_input(b) for b in config.batch_input),
        batch_outputs=tuple(_batch_output(b) for b in config.batch_output),
        instance_groups=tuple(_instance_group(g) for g in config.instance_group),
        default_model_filename=config.default_model_filename,
        cc_model_filenames=dict(config.cc_model_filenames),
        metric_tags=dict(config.metric_tags),
        parameters={k: p.string_value for k, p in config.parameters.items()},
        op_library_filenames=tuple(config.model_operations.op_library_filename),
        dynamic_batching=(
            _dynamic_batching(config.dynamic_batching)
            if config.HasField("dynamic_batching")
            else None
        ),
        sequence_batching=(
            _sequence_batching(config.sequence_batching)
            if config.HasField("sequence_batching")
            else None
        ),
        ensemble_scheduling=(
            _ensemble(config.ensemble_scheduling)
            if config.HasField("ensemble_scheduling")
            else None
        ),
        model_warmup=tuple(_warmup(w) for w in config.model_warmup),
        optimization=_optimization(config.optimization),
        response_cache=config.response_cache.enable,
        decoupled=config.model_transaction_policy.decoupled,
    )


def _dims(values: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in values)


def _version_policy(config: pb.ModelConfig) -> VersionPolicy:
    vp = config.version_policy
    which = vp.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy("all", 0)
    if which == "specific":
        return VersionPolicy("specific", 0, _dims(vp.specific.versions))
    return VersionPolicy("latest", vp.latest.num_versions if which else 1)


def _input(i: pb.ModelInput) -> InputSpec:
    return InputSpec(
        name=i.name,
        datatype=v2_datatype(i.data_type),
        dims=_dims(i.dims),
        reshape=_dims(i.reshape.shape) if i.HasField("reshape") else None,
        format=pb.ModelInput.Format.Name(i.format),
        optional=i.optional,
        is_shape_tensor=i.is_shape_tensor,
        allow_ragged_batch=i.allow_ragged_batch,
        is_non_linear_format_io=i.is_non_linear_format_io,
    )


def _output(o: pb.ModelOutput) -> OutputSpec:
    return OutputSpec(
        name=o.name,
        datatype=v2_datatype(o.data_type),
        dims=_dims(o.dims),
        reshape=_dims(o.reshape.shape) if o.HasField("reshape") else None,
        label_filename=o.label_filename,
        is_shape_tensor=o.is_shape_tensor,
        is_non_linear_format_io=o.is_non_linear_format_io,
    )


def _batch_input(b: pb.BatchInput) -> BatchInput:
    return BatchInput(
        kind=pb.BatchInput.Kind.Name(b.kind),
        target_names=tuple(b.target_name),
        datatype=v2_datatype(b.data_type),
        source_inputs=tuple(b.source_input),
    )


def _batch_output(b: pb.BatchOutput) -> BatchOutput:
    return BatchOutput(
        kind=pb.BatchOutput.Kind.Name(b.kind),
        target_names=tuple(b.target_name),
        source_inputs=tuple(b.source_input),
    )


def _instance_group(g: pb.ModelInstanceGroup) -> InstanceGroup:
    limiter = None
    if g.HasField("rate_limiter"):
        rl = g.rate_limiter
        resources = tuple(
            RateLimiterResource(r.name, r.count, getattr(r, "global")) for r in rl.resources
        )
        limiter = RateLimiter(resources, rl.priority)
    return InstanceGroup(
        name=g.name,
        kind=pb.ModelInstanceGroup.Kind.Name(g.kind),
        count=g.count,
        gpus=_dims(g.gpus),
        passive=g.passive,
        host_policy=g.host_policy,
        profiles=tuple(g.profile),
        rate_limiter=limiter,
    )


def _queue_policy(p: pb.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action="DELAY" if p.timeout_action == pb.ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_us=p.default_timeout_microseconds,
        allow_timeout_override=p.allow_timeout_override,
        max_queue_size=p.max_queue_size,
    )


def _dynamic_batching(db: pb.ModelDynamicBatching) -> DynamicBatching:
    return DynamicBatching(
        preferred_batch_sizes=_dims(db.preferred_batch_size),
        max_queue_delay_us=db.max_queue_delay_microseconds,
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policy={
            int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()
        },
    )


def _sequence_batching(sb: pb.ModelSequenceBatching) -> SequenceBatching:
    common = SequenceBatching(
        max_sequence_idle_us=sb.max_sequence_idle_microseconds,
        controls=tuple(_control(ci.name, c) for ci in sb.control_input for c in ci.control),
        states=tuple(_state(st) for st in sb.state),
        iterative_sequence=sb.iterative_sequence,
    )
    if sb.WhichOneof("strategy_choice") == "oldest":
        old = sb.oldest
        return dataclasses.replace(
            common,
            strategy="oldest",
            max_queue_delay_us=old.max_queue_delay_microseconds,
            max_candidate_sequences=old.max_candidate_sequences,
            preferred_batch_sizes=_dims(old.preferred_batch_size),
            preserve_ordering=old.preserve_ordering,
        )
    return dataclasses.replace(
        common,
        max_queue_delay_us=sb.direct.max_queue_delay_microseconds,
        minimum_slot_utilization=sb.direct.minimum_slot_utilization,
    )


def _control(input_name: str, c: pb.ModelSequenceBatching.Control) -> SequenceControl:
    return SequenceControl(
        input_name=input_name,
        kind=_CONTROL_KINDS[c.kind],
        datatype=v2_datatype(c.data_type),
        int32_false_true=tuple(c.int32_false_true),
        fp32_false_true=tuple(c.fp32_false_true),
        bool_false_true=tuple(c.bool_false_true),
    )


def _state(st: pb.ModelSequenceBatching.State) -> SequenceState:
    return SequenceState(
        input_name=st.input_name,
        output_name=st.output_name,
        datatype=v2_datatype(st.data_type),
        dims=_dims(st.dims),
        initial_states=tuple(
            InitialState(
                i.name,
                v2_datatype(i.data_type),
                _dims(i.dims),
                i.data_file if i.WhichOneof("state_data") == "data_file" else "",
            )
            for i in st.initial_state
        ),
        use_same_buffer_for_input_output=st.use_same_buffer_for_input_output,
        use_growable_memory=st.use_growable_memory,
    )


def _ensemble(es: pb.ModelEnsembling) -> EnsembleScheduling:
    steps = tuple(
        EnsembleStep(
            model_name=s.model_name,
            model_version=int(s.model_version),
            input_map=dict(s.input_map),
            output_map=dict(s.output_map),
            model_namespace=s.model_namespace,
        )
        for s in es.step
    )
    return EnsembleScheduling(steps, es.max_inflight_requests)


def _warmup(w: pb.ModelWarmup) -> WarmupSample:
    inputs = tuple(
        WarmupInput(
            name=name,
            datatype=v2_datatype(i.data_type),
            dims=_dims(i.dims),
            source=cast(WarmupSource | None, i.WhichOneof("input_data_type")),
            input_data_file=i.input_data_file,
        )
        for name, i in w.inputs.items()
    )
    return WarmupSample(w.name, w.batch_size, inputs, w.count)


def _accelerators(values: Any) -> tuple[Accelerator, ...]:
    return tuple(Accelerator(a.name, dict(a.parameters)) for a in values)


def _optimization(o: pb.ModelOptimizationPolicy) -> Optimization:
    ea = o.execution_accelerators
    return Optimization(
        priority=pb.ModelOptimizationPolicy.ModelPriority.Name(o.priority),
        graph_level=o.graph.level,
        gpu_accelerators=_accelerators(ea.gpu_execution_accelerator),
        cpu_accelerators=_accelerators(ea.cpu_execution_accelerator),
        input_pinned_memory=o.input_pinned_memory.enable,
        output_pinned_memory=o.output_pinned_memory.enable,
        gather_kernel_buffer_threshold=o.gather_kernel_buffer_threshold,
        eager_batching=o.eager_batching,
    )
