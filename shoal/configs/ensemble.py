"""Triton's ensemble models: the checks of an ensemble's steps, in Triton's words.

Two stages, as in Triton 2.51:

* ``check_graph`` (at load, from the config alone: ValidateEnsembleSchedulingConfig and
  BuildEnsembleGraph): every ensemble tensor is written by one step at most, every
  ensemble input is read and every ensemble output written by some step, every output
  can be computed from the inputs, and no intermediate tensor is written and never read
  (or read and never written).
* ``check_composition`` (once the composing models have loaded: ValidateEnsembleConfig),
  against the configs of the versions the steps name: the maps name real inputs and
  outputs, every required input of a step is fed, data types and shapes agree where one
  tensor meets several models, and the ensemble batches no more than its steps do.

``decoupled`` (with the configs ``check_composition`` reads) says whether the ensemble
answers as a decoupled model, and refuses steps that would mix the responses of
different decoupled models; ``complete`` runs both on serialized configs, as the broker
holds them. ``dependencies`` and ``cycle`` give the broker what an ensemble waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ENSEMBLE_PLATFORM, ConfigError


def is_ensemble(config: ModelSpec) -> bool:
    return config.platform == ENSEMBLE_PLATFORM


@dataclass(frozen=True)
class Dependency:
    model: str
    version: int  # -1: the latest ready version


def dependencies(config: ModelSpec) -> list[Dependency]:
    """The composing models of an ensemble, in step order, each once."""
    seen: dict[tuple[str, int], Dependency] = {}
    steps = config.ensemble_scheduling.steps if config.ensemble_scheduling is not None else ()
    for step in steps:
        key = (step.model_name, step.model_version)
        seen.setdefault(key, Dependency(*key))
    return list(seen.values())


def check_graph(config: pb.ModelConfig) -> None:
    """Raise ConfigError when the steps do not make a graph from the ensemble's inputs to
    its outputs (Triton's messages, quirks included)."""
    name = config.name
    written: dict[str, int] = {}  # ensemble tensor -> the step that writes it
    read: set[str] = set()
    for i, step in enumerate(config.ensemble_scheduling.step):
        for tensor in step.output_map.values():
            if tensor in written:
                raise ConfigError(
                    name,
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {i}",
                )
            written[tensor] = i
        read.update(step.input_map.values())
    inputs = [t.name for t in config.input]
    outputs = [t.name for t in config.output]
    for t in inputs:
        if t not in read:
            raise ConfigError(name, f"ensemble input '{t}' for ensemble {name}' is not used")
    for t in outputs:
        if t not in read and t not in written:
            raise ConfigError(name, f"ensemble output '{t}' for ensemble {name}' is not used")
    ready = set(inputs)  # what the inputs lead to, step by step
    pending = list(config.ensemble_scheduling.step)
    while runnable := [s for s in pending if set(s.input_map.values()) <= ready]:
        for s in runnable:
            ready.update(s.output_map.values())
            pending.remove(s)
    for t in outputs:
        if t not in ready:
            step = config.ensemble_scheduling.step[written[t]] if t in written else None
            missing = sorted(set(step.input_map.values()) - ready) if step is not None else []
            detail = f": at least one of its depending tensors, '{missing[0]}', is not connected"
            raise ConfigError(
                name, f"output '{t}' for ensemble '{name}' is not written" + detail * bool(missing)
            )
    # the rest: tensors the inputs never lead to, or that no step reads
    for t in sorted((read | set(written)) - set(inputs) - set(outputs)):
        if t not in ready or t not in read:
            raise ConfigError(name, f"ensemble tensor '{t}' is unused in ensemble '{name}'")


def cycle(configs: Mapping[str, ModelSpec], start: str) -> list[str] | None:
    """The ensembles on a circular dependency through ``start`` (the path, ``start``
    again at its end), or None."""
    path: list[str] = []
    done: set[str] = set()  # explored: no way back to a model on the path from there

    def visit(model: str) -> list[str] | None:
        if model in path:
            return [*path[path.index(model) :], model]
        config = configs.get(model)
        if model in done or config is None or not is_ensemble(config):
            return None
        path.append(model)
        for dep in dependencies(config):
            found = visit(dep.model)
            if found is not None:
                return found
        path.pop()
        done.add(model)
        return None

    found = visit(start)
    return found if found is not None and found[0] == start else None


def _shape(config: pb.ModelConfig, dims: list[int]) -> list[int]:
    return [-1, *dims] if config.max_batch_size > 0 else list(dims)


def _shape_str(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def in_order(mapping: Mapping[str, str], names: list[str]) -> list[tuple[str, str]]:
    """A step's map's (key, tensor) pairs, keys in the order of ``names`` (a model's
    config), then any others by name."""
    rank = {n: i for i, n in enumerate(names)}
    return sorted(mapping.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def _agree(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def check_composition(
    config: pb.ModelConfig, composing: Mapping[tuple[str, int], pb.ModelConfig]
) -> None:
    """Raise ConfigError when the steps do not fit the composing models' configs
    (``composing``: by (model, step's model_version), the config of the version it runs)."""
    name = config.name
    # ensemble tensor -> (data type, dims without batch, full dims, the model it came from)
    seen: dict[str, tuple[int, list[int], list[int], str]] = {}

    def meet(tensor: str, data_type: int, dims: list[int], model_cfg: pb.ModelConfig) -> None:
        full = _shape(model_cfg, dims)
        source = model_cfg.name
        if tensor not in seen:
            seen[tensor] = (data_type, dims, full, source)
            return
        was_type, was_dims, was_full, was_source = seen[tensor]
        if was_type != data_type:
            raise ConfigError(
                name,
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent data type: "
                f"{pb.DataType.Name(was_type)} is inferred from model {was_source} while "
                f"{pb.DataType.Name(data_type)} is inferred from model {source}",
            )
        if not (_agree(was_dims, dims) or _agree(was_full, full)):
            raise ConfigError(
                name,
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent shape: "
                f"{_shape_str(was_full)} is inferred from model {was_source} while "
                f"{_shape_str(full)} is inferred from model {source}",
            )

    for t in [*config.input, *config.output]:  # the ensemble's own: as reshaped, if they are
        dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
        meet(t.name, t.data_type, dims, config)
    for step in config.ensemble_scheduling.step:
        model = step.model_name
        cfg = composing[(model, int(step.model_version))]
        if 0 < cfg.max_batch_size < config.max_batch_size:
            raise ConfigError(
                name,
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {model} which only allows maximum batch size to be "
                f"{cfg.max_batch_size}",
            )
        inputs = {t.name: t for t in cfg.input}
        outputs = {t.name: t for t in cfg.output}
        # in the model's config order (a protobuf map has no order of its own)
        in_map = in_order(step.input_map, list(inputs))
        out_map = in_order(step.output_map, list(outputs))
        _check_step_maps(name, step, inputs, outputs, in_map, out_map)
        for key, tensor in in_map:
            t = inputs[key]
            meet(tensor, t.data_type, list(t.dims), cfg)
        for key, tensor in out_map:
            t = outputs[key]
            meet(tensor, t.data_type, list(t.dims), cfg)


def _check_step_maps(
    name: str,
    step: pb.ModelEnsembling.Step,
    inputs: Mapping[str, pb.ModelInput],
    outputs: Mapping[str, pb.ModelOutput],
    in_map: list[tuple[str, str]],
    out_map: list[tuple[str, str]],
) -> None:
    """Raise ConfigError when a step maps a tensor to an input or from an output its
    model does not have, or leaves a required input of its model unmapped."""
    model = step.model_name
    for key, tensor in in_map:
        if key not in inputs:
            raise ConfigError(
                name,
                f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                f"input {key} in model {model}",
            )
    for key, spec in inputs.items():
        if key not in step.input_map and not spec.optional:
            raise ConfigError(
                name,
                f"in ensemble {name}, input {key} in model {model} is not mapped to any "
                "ensemble tensors",
            )
    for key, tensor in out_map:  # (one tensor twice: check_graph refused it)
        if key not in outputs:
            raise ConfigError(
                name,
                f"in ensemble {name}, ensemble tensor {tensor} is mapped from "
                f"non-existing output {key} in model {model}",
            )


#: Where an ensemble tensor comes from: the request (-1), or the responses of the
#: decoupled step of that index (a tensor computed from those is theirs too).
_REQUEST = -1


def decoupled(config: pb.ModelConfig, composing: Mapping[tuple[str, int], pb.ModelConfig]) -> bool:
    """Whether the ensemble is decoupled: some step runs a decoupled model (an ensemble
    of one is such a model), whatever its own ``model_transaction_policy`` says, as in
    Triton 2.51. Each response of a decoupled step runs the steps after it once more, so
    a step must read tensors of one origin only: the request's, or one decoupled step's
    (raises ConfigError, in the current Triton's words, which name the step's model;
    Triton 2.51 named the ensemble twice). The ensemble's outputs must be of one origin
    too, or no response could carry them all: Triton refuses them as a step of the
    ensemble's own model."""
    name = config.name
    origin = {t.name: _REQUEST for t in config.input}
    steps = list(enumerate(config.ensemble_scheduling.step))
    found = False
    while runnable := [(i, s) for i, s in steps if all(t in origin for t in s.input_map.values())]:
        for i, step in runnable:
            steps.remove((i, step))
            sources = {origin[t] for t in step.input_map.values()}
            if len(sources) > 1:
                raise ConfigError(
                    name,
                    f"in ensemble {name}, step of model '{step.model_name}' receives inputs "
                    "originated from different decoupled models",
                )
            source = sources.pop() if sources else _REQUEST
            if composing[
                (step.model_name, int(step.model_version))
            ].model_transaction_policy.decoupled:
                found, source = True, i
            origin.update(dict.fromkeys(step.output_map.values(), source))
    # Triton's check reads the ensemble's outputs as a step of the ensemble's own model
    if len({origin[t.name] for t in config.output if t.name in origin}) > 1:
        raise ConfigError(
            name,
            f"in ensemble {name}, step of model '{name}' receives inputs originated from "
            "different decoupled models",
        )
    return found


def complete(config: bytes, composing: Mapping[tuple[str, int], bytes]) -> bytes:
    """The ensemble's serialized config checked against its composing models' (by (model,
    step's model_version), the serialized config of the version it runs) and completed:
    ``model_transaction_policy.decoupled`` set as its steps make it (as Triton reports it,
    and as the frontends run it; as Triton's, the policy is there when it is false too).
    Raises ConfigError; returns ``config`` itself when nothing changed."""
    cfg = pb.ModelConfig.FromString(config)
    parts = {key: pb.ModelConfig.FromString(c) for key, c in composing.items()}
    check_composition(cfg, parts)
    is_decoupled = decoupled(cfg, parts)
    policy = cfg.model_transaction_policy
    if cfg.HasField("model_transaction_policy") and policy.decoupled == is_decoupled:
        return config
    policy.SetInParent()
    policy.decoupled = is_decoupled
    return cfg.SerializeToString()
