"""A TensorRT plan's config (``platform: "tensorrt_plan"``): its auto-complete from the
engine's tensors, its parameters, and the choice of optimization profile for a batch, as
Triton's TensorRT backend (src/model_state.cc, src/instance_state.cc) does them.

Pure: no tensorrt import. The worker reads the engine into an `EngineInfo` (tensor names,
modes, types, shapes, each input's [min, opt, max] shape in each profile) and passes it in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.backend_params import ParamSource, parameters
from shoal.configs.schema import ConfigError, IOSpec

log = logging.getLogger("shoal.configs")

Shape = tuple[int, ...]
AllocationStrategy = Literal["STATIC", "ON_PROFILE_CHANGE"]
ALLOCATION_STRATEGY_KEY: Final = "execution_context_allocation_strategy"


@dataclass(frozen=True)
class TrtTensor:
    """One I/O tensor of an engine. ``shape``: the engine's, -1 where dynamic.
    ``profiles``: for an input, its (min, opt, max) shape in each optimization profile."""

    name: str
    is_input: bool
    datatype: str  # V2 name (FP32, BF16...), "" for a type Triton cannot carry
    shape: Shape
    profiles: tuple[tuple[Shape, Shape, Shape], ...] = ()
    shape_tensor: bool = False  # a shape tensor (values, not data, set the shapes)


@dataclass(frozen=True)
class EngineInfo:
    tensors: tuple[TrtTensor, ...]
    num_profiles: int

    @property
    def inputs(self) -> list[TrtTensor]:
        return [t for t in self.tensors if t.is_input]

    @property
    def outputs(self) -> list[TrtTensor]:
        return [t for t in self.tensors if not t.is_input]

    def io_specs(self) -> tuple[list[IOSpec], list[IOSpec]]:
        """The engine's tensors as IOSpecs (full shapes), inputs then outputs."""

        def spec(t: TrtTensor) -> IOSpec:
            return IOSpec(name=t.name, datatype=t.datatype, shape=list(t.shape))

        return [spec(t) for t in self.inputs], [spec(t) for t in self.outputs]


def max_supported_batch(engine: EngineInfo) -> int:
    """The largest batch the engine takes: 0 unless every tensor's first dimension is
    dynamic; else the largest over profiles of the smallest ``max`` first dimension of
    the profile's inputs (Triton's GetMaxSupportedBatchSize). Triton reads the profiles
    alone, so that an engine of static shapes [2, 4] passes for one of batch 2; shoal
    does not batch a tensor whose first dimension is fixed."""
    if not engine.tensors or any(
        not t.shape or t.shape[0] != -1 for t in engine.tensors if not t.shape_tensor
    ):
        return 0
    best = 0
    for p in range(engine.num_profiles):
        maxes = [t.profiles[p][2][0] for t in engine.inputs if not t.shape_tensor and t.profiles]
        if maxes:
            best = max(best, min(maxes))
    return best


def _config_dims(io: Any) -> list[int]:
    return list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)


def _batch_hint(config: pb.ModelConfig, engine: EngineInfo) -> tuple[bool, int]:
    """Whether the config's dims say the model batches (a tensor listed with one dimension
    fewer than the engine's, or a ragged one), and how many listed tensors have dims.
    Raises Triton's ConfigError when the tensors disagree."""
    shapes = {t.name: t.shape for t in engine.tensors}
    hint = False
    with_dims = 0
    for io in [*config.input, *config.output]:
        if getattr(io, "allow_ragged_batch", False):
            hint = True
            continue
        dims = _config_dims(io)
        if not dims:
            continue
        with_dims += 1
        if io.name not in shapes:
            continue  # the checks against the model name it
        should = len(shapes[io.name]) == len(dims) + 1
        hint = hint or should
        if hint and not should:
            raise ConfigError(
                config.name,
                f"unable to autofill for '{config.name}', model tensor configurations are "
                "contradicting each other in terms of whether batching is supported",
            )
    return hint, with_dims


def complete_max_batch(config: pb.ModelConfig, engine: EngineInfo) -> pb.ModelConfig:
    """A copy of ``config`` with max_batch_size (and an empty dynamic_batching above 1)
    set from the engine as Triton's TensorRT backend sets them: a config of 0 gets the
    engine's largest batch; one above it fails ("autofill failed for model 'm':
    configuration specified max-batch 16 but TensorRT engine only supports max-batch
    8"); config dims listed without the batch dimension mean no batching. The tensors
    are then completed and checked as for ONNX models (shoal.configs.autocomplete)."""
    out = pb.ModelConfig()
    out.CopyFrom(config)
    hint, with_dims = _batch_hint(out, engine)
    engine_max = max_supported_batch(engine)
    if hint and engine_max == 0:
        raise ConfigError(
            out.name,
            f"autofill failed for model '{out.name}': model tensor shape configuration hints "
            "for dynamic batching but the underlying engine doesn't support batching.",
        )
    if with_dims and not hint:
        log.warning(
            "The specified dimensions in model config for %s hints that batching is unavailable",
            out.name,
        )
        engine_max = 0
    if out.max_batch_size == 0:
        out.max_batch_size = engine_max
    elif out.max_batch_size > engine_max:
        raise ConfigError(
            out.name,
            f"autofill failed for model '{out.name}': configuration specified max-batch "
            f"{out.max_batch_size} but TensorRT engine only supports max-batch {engine_max}",
        )
    scheduled = out.HasField("dynamic_batching") or out.HasField("sequence_batching")
    if out.max_batch_size > 1 and not scheduled:
        out.dynamic_batching.SetInParent()
    return out


def allocation_strategy(config: ParamSource, instance: str) -> AllocationStrategy:
    """The ``execution_context_allocation_strategy`` parameter (default STATIC); another
    value fails with Triton's message."""
    value = parameters(config).get(ALLOCATION_STRATEGY_KEY, "STATIC")
    if value == "STATIC":
        return "STATIC"
    if value == "ON_PROFILE_CHANGE":
        return "ON_PROFILE_CHANGE"
    raise ConfigError(
        config.name,
        f"Invalid value for '{ALLOCATION_STRATEGY_KEY}': '{value}' for model instance "
        f"'{instance}'. Supported values are 'STATIC' and 'ON_PROFILE_CHANGE'.",
    )


def instance_profiles(
    names: Sequence[str], num_profiles: int, model: str, instance: str
) -> list[tuple[str, int]]:
    """(name, index) of each optimization profile an instance runs with: its group's
    ``profile`` list (index strings), or, where it lists none, every profile of the engine
    (Triton takes profile 0 alone then, so that a batch only a later profile takes fails
    although auto-complete set max_batch_size from all of them). Each gets an execution
    context of its own. Raises ConfigError with Triton's messages; a profile listed
    twice is used once (with Triton's warning)."""
    if not names:
        return [(str(i), i) for i in range(max(num_profiles, 1))]
    out: list[tuple[str, int]] = []
    seen: dict[int, str] = {}
    for name in names:
        if not name:
            raise ConfigError(model, "profile name must not be empty")
        try:
            index = int(name)
        except ValueError:
            raise ConfigError(model, f"unable to parse '{name}': stoi") from None
        if not 0 <= index < num_profiles:
            raise ConfigError(
                model,
                f"Can not set the specified optimization profile {name}[{index}] for "
                f"{instance}. Expected optimization profile index range 0-{num_profiles - 1}",
            )
        if index in seen:
            log.warning(
                "%s maps to profile index %d which has been mapped by %s, existing "
                "optimization profile will be reused",
                name, index, seen[index],
            )  # fmt: skip
            continue
        seen[index] = name
        out.append((name, index))
    return out


def profile_distance(
    engine: EngineInfo, profile: int, shapes: Mapping[str, Sequence[int]]
) -> int | None:
    """How far a batch's input shapes are from a profile's opt shapes (the sum of the
    dimensions' differences, Triton's "Manhattan distance"), or None when a shape lies
    outside the profile's [min, max] (or has another rank)."""
    total = 0
    for t in engine.inputs:
        shape = shapes.get(t.name)
        if shape is None or t.shape_tensor or not t.profiles:
            continue
        low, opt, high = t.profiles[profile]
        if len(shape) != len(opt):
            return None
        for d, lo, o, hi in zip(shape, low, opt, high, strict=True):
            if not lo <= d <= hi:
                return None
            total += abs(o - d)
    return total


def select_profile(
    engine: EngineInfo, profiles: Sequence[tuple[str, int]], shapes: Mapping[str, Sequence[int]]
) -> int | None:
    """The position in ``profiles`` of the profile closest to the batch's shapes (the
    first among equals), or None when none takes them. A lone profile is always chosen
    (TensorRT then checks the shapes), as by Triton."""
    if len(profiles) == 1:
        return 0
    best: tuple[int, int] | None = None
    for pos, (_, index) in enumerate(profiles):
        distance = profile_distance(engine, index, shapes)
        if distance is not None and (best is None or distance < best[0]):
            best = (distance, pos)
    return None if best is None else best[1]


def no_profile_message(profiles: Sequence[tuple[str, int]]) -> str:
    """Triton's message for a batch no profile of the instance takes."""
    listed = "".join(f" {name}[{index}]" for name, index in profiles)
    return (
        f"failed to find any Optimization Profile among [{listed}] to support the requested "
        "dimensions (or shape values)"
    )
