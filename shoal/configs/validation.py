"""Triton's model-config validation rules, with Triton's messages.

`validate` mirrors core's ValidateModelConfig + ValidateInstanceGroup (run after
defaults are filled); `validate_io` mirrors ValidateModelIOConfig, which Triton runs
only after the backend has auto-completed inputs and outputs. Both are pure functions
of the config and raise ConfigError on the first problem found.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from math import prod

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.backend_params import instance_memory_limit_mb, share_min_compute_us
from shoal.configs.ensemble import check_graph
from shoal.configs.schema import (
    ENSEMBLE_PLATFORM,
    KNOWN_BACKENDS,
    KNOWN_PLATFORMS,
    MIN_COMPUTE_CAPABILITY,
    PLATFORM_TO_BACKEND,
    ConfigError,
)
from shoal.configs.sequence_rules import validate_sequence_batching
from shoal.configs.traffic import traffic_policy

_TENSORRT_PLATFORM = "tensorrt_plan"
_WILDCARD = -1


def validate(
    config: pb.ModelConfig,
    model_name: str,
    *,
    gpu_count: int = 0,
    check_io: bool = True,
    known_backends: Collection[str] = KNOWN_BACKENDS,
) -> None:
    """Raise ConfigError if `config` (already passed through fill_defaults) is invalid.

    `gpu_count` is the number of visible GPUs (ids 0..gpu_count-1). With `check_io`
    False the input/output rules are skipped, for configs whose tensors a backend will
    auto-complete later; call `validate_io` once it has.
    """
    name = config.name
    if not name:
        raise ConfigError(model_name, "model configuration must specify 'name'")
    _validate_platform(config, known_backends)
    if config.max_batch_size < 0:
        raise ConfigError(name, f"'max_batch_size' must be non-negative value for {name}")
    if not config.HasField("version_policy"):
        raise ConfigError(name, f"must specify 'version policy' for {name}")
    # shoal's parameter, checked whether or not the config names dynamic_batching: the
    # auto-complete may add it
    share_min_compute_us(config)
    instance_memory_limit_mb(config)
    traffic_policy(config)
    if config.HasField("dynamic_batching"):
        _validate_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        validate_sequence_batching(config)
    _validate_ensemble(config)
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ConfigError(
            name,
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        )
    _validate_metrics(config)
    validate_instance_groups(config, gpu_count=gpu_count)
    if check_io:
        validate_io(config)
    # Last, as core's ModelRepositoryManager checks it once the config is valid.
    if name != model_name:
        raise ConfigError(
            model_name,
            f"unexpected directory name '{model_name}' for model '{name}', "
            "directory name must equal model name",
        )


def _validate_platform(config: pb.ModelConfig, known_backends: Collection[str]) -> None:
    name, platform = config.name, config.platform
    # A known platform implies its backend even before fill_defaults has paired them.
    backend = config.backend or PLATFORM_TO_BACKEND.get(platform, "")
    if not platform and not backend:
        raise ConfigError(name, f"must specify 'platform' or 'backend' for '{name}'")
    if not backend:
        if platform != ENSEMBLE_PLATFORM:
            supported = ", ".join(sorted(KNOWN_PLATFORMS))
            raise ConfigError(
                name,
                f"unexpected platform type '{platform}' for {name}"
                f" (supported platforms: {supported})",
            )
        return
    if platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            name,
            f"Ensemble model '{name}' must have platform type '{platform}' and empty backend type",
        )
    if backend not in known_backends:
        supported = ", ".join(sorted(known_backends))
        raise ConfigError(
            name,
            f"unable to find backend library for backend '{backend}', try specifying "
            f"runtime on the model configuration (supported backends: {supported})",
        )
    implied = PLATFORM_TO_BACKEND.get(platform)
    if (platform and implied is None) or (implied is not None and implied != backend):
        raise ConfigError(
            name, f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}"
        )


def _validate_dynamic_batching(config: pb.ModelConfig) -> None:
    name, db = config.name, config.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise ConfigError(name, f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise ConfigError(
                name, f"dynamic batching preferred size must be <= max batch size for {name}"
            )
    levels = db.priority_levels
    if levels != 0:
        if db.default_priority_level == 0 or db.default_priority_level > levels:
            raise ConfigError(
                name, f"default priority level must be in range [1, {levels}] for {name}"
            )
        for level in db.priority_queue_policy:
            if level == 0 or level > levels:
                raise ConfigError(
                    name,
                    "priority queue policy must have priority level in range "
                    f"[1, {levels}] for {name}",
                )
    if db.preserve_ordering:
        if levels > 1:
            raise ConfigError(
                name,
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}",
            )
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds != 0 and policy.timeout_action == (
                pb.ModelQueuePolicy.DELAY
            ):
                raise ConfigError(
                    name,
                    "Queue policy can not have DELAY as timeout action when "
                    f"'preserve_ordering' is true for {name}",
                )


def _validate_ensemble(config: pb.ModelConfig) -> None:
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        if config.platform == ENSEMBLE_PLATFORM:
            raise ConfigError(
                name,
                f"ensemble scheduling must be set for ensemble {name} whose platform is "
                f"{ENSEMBLE_PLATFORM}",
            )
        return
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            name,
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}",
        )
    if len(config.instance_group) != 0:
        raise ConfigError(name, f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise ConfigError(name, f"optimization should not be specified for ensemble '{name}'")
    if len(config.model_warmup) != 0:
        raise ConfigError(name, f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if len(steps) == 0:
        raise ConfigError(name, f"must specify 'step' for ensemble '{name}'")
    for idx, step in enumerate(steps):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise ConfigError(
                    name, f"must specify '{field}' in step {idx} of ensemble '{name}'"
                )
    check_graph(config)


# A tag's label is "_" + its key: a valid Prometheus label name that does not start with
# "__" (reserved). Triton's Prometheus library would refuse any other.
_TAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")


def _validate_metrics(config: pb.ModelConfig) -> None:
    for key in config.metric_tags:
        if not _TAG_KEY.fullmatch(key):
            raise ConfigError(
                config.name,
                f"metric_tags key '{key}' cannot be a metric label ('_{key}'): use letters, "
                "digits and '_', not starting with '_'",
            )
    if not config.HasField("model_metrics"):
        return
    for control in config.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise ConfigError(config.name, "metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise ConfigError(config.name, "metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise ConfigError(config.name, "metric control must specify 'histogram_options'")
        if len(control.histogram_options.buckets) == 0:
            raise ConfigError(config.name, "histogram options must specify non-empty 'buckets'")


def validate_instance_groups(config: pb.ModelConfig, *, gpu_count: int = 0) -> None:
    """Triton's ValidateInstanceGroup against GPUs 0..gpu_count-1 (ensembles have none)."""
    name = config.name
    if config.HasField("ensemble_scheduling"):
        return
    if len(config.instance_group) == 0:
        raise ConfigError(name, f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        prefix = f"instance group {group.name} of model {name}"
        kind = group.kind
        if kind == pb.ModelInstanceGroup.KIND_GPU:
            _validate_gpu_ids(name, prefix, list(group.gpus), gpu_count)
        elif kind in (pb.ModelInstanceGroup.KIND_CPU, pb.ModelInstanceGroup.KIND_MODEL):
            if len(group.gpus) > 0:
                kind_name = pb.ModelInstanceGroup.Kind.Name(kind)
                raise ConfigError(
                    name, f"{prefix} has kind {kind_name} but specifies one or more GPUs"
                )
        else:
            raise ConfigError(name, f"{prefix} has unexpected kind KIND_AUTO")
        if config.platform != _TENSORRT_PLATFORM and len(group.profile) > 0:
            # No space before "specifies": Triton's message lacks it too.
            raise ConfigError(
                name,
                f"{prefix} and platform {config.platform}specifies profile field which is "
                "only supported for TensorRT models",
            )


def _validate_gpu_ids(name: str, prefix: str, gpus: list[int], gpu_count: int) -> None:
    if not gpus:
        if gpu_count == 0:
            raise ConfigError(name, f"{prefix} has kind KIND_GPU but no GPUs are available")
        raise ConfigError(name, f"{prefix} has kind KIND_GPU but specifies no GPUs")
    for gid in gpus:
        if not 0 <= gid < gpu_count:
            available = ", ".join(str(g) for g in range(gpu_count))
            raise ConfigError(
                name,
                f"{prefix} specifies invalid or unsupported gpu id {gid}. GPUs with at least "
                "the minimum required CUDA compute compatibility of "
                f"{MIN_COMPUTE_CAPABILITY:f} are: {available}",
            )


def validate_io(config: pb.ModelConfig) -> None:
    """Triton's ValidateModelIOConfig: each input/output, then batch inputs/outputs.

    Messages carry Triton's " for <model>" suffix.
    """
    name = config.name
    try:
        _check_unique(config.input, "model input")
        _check_unique(config.output, "model output")
        for inp in config.input:
            _validate_input(inp, config.max_batch_size, config.platform)
        for out in config.output:
            _validate_io_shape(out, config.max_batch_size, "model output ")
            _validate_tensor_flags(out, config.platform, "output")
        _validate_batch_io(config)
    except _IOError as err:
        raise ConfigError(name, f"{err} for {name}") from None


class _IOError(Exception):
    """An IO rule violation before the model name is appended."""


def _check_unique(ios: Sequence[pb.ModelInput] | Sequence[pb.ModelOutput], what: str) -> None:
    seen: set[str] = set()
    for io in ios:
        if io.name in seen:
            raise _IOError(f"{what} '{io.name}' is specified more than once")
        seen.add(io.name)


def _validate_input(io: pb.ModelInput, max_batch_size: int, platform: str) -> None:
    _validate_io_shape(io, max_batch_size, "model input ")
    if io.format in (pb.ModelInput.FORMAT_NHWC, pb.ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
        raise _IOError("model input NHWC/NCHW require 3 dims")
    _validate_tensor_flags(io, platform, "input")


def _validate_tensor_flags(io: pb.ModelInput | pb.ModelOutput, platform: str, io_type: str) -> None:
    if platform != _TENSORRT_PLATFORM and io.is_shape_tensor:
        raise _IOError("shape tensors are only supported for TensorRT platform")
    if io.is_non_linear_format_io:
        if platform != _TENSORRT_PLATFORM:
            raise _IOError("Non-linear IO format is only supported for the TensorRT platform")
        if len(io.dims) != 3:
            raise _IOError(f"Non-linear IO format {io_type} requires 3 dims")


def _validate_io_shape(
    io: pb.ModelInput | pb.ModelOutput, max_batch_size: int, prefix: str
) -> None:
    if not io.name:
        raise _IOError(f"{prefix}must specify 'name'")
    p = f"{prefix}'{io.name}' "
    if io.data_type == pb.TYPE_INVALID:
        raise _IOError(f"{p}must specify 'data_type'")
    if len(io.dims) == 0:
        raise _IOError(f"{p}must specify 'dims'")
    has_reshape = io.HasField("reshape")
    if has_reshape and len(io.reshape.shape) == 0 and max_batch_size == 0:
        raise _IOError(
            f"{p}cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported"
        )
    if any(d < 1 and d != _WILDCARD for d in io.dims):
        raise _IOError(
            f"{p}dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
        )
    if has_reshape:
        _validate_reshape(list(io.dims), list(io.reshape.shape), p)


def _validate_reshape(dims: list[int], shape: list[int], p: str) -> None:
    if any(d < 1 and d != _WILDCARD for d in shape):
        raise _IOError(
            f"{p}reshape dimensions must be integer >= 1, or -1 to indicate a "
            "variable-size dimension"
        )
    dims_size, reshape_size = _element_count(dims), _element_count(shape)
    # An empty reshape (a scalar) needs dims with exactly one element.
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        raise _IOError(f"{p}has different size for dims and reshape")
    if dims_size == _WILDCARD:
        dim_chunks, shape_chunks = _chunks(dims), _chunks(shape)
        if len(dim_chunks) != len(shape_chunks):
            raise _IOError(
                f"{p}has different number of variable-size dimensions for dims and reshape"
            )
        if dim_chunks != shape_chunks:
            raise _IOError(f"{p}has different size for dims and reshape")


def _element_count(shape: list[int]) -> int:
    """Triton's GetElementCount: -1 if any dim is variable, 0 for an empty shape."""
    if not shape:
        return 0
    if _WILDCARD in shape:
        return _WILDCARD
    return prod(shape)


def _chunks(shape: list[int]) -> list[int]:
    """Element counts of the runs of fixed dims between variable-size dims."""
    out, current = [], 1
    for d in shape:
        if d == _WILDCARD:
            out.append(current)
            current = 1
        else:
            current *= d
    out.append(current)
    return out


def _validate_batch_io(config: pb.ModelConfig) -> None:
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for bi in config.batch_input:
        kind = pb.BatchInput.Kind.Name(bi.kind)
        if len(bi.source_input) != 1:
            raise _IOError(
                f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}"
            )
        if bi.data_type not in (pb.TYPE_INT32, pb.TYPE_FP32):
            raise _IOError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        _check_sources(bi.source_input, inputs)
    for bo in config.batch_output:
        kind = pb.BatchOutput.Kind.Name(bo.kind)
        if len(bo.source_input) != 1:
            raise _IOError(
                f"batch output kind '{kind}' expects 1 source input, got {len(bo.source_input)}"
            )
        _check_sources(bo.source_input, inputs)
        targets: set[str] = set()
        for target in bo.target_name:
            if target not in outputs:
                raise _IOError(f"unknown target output name '{target}'")
            if target in targets:
                raise _IOError(f"target output name '{target}' can only be specified once")
            targets.add(target)


def _check_sources(sources: Sequence[str], inputs: set[str]) -> None:
    for source in sources:
        if source not in inputs:
            raise _IOError(f"unknown source input name '{source}'")
