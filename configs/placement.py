"""Where each model instance runs: which CPU cores or which GPU (pure).

Triton's instance_group semantics: a KIND_CPU group of ``count`` makes ``count``
instances; a KIND_GPU group makes ``count`` instances on every GPU it lists. Each CPU
instance gets cores of its own while there are enough (an even share of the usable
cores); beyond that, instances share cores round-robin. A GPU instance sees only its GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc


@dataclass(frozen=True)
class InstancePlan:
    model: str
    version: int
    index: int  # instance number within the model version
    name: str  # Triton's instance name: <group>_<k>
    cores: tuple[int, ...] = ()
    gpu: int | None = None


def plan_instances(models: list[tuple[str, list[int], Any]], cpus: list[int]) -> list[InstancePlan]:
    """``models``: (name, versions, completed-enough ModelConfig) of each loadable model."""
    raw: list[tuple[str, int, int, str, int | None]] = []
    for name, versions, config in models:
        for version in versions:
            index = 0
            for group in config.instance_group or [mc.ModelInstanceGroup(name=name)]:
                count = max(group.count, 1)
                gpus = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else [None]
                for gpu in gpus:
                    for k in range(count):
                        raw.append((name, version, index, f"{group.name}_{k}", gpu))
                        index += 1
    cpu_instances = [r for r in raw if r[4] is None]
    share = max(len(cpus) // max(len(cpu_instances), 1), 1)
    plans: list[InstancePlan] = []
    cpu_i = 0
    for name, version, index, iname, gpu in raw:
        if gpu is None:
            if len(cpu_instances) <= len(cpus):
                cores = tuple(cpus[cpu_i * share : (cpu_i + 1) * share])
            else:
                cores = (cpus[cpu_i % len(cpus)],)
            cpu_i += 1
            plans.append(InstancePlan(name, version, index, iname, cores))
        else:
            plans.append(InstancePlan(name, version, index, iname, gpu=gpu))
    return plans


def plan_repository(entries: list[Any], cpus: list[int]) -> list[InstancePlan]:
    """The plans of every instance of a scanned repository (``repository.scan``'s
    entries): its models that could be read, on the host's usable ``cpus``."""
    loadable = [(e.name, e.versions, e.config) for e in entries if not e.error and e.config]
    return plan_instances(loadable, cpus)


def find_plan(
    plans: list[InstancePlan], model: str, version: int, index: int
) -> InstancePlan | None:
    return next(
        (p for p in plans if (p.model, p.version, p.index) == (model, version, index)), None
    )


def _group_size(group: Any) -> int:
    """Instances a group makes (KIND_GPU: ``count`` per listed GPU)."""
    per = len(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else 1
    return max(group.count, 1) * max(per, 1)


def instance_count(config: Any) -> int:
    """How many instances a model version gets."""
    return sum(_group_size(g) for g in config.instance_group) or 1


def passive_instances(config: Any) -> frozenset[int]:
    """The instance numbers (as ``plan_instances`` numbers them) of ``passive`` groups:
    Triton loads them but never schedules requests on them."""
    out: set[int] = set()
    index = 0
    for group in config.instance_group:
        n = _group_size(group)
        if group.passive:
            out.update(range(index, index + n))
        index += n
    return frozenset(out)
