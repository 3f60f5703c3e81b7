"""A model's config, read by the broker: ``dynamic_batching`` as the batcher's settings
(None: no batching), ``metric_tags``, and the limit on its instances' memory."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from shoal.broker.batcher import BatcherConfig, QueuePolicy, TimeoutAction
from shoal.broker.sequencer import SequenceConfig
from shoal.configs.backend_params import (
    DEFAULT_SHARE_MIN_COMPUTE_US,
    instance_memory_limit_mb,
    share_min_compute_us,
)
from shoal.configs.schema import ConfigError
from shoal.configs.traffic import NO_POLICY, TrafficPolicy, traffic_policy


def _policy(p: Any) -> QueuePolicy:
    action: TimeoutAction = "DELAY" if p.timeout_action == mc.ModelQueuePolicy.DELAY else "REJECT"
    return QueuePolicy(
        timeout_action=action,
        default_timeout_us=p.default_timeout_microseconds,
        allow_timeout_override=p.allow_timeout_override,
        max_queue_size=p.max_queue_size,
    )


def metric_tags(config_bytes: bytes) -> dict[str, str]:
    """The config's ``metric_tags``: labels every metric of the model carries."""
    return dict(mc.ModelConfig.FromString(config_bytes).metric_tags)


def response_cache(config_bytes: bytes) -> bool:
    """Whether the config enables the response cache (shoal/dataplane/response_cache.py)."""
    return mc.ModelConfig.FromString(config_bytes).response_cache.enable


def memory_limit_mb(config_bytes: bytes) -> int | None:
    """The config's ``shoal_instance_memory_limit_mb`` (None: unset, the server's applies).
    Checked at load, as ``shoal_share_min_compute_us``: a bad value never gets here, and
    should one, it reads as unset."""
    try:
        return instance_memory_limit_mb(mc.ModelConfig.FromString(config_bytes))
    except ConfigError:
        return None


def traffic(config_bytes: bytes) -> TrafficPolicy:
    """The config's traffic policy between versions; checked at load, so a bad one that got
    here anyway reads as none."""
    try:
        return traffic_policy(mc.ModelConfig.FromString(config_bytes))
    except ConfigError:
        return NO_POLICY


def batcher_config(config_bytes: bytes) -> BatcherConfig | None:
    cfg = mc.ModelConfig()
    cfg.ParseFromString(config_bytes)
    if not cfg.HasField("dynamic_batching"):
        return None
    db = cfg.dynamic_batching
    return BatcherConfig(
        # A model that does not batch still gets the queue: priorities, policies and
        # ordering apply to it, one request per execution (Triton: max(1, 0)).
        max_batch_size=max(cfg.max_batch_size, 1),
        preferred_batch_sizes=tuple(db.preferred_batch_size),
        max_queue_delay_us=db.max_queue_delay_microseconds,
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_policy=_policy(db.default_queue_policy),
        priority_policies={int(k): _policy(v) for k, v in db.priority_queue_policy.items()},
        ragged_inputs=frozenset(i.name for i in cfg.input if i.allow_ragged_batch),
        share_min_compute_us=_share_min_compute_us(cfg),
    )


def _share_min_compute_us(cfg: mc.ModelConfig) -> int:
    """Checked at load (the model fails to load with a bad value); should one get this far
    the default serves, not an exception halfway through taking the config."""
    try:
        return share_min_compute_us(cfg)
    except ConfigError:
        return DEFAULT_SHARE_MIN_COMPUTE_US


_CORRID = mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
_DEFAULT_IDLE_US = 1_000_000  # Triton's, for 0 or unset


def sequence_config(config_bytes: bytes) -> SequenceConfig | None:
    """The config's ``sequence_batching`` as the sequence batcher's settings (None:
    none), with Triton's defaults filled in."""
    cfg = mc.ModelConfig.FromString(config_bytes)
    if not cfg.HasField("sequence_batching"):
        return None
    sb = cfg.sequence_batching
    corrid = next(
        (c.data_type for ci in sb.control_input for c in ci.control if c.kind == _CORRID), None
    )
    corrid_type = ""
    if corrid is not None:
        corrid_type = "BYTES" if corrid == mc.TYPE_STRING else mc.DataType.Name(corrid)[5:]
    per_instance = max(1, cfg.max_batch_size)
    idle = sb.max_sequence_idle_microseconds or _DEFAULT_IDLE_US
    if sb.HasField("oldest"):
        old = sb.oldest
        return SequenceConfig(
            "oldest",
            cfg.max_batch_size,
            old.max_candidate_sequences or per_instance,
            idle,
            old.max_queue_delay_microseconds,
            preferred_batch_sizes=tuple(old.preferred_batch_size),
            preserve_ordering=old.preserve_ordering,
            corrid_type=corrid_type,
        )
    return SequenceConfig(
        "direct",
        cfg.max_batch_size,
        per_instance,
        idle,
        sb.direct.max_queue_delay_microseconds,
        minimum_slot_utilization=sb.direct.minimum_slot_utilization,
        corrid_type=corrid_type,
    )
