"""Triton's rate limiter at run time (``--rate-limit=execution_count``; pure).

The router asks ``acquire`` before it hands an idle instance a batch, and calls
``release`` when that batch ends (done, or the instance died). Between the two the
instance holds its resources (shoal/configs/rate_limits.py says which, and how many copies
exist). ``rank`` orders the instances waiting for a turn as Triton's does: executions so
far times priority, lowest first, so that an instance of priority 2 runs half as often
as one of priority 1 while both have work; ties go to the one that ran least recently.
"""

from __future__ import annotations

import itertools

from shoal.broker.models import Instance
from shoal.configs.rate_limits import InstanceNeeds, RateLimits, ResourceKey
from shoal.ipc import messages as m

_NOTHING = InstanceNeeds()


class RateLimiter:
    def __init__(self, limits: RateLimits) -> None:
        self._copies = limits.copies
        self._needs = limits.instances
        self._used: dict[ResourceKey, int] = dict.fromkeys(limits.copies, 0)
        # instance ident -> what it holds, and when it last ran before this grant
        self._held: dict[bytes, tuple[InstanceNeeds, int]] = {}
        # (model, version, instance number) -> executions so far, and when it last ran:
        # a restarted instance keeps its place
        self._runs: dict[tuple[str, int, int], int] = {}
        self._last: dict[tuple[str, int, int], int] = {}
        self._grants = itertools.count(1)

    def needs(self, inst: Instance) -> InstanceNeeds:
        return self._needs.get((inst.model, inst.version, inst.index), _NOTHING)

    def executions(self, inst: Instance) -> int:
        return self._runs.get((inst.model, inst.version, inst.index), 0)

    def rank(self, inst: Instance) -> tuple[int, int]:
        """Lower goes first: (executions x priority, the grant it last had)."""
        key = (inst.model, inst.version, inst.index)
        return self.executions(inst) * self.needs(inst).priority, self._last.get(key, 0)

    def acquire(self, inst: Instance) -> bool:
        """Take ``inst``'s resources if every one is free enough; else take nothing."""
        needs = self.needs(inst)
        if any(self._used[key] + count > self._copies[key] for key, count in needs.needs):
            return False
        for key, count in needs.needs:
            self._used[key] += count
        key3 = (inst.model, inst.version, inst.index)
        self._held[inst.ident] = needs, self._last.get(key3, 0)
        self._last[key3] = next(self._grants)
        return True

    def release(self, inst: Instance, executed: bool = True) -> None:
        """Give back what ``inst`` holds, if anything; ``executed``: it ran a batch (which
        counts towards its rank; a grant it did not use leaves its place as it was)."""
        held = self._held.pop(inst.ident, None)
        if held is None:
            return
        needs, last = held
        for key, count in needs.needs:
            self._used[key] -= count
        key3 = (inst.model, inst.version, inst.index)
        if executed:
            self._runs[key3] = self._runs.get(key3, 0) + 1
        else:
            self._last[key3] = last

    def turns(self, inst: Instance) -> m.InstanceTurns:
        """What ``inst`` needs and has had, for the model's status."""
        needs = self.needs(inst)
        return m.InstanceTurns(
            needs.priority,
            [m.ResourceNeed(name, count, device) for (device, name), count in needs.needs],
            self.executions(inst),
            inst.ident in self._held,
        )

    def in_use(self) -> dict[ResourceKey, int]:
        """Copies held now, by resource."""
        return dict(self._used)
