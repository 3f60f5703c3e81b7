"""Where each model instance runs: which CPU cores or which GPU (pure).

Triton's instance_group semantics: a KIND_CPU group of ``count`` makes ``count``
instances; a KIND_GPU group makes ``count`` instances on every GPU it lists. Each CPU
instance gets cores of its own while there are enough: the usable cores split into as
many contiguous blocks, their sizes at most one apart, so no core is left to no one
(9 instances on 16 cores: 7 of 2 cores, 2 of 1). Beyond one instance per core, instances
share cores round-robin. Instances of a ``passive`` group are loaded but never sent work
(Triton's passive instances): they take no core from the others and run on all of them.
A GPU instance sees only its GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shoal.configs.model_spec import InstanceGroup, ModelSpec
from shoal.configs.schema import ENSEMBLE_PLATFORM


@dataclass(frozen=True)
class InstancePlan:
    model: str
    version: int
    index: int  # instance number within the model version
    name: str  # Triton's instance name: <group>_<k>
    cores: tuple[int, ...] = ()
    gpu: int | None = None


def plan_instances(
    models: list[tuple[str, list[int], ModelSpec]], cpus: list[int]
) -> list[InstancePlan]:
    """``models``: (name, versions, completed-enough config) of each loadable model."""
    raw: list[tuple[InstancePlan, bool]] = []  # (a plan without cores yet, passive)
    for name, versions, config in models:
        for version in versions:
            for index, group, k, gpu in instances_of(name, config):
                plan = InstancePlan(name, version, index, f"{group.name}_{k}", gpu=gpu)
                raw.append((plan, group.passive))
    active = sum(1 for plan, passive in raw if plan.gpu is None and not passive)
    blocks = _core_blocks(cpus, active)
    plans: list[InstancePlan] = []
    for plan, passive in raw:
        if plan.gpu is None:
            cores = tuple(cpus) if passive else next(blocks)
            plan = dataclasses.replace(plan, cores=cores)
        plans.append(plan)
    return plans


def instances_of(
    name: str, config: ModelSpec
) -> Iterator[tuple[int, InstanceGroup, int, int | None]]:
    """(index, group, k, gpu) of each instance of a version of model ``name``: its number
    in the version, its instance group, its number in the group (on its GPU), and its GPU
    (None: the CPU). Every process numbers instances this way."""
    index = 0
    for group in config.instance_groups or [InstanceGroup(name, "KIND_AUTO", 0)]:
        gpus: list[int | None] = list(group.gpus) if group.kind == "KIND_GPU" else [None]
        for gpu in gpus:
            for k in range(max(group.count, 1)):
                yield index, group, k, gpu
                index += 1


def _core_blocks(cpus: list[int], n: int) -> Iterator[tuple[int, ...]]:
    """The cores of each of ``n`` instances, in order: contiguous blocks covering every
    core, the first ``len(cpus) % n`` one core larger; past one instance per core, one
    core each, round-robin."""
    if n > len(cpus):
        for i in itertools.count():
            yield (cpus[i % len(cpus)],)
    share, extra = divmod(len(cpus), max(n, 1))
    start = 0
    for i in range(n):
        size = share + (1 if i < extra else 0)
        yield tuple(cpus[start : start + size])
        start += size


def loadable(entries: list[Any]) -> list[tuple[str, list[int], ModelSpec]]:
    """(name, versions, config) of each model of a scanned repository (``repository.scan``'s
    entries) that could be read."""
    return [
        (e.name, e.versions, e.spec)
        for e in entries
        if not e.error and e.config and e.config.platform != ENSEMBLE_PLATFORM  # no instances
    ]


def plan_repository(entries: list[Any], cpus: list[int]) -> list[InstancePlan]:
    """The plans of every instance of a scanned repository: its models that could be
    read, on the host's usable ``cpus``."""
    return plan_instances(loadable(entries), cpus)


def find_plan(
    plans: list[InstancePlan], model: str, version: int, index: int
) -> InstancePlan | None:
    return next(
        (p for p in plans if (p.model, p.version, p.index) == (model, version, index)), None
    )


def instance_count(config: ModelSpec) -> int:
    """How many instances a model version gets."""
    return sum(1 for _ in instances_of("", config))


def passive_instances(config: ModelSpec) -> frozenset[int]:
    """The instance numbers of ``passive`` groups: Triton loads them but never schedules
    requests on them."""
    return frozenset(index for index, group, _, _ in instances_of("", config) if group.passive)
