"""Cores go where the work is: idle CPU instances lend their cores to busy ones (pure).

Every CPU instance keeps its home cores (shoal.configs.placement: a block of its own while there
are enough), and is pinned there when the server is quiet. An instance that has had no
batch for ``idle_after_s`` lends its home cores; each lent core goes to exactly one busy
instance that can use more cores than its own (``threads`` above its core count: the
worker sized its intra-op pool for cores it may borrow), round-robin, so two busy
instances never share a lent core. A core that is also some busy instance's home (more
instances than cores) is never lent.

An instance that gets a batch again takes its cores back at once: ``active`` returns the
pins that change (the borrower's shrinks before the batch is sent). ``tick`` notices the
instances that went idle. No sockets, no system calls, time passed in: the broker's shell
applies the pins with ``sched_setaffinity`` on every thread of each worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

#: An instance with no batch for this long lends its cores.
IDLE_AFTER_S: Final[float] = 0.5
#: How often the lender looks for instances that went idle (and busy ones to lend to).
PERIOD_S: Final[float] = 0.1


@dataclass
class _Lender:
    home: tuple[int, ...]
    threads: int  # intra-op threads its backend was given: above len(home), it borrows
    last_busy: float = float("-inf")
    running: bool = False  # a batch in flight


@dataclass
class CoreLender:
    idle_after_s: float = IDLE_AFTER_S
    period_s: float = PERIOD_S
    _members: dict[bytes, _Lender] = field(default_factory=dict)
    _pins: dict[bytes, tuple[int, ...]] = field(default_factory=dict)  # as last applied
    _next_tick: float = 0.0  # (monotonic: 0 is long past, so the first tick is due)

    def add(self, key: bytes, home: Sequence[int], threads: int) -> None:
        """A CPU instance that is ready, pinned to ``home`` (none: not pinned; ignored)."""
        if home:
            self._members[key] = _Lender(tuple(sorted(home)), threads)
            self._pins[key] = tuple(sorted(home))

    def remove(self, key: bytes, now: float) -> dict[bytes, tuple[int, ...]]:
        """An instance that exited: the cores it lent or borrowed are planned anew."""
        self._members.pop(key, None)
        self._pins.pop(key, None)
        return self._changes(now)

    def pins(self) -> dict[bytes, tuple[int, ...]]:
        return dict(self._pins)

    def active(self, key: bytes, now: float) -> dict[bytes, tuple[int, ...]]:
        """``key`` got a batch. If it was idle, its lent cores come back at once."""
        member = self._members.get(key)
        if member is None:
            return {}
        was_idle = not self._busy(member, now)
        member.running = True
        member.last_busy = now
        return self._changes(now) if was_idle else {}

    def done(self, key: bytes, now: float) -> None:
        """``key``'s batch ended (it stays busy for ``idle_after_s`` more)."""
        member = self._members.get(key)
        if member is not None:
            member.running = False
            member.last_busy = now

    def next_wakeup(self) -> float | None:
        """When ``tick`` is next due: None with fewer than two members (nothing to lend)."""
        return self._next_tick if len(self._members) > 1 else None

    def tick(self, now: float) -> dict[bytes, tuple[int, ...]]:
        """The pins that change now that instances went idle (at most every period)."""
        if now < self._next_tick:
            return {}
        self._next_tick = now + self.period_s
        return self._changes(now)

    def _busy(self, member: _Lender, now: float) -> bool:
        return member.running or now - member.last_busy < self.idle_after_s

    def _changes(self, now: float) -> dict[bytes, tuple[int, ...]]:
        plan = self.plan(now)
        changed = {k: cores for k, cores in plan.items() if self._pins.get(k) != cores}
        self._pins.update(changed)
        return changed

    def plan(self, now: float) -> dict[bytes, tuple[int, ...]]:
        """Each member's cores now: its home, and for a busy borrower its share of the
        cores idle members lend."""
        busy = sorted(k for k, m in self._members.items() if self._busy(m, now))
        kept = {c for k in busy for c in self._members[k].home}
        lent = sorted({c for k, m in self._members.items() if k not in busy for c in m.home} - kept)
        plan = {k: m.home for k, m in self._members.items()}
        borrowers = [k for k in busy if self._members[k].threads > len(self._members[k].home)]
        if not borrowers or not lent:
            return plan
        extra: dict[bytes, list[int]] = {k: [] for k in borrowers}
        room = {k: self._members[k].threads - len(self._members[k].home) for k in borrowers}
        turn = 0
        for core in lent:  # round-robin among those with room for another thread's core
            for _ in range(len(borrowers)):
                k = borrowers[turn % len(borrowers)]
                turn += 1
                if room[k] > 0:
                    extra[k].append(core)
                    room[k] -= 1
                    break
        for k, cores in extra.items():
            plan[k] = tuple(sorted({*self._members[k].home, *cores}))
        return plan
