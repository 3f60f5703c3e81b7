"""Triton's rate limiter, as configured: ``--rate-limit``, ``--rate-limit-resource`` and
each instance group's ``rate_limiter { resources [...] priority }`` (pure).

With ``--rate-limit=execution_count`` an instance runs a batch only while the resources
its group lists are free: it holds them for the execution and gives them back after.
A resource is per device (each GPU has its own copies; CPU instances use device 0's, as
Triton gives them device id 0) unless the config marks it ``global`` (one set for the
whole server). How many copies exist: the largest count any instance asks for, unless
``--rate-limit-resource=<name>:<count>[:<device>]`` gives it; then a resource a model
needs more of than given (or that is not given at all) fails that model's load, with
Triton's message. A resource marked global by one instance and per device by another
fails the load of the model that brings the conflict.

``check`` does this once, at start, for the whole repository: models in name order
(shoal loads them all at start, and none is unloaded), each taken whole or refused
whole. The broker and the launcher both run it, so a refused model gets no workers.
shoal/broker/rate_limiter.py schedules with what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from shoal.configs.flags.broker import EVERY_DEVICE, GivenResource, parse_resource
from shoal.configs.model_spec import ModelSpec, RateLimiter
from shoal.configs.placement import instances_of, loadable

#: The device key of a global resource.
GLOBAL: Final = None
# (device, resource name): device None for a global resource
ResourceKey = tuple[int | None, str]


@dataclass(frozen=True)
class InstanceNeeds:
    """What one instance needs to run a batch, and its priority (Triton's weight: an
    instance of priority 2 is given half the turns of one of priority 1; 0 counts as 1)."""

    needs: tuple[tuple[ResourceKey, int], ...] = ()
    priority: int = 1


@dataclass
class RateLimits:
    """The outcome of ``check``."""

    # resource -> copies in the server (only the resources some accepted model uses)
    copies: dict[ResourceKey, int] = field(default_factory=dict)
    # (model, version, instance number) -> its needs, for every accepted model
    instances: dict[tuple[str, int, int], InstanceNeeds] = field(default_factory=dict)
    # model -> why its load fails
    refused: dict[str, str] = field(default_factory=dict)


def needs_of(name: str, config: ModelSpec) -> list[InstanceNeeds]:
    """Each instance's needs, by instance number (shoal.configs.placement numbers them)."""
    out = []
    for _, group, _, gpu in instances_of(name, config):
        if group.passive:  # never scheduled: Triton does not register it with the limiter
            out.append(InstanceNeeds())
            continue
        device = 0 if gpu is None else gpu  # Triton's device id of a CPU instance is 0
        limiter = group.rate_limiter or RateLimiter()
        needs: dict[ResourceKey, int] = {}
        for r in limiter.resources:
            key = (GLOBAL if r.global_resource else device, r.name)
            needs[key] = r.count  # a name listed twice: the last count, as Triton's map
        out.append(InstanceNeeds(tuple(needs.items()), max(limiter.priority, 1)))
    return out


def check(
    models: Iterable[tuple[str, list[int], ModelSpec]], given: list[GivenResource]
) -> RateLimits:
    """``models``: (name, versions, config) of each model that loads. Each model is
    accepted or refused whole, in name order, against the models accepted before it."""
    out = RateLimits()
    most: dict[ResourceKey, int] = {}  # the largest count an accepted instance asks for
    for name, versions, config in sorted(models, key=lambda entry: entry[0]):
        per_instance = needs_of(name, config)
        wanted = dict(most)
        for inst in per_instance:
            for key, count in inst.needs:
                wanted[key] = max(wanted.get(key, 0), count)
        try:
            copies = _copies(wanted, given)
        except ValueError as exc:
            out.refused[name] = f"Invalid argument: {exc}"  # as Triton 2.51 words the reason
            continue
        most, out.copies = wanted, copies
        for version in versions:
            for index, inst in enumerate(per_instance):
                out.instances[(name, version, index)] = inst
    return out


def for_repository(entries: list[Any], mode: str, given: list[str]) -> RateLimits | None:
    """``check`` over the models of a scanned repository that could be read, with the
    flags' values (``given``: --rate-limit-resource's, checked already); None when the
    rate limiter is off."""
    if mode != "execution_count":
        return None
    return check(loadable(entries), [parse_resource(g) for g in given])


def without_refused(entries: list[Any], mode: str, given: list[str]) -> list[Any]:
    """The entries less the models the rate limiter refuses (the broker starts no worker
    for them, so they take no cores from the others): what placement plans over."""
    limits = for_repository(entries, mode, given)
    return entries if limits is None else [e for e in entries if e.name not in limits.refused]


def _copies(wanted: dict[ResourceKey, int], given: list[GivenResource]) -> dict[ResourceKey, int]:
    """The copies of each resource ``wanted`` (resource -> most any instance needs), or
    ValueError with Triton's message: a name both global and per device, or fewer
    copies given than an instance needs."""
    copies = dict(wanted)
    if given:  # checked first, as Triton checks it first
        for key, need in sorted(wanted.items(), key=lambda kv: _order(kv[0])):
            copies[key] = have = _given_count(key, given)
            if have < need:
                raise ValueError(
                    f'Resource count for "{key[1]}" is limited to {have} which will prevent '
                    "scheduling of one or more model instances, the minimum required "
                    f"count is {need}"
                )
    global_names = {name for device, name in wanted if device is GLOBAL}
    for device, name in sorted(wanted, key=_order):
        if device is not GLOBAL and name in global_names:
            raise ValueError(
                f'Resource "{name}" is present as both global and device-specific resource '
                "in the model configuration."
            )
    return copies


def _given_count(key: ResourceKey, given: list[GivenResource]) -> int:
    """The copies of ``key`` given on the command line (0: not given). A global resource
    takes the largest count given for its name, whatever the device (Triton ignores it)."""
    device, name = key
    return max(
        (
            g.count
            for g in given
            if g.name == name and (device is GLOBAL or g.device in (device, EVERY_DEVICE))
        ),
        default=0,
    )


def _order(key: ResourceKey) -> tuple[int, str]:
    device, name = key
    return (-2 if device is GLOBAL else device, name)


def describe(copies: dict[ResourceKey, int]) -> str:
    """The resources, as one log line: ``GLOBAL: R3=2; device 0: R1=10, R2=5``."""
    by_device: dict[int | None, list[str]] = {}
    for (device, name), count in sorted(copies.items(), key=lambda kv: _order(kv[0])):
        by_device.setdefault(device, []).append(f"{name}={count}")
    return (
        "; ".join(
            f"{'GLOBAL' if device is GLOBAL else f'device {device}'}: {', '.join(items)}"
            for device, items in by_device.items()
        )
        or "none"
    )
