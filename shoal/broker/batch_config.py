"""A model's config, read by the broker: ``dynamic_batching`` as the batcher's settings
(None: no batching), ``sequence_batching`` as the sequence batcher's, and the limit on its
instances' memory. Pure: reads a `ModelSpec` (shoal/configs/model_spec.py)."""

from __future__ import annotations

from shoal.broker.batcher import BatcherConfig, QueuePolicy
from shoal.broker.sequencer import SequenceConfig
from shoal.configs.backend_params import (
    DEFAULT_SHARE_MIN_COMPUTE_US,
    instance_memory_limit_mb,
    share_min_compute_us,
)
from shoal.configs.model_spec import ModelSpec
from shoal.configs.model_spec import QueuePolicy as SpecQueuePolicy
from shoal.configs.schema import ConfigError


def _policy(p: SpecQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=p.timeout_action,
        default_timeout_us=p.default_timeout_us,
        allow_timeout_override=p.allow_timeout_override,
        max_queue_size=p.max_queue_size,
    )


def memory_limit_mb(spec: ModelSpec) -> int | None:
    """The config's ``shoal_instance_memory_limit_mb`` (None: unset, the server's applies).
    Checked at load, as ``shoal_share_min_compute_us``: a bad value never gets here, and
    should one, it reads as unset."""
    try:
        return instance_memory_limit_mb(spec)
    except ConfigError:
        return None


def batcher_config(spec: ModelSpec) -> BatcherConfig | None:
    db = spec.dynamic_batching
    if db is None:
        return None
    return BatcherConfig(
        # A model that does not batch still gets the queue: priorities, policies and
        # ordering apply to it, one request per execution (Triton: max(1, 0)).
        max_batch_size=max(spec.max_batch_size, 1),
        preferred_batch_sizes=db.preferred_batch_sizes,
        max_queue_delay_us=db.max_queue_delay_us,
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_policy=_policy(db.default_queue_policy),
        priority_policies={k: _policy(v) for k, v in db.priority_queue_policy.items()},
        ragged_inputs=frozenset(i.name for i in spec.inputs if i.allow_ragged_batch),
        share_min_compute_us=_share_min_compute_us(spec),
    )


def _share_min_compute_us(spec: ModelSpec) -> int:
    """Checked at load (the model fails to load with a bad value); should one get this far
    the default serves, not an exception halfway through taking the config."""
    try:
        return share_min_compute_us(spec)
    except ConfigError:
        return DEFAULT_SHARE_MIN_COMPUTE_US


_DEFAULT_IDLE_US = 1_000_000  # Triton's, for 0 or unset


def sequence_config(spec: ModelSpec) -> SequenceConfig | None:
    """The config's ``sequence_batching`` as the sequence batcher's settings (None:
    none), with Triton's defaults filled in."""
    sb = spec.sequence_batching
    if sb is None:
        return None
    corrid_type = next((c.datatype for c in sb.controls if c.kind == "CORRID"), "")
    per_instance = max(1, spec.max_batch_size)
    idle = sb.max_sequence_idle_us or _DEFAULT_IDLE_US
    # an iterative sequence is one request: its batches need no null rows (Oldest)
    if sb.strategy == "oldest" or sb.iterative_sequence:
        return SequenceConfig(
            "oldest",
            spec.max_batch_size,
            sb.max_candidate_sequences or per_instance,
            idle,
            sb.max_queue_delay_us,
            preferred_batch_sizes=sb.preferred_batch_sizes,
            preserve_ordering=sb.preserve_ordering,
            corrid_type=corrid_type,
            iterative=sb.iterative_sequence,
        )
    return SequenceConfig(
        "direct",
        spec.max_batch_size,
        per_instance,
        idle,
        sb.max_queue_delay_us,
        minimum_slot_utilization=sb.minimum_slot_utilization,
        corrid_type=corrid_type,
        iterative=sb.iterative_sequence,
    )
