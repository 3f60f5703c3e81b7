"""A model's configuration as the roles read it: typed, immutable structs.

`shoal.configs.spec_reader` fills them, once, from Triton's `ModelConfig` protobuf after
it was parsed, completed and validated (shoal.configs.model_config); nothing else makes
them from a config. The protobuf itself stays in the config parser, the gRPC adapter and
the renderers of ``/config``; the broker, the workers and the data plane read these.

Conventions: a data type is its v2 name ("FP32", "BYTES"; "INVALID" for none); an enum
is its protobuf name ("KIND_CPU", "BATCH_ELEMENT_COUNT"); times are microseconds (``_us``);
a repeated field is a tuple, a map a read-only `Mapping`; a message that may be absent is
``None`` when the config does not set it. Every struct is frozen; share them freely
between threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from shoal.configs.schema import ENSEMBLE_PLATFORM

Dims = tuple[int, ...]


def _no_map() -> Mapping[str, str]:
    return {}


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which versions are served: the ``num_versions`` latest, all, or ``versions``."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One ``input``: ``dims`` without the batch dimension; ``reshape`` None when unset."""

    name: str
    datatype: str
    dims: Dims = ()
    reshape: Dims | None = None
    format: str = "FORMAT_NONE"
    optional: bool = False
    is_shape_tensor: bool = False
    allow_ragged_batch: bool = False
    is_non_linear_format_io: bool = False


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """One ``output``: ``dims`` without the batch dimension; ``reshape`` None when unset."""

    name: str
    datatype: str
    dims: Dims = ()
    reshape: Dims | None = None
    label_filename: str = ""
    is_shape_tensor: bool = False
    is_non_linear_format_io: bool = False


@dataclass(frozen=True, slots=True)
class BatchInput:
    """One ``batch_input``: a tensor computed from the batch (``kind``, Triton's name)."""

    kind: str
    target_names: tuple[str, ...]
    datatype: str
    source_inputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BatchOutput:
    """One ``batch_output``: outputs split among the requests as ``source_inputs`` say."""

    kind: str
    target_names: tuple[str, ...]
    source_inputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RateLimiterResource:
    name: str
    count: int
    global_resource: bool = False  # the proto's ``global``


@dataclass(frozen=True, slots=True)
class RateLimiter:
    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 0


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """One ``instance_group`` (after completion: named, ``kind`` never KIND_AUTO)."""

    name: str
    kind: str
    count: int
    gpus: tuple[int, ...] = ()
    passive: bool = False
    host_policy: str = ""
    profiles: tuple[str, ...] = ()
    rate_limiter: RateLimiter | None = None


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """A ``ModelQueuePolicy`` (0: no timeout, no queue limit)."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=dict)


ControlKind = Literal["START", "END", "READY", "CORRID"]


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """One ``control`` of a ``control_input`` (``input_name``): its kind, and the values a
    START, END or READY takes (the one false/true pair the config gives) or a CORRID's
    ``datatype``."""

    input_name: str
    kind: ControlKind
    datatype: str = "INVALID"  # CORRID only
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()


@dataclass(frozen=True, slots=True)
class InitialState:
    """A state's ``initial_state``: zeros, or ``data_file`` (in ``initial_state/``)."""

    name: str
    datatype: str
    dims: Dims = ()
    data_file: str = ""  # "" : zero_data (or nothing)


@dataclass(frozen=True, slots=True)
class SequenceState:
    input_name: str
    output_name: str
    datatype: str
    dims: Dims = ()
    initial_states: tuple[InitialState, ...] = ()
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False


@dataclass(frozen=True, slots=True)
class SequenceBatching:
    """``sequence_batching``, with its strategy's fields flat: Direct reads
    ``max_queue_delay_us`` and ``minimum_slot_utilization``; Oldest reads
    ``max_candidate_sequences``, ``preferred_batch_sizes``, ``max_queue_delay_us`` and
    ``preserve_ordering``. Values as given (0: unset; the sequencer applies defaults)."""

    strategy: Literal["direct", "oldest"] = "direct"
    max_sequence_idle_us: int = 0
    controls: tuple[SequenceControl, ...] = ()
    states: tuple[SequenceState, ...] = ()
    iterative_sequence: bool = False
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: ``input_map`` model input -> ensemble tensor, ``output_map`` model output ->
    ensemble tensor; ``model_version`` -1 for the latest."""

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=_no_map)
    output_map: Mapping[str, str] = field(default_factory=_no_map)
    model_namespace: str = ""


@dataclass(frozen=True, slots=True)
class EnsembleScheduling:
    steps: tuple[EnsembleStep, ...] = ()
    max_inflight_requests: int = 0  # 0: no limit


WarmupSource = Literal["zero_data", "random_data", "input_data_file"]


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """One input of a warmup sample; ``source`` None when the config sets none."""

    name: str
    datatype: str
    dims: Dims = ()
    source: WarmupSource | None = None
    input_data_file: str = ""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``model_warmup`` entry; ``inputs`` in the order the protobuf map gives them
    (as Triton, the config's order is not kept)."""

    name: str
    batch_size: int = 0
    inputs: tuple[WarmupInput, ...] = ()
    count: int = 0


@dataclass(frozen=True, slots=True)
class Accelerator:
    name: str
    parameters: Mapping[str, str] = field(default_factory=_no_map)


@dataclass(frozen=True, slots=True)
class Optimization:
    priority: str = "PRIORITY_DEFAULT"
    graph_level: int = 0  # ``graph { level }``: a backend's graph optimization level
    gpu_accelerators: tuple[Accelerator, ...] = ()
    cpu_accelerators: tuple[Accelerator, ...] = ()
    input_pinned_memory: bool = False
    output_pinned_memory: bool = False
    gather_kernel_buffer_threshold: int = 0
    eager_batching: bool = False


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model's completed configuration.

    ``parameters`` holds each ``parameters`` entry's ``string_value``; ``decoupled`` is
    ``model_transaction_policy.decoupled``; ``response_cache`` its ``enable``.
    """

    name: str
    platform: str = ""
    backend: str = ""
    runtime: str = ""
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    max_batch_size: int = 0
    inputs: tuple[InputSpec, ...] = ()
    outputs: tuple[OutputSpec, ...] = ()
    batch_inputs: tuple[BatchInput, ...] = ()
    batch_outputs: tuple[BatchOutput, ...] = ()
    instance_groups: tuple[InstanceGroup, ...] = ()
    default_model_filename: str = ""
    cc_model_filenames: Mapping[str, str] = field(default_factory=_no_map)
    metric_tags: Mapping[str, str] = field(default_factory=_no_map)
    parameters: Mapping[str, str] = field(default_factory=_no_map)
    op_library_filenames: tuple[str, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    ensemble_scheduling: EnsembleScheduling | None = None
    model_warmup: tuple[WarmupSample, ...] = ()
    optimization: Optimization = field(default_factory=Optimization)
    response_cache: bool = False
    decoupled: bool = False

    @property
    def is_ensemble(self) -> bool:
        return self.platform == ENSEMBLE_PLATFORM

    @property
    def batching(self) -> bool:
        """Whether requests carry a batch dimension (``max_batch_size`` > 0)."""
        return self.max_batch_size > 0

    def input(self, name: str) -> InputSpec | None:
        return next((i for i in self.inputs if i.name == name), None)

    def output(self, name: str) -> OutputSpec | None:
        return next((o for o in self.outputs if o.name == name), None)
