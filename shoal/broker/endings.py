"""The instances the broker ends itself, and why.

- One whose batch has run longer than the execution timeout is hung: it is killed.
- One over its memory limit (shoal/broker/memory.py) gets no more batches and is asked to
  stop after the batch it runs, so that its answers leave; it is killed if it has not
  stopped ``STOP_GRACE_S`` later, and at once at twice its limit (a runaway), which is
  read again while it stops.

Each ending is remembered until the instance's death is seen (``pop``), whose error
then names it. A pure core like the router: no sockets, no signals; the shell passes in
how to kill an instance and how to ask one to stop, the clock, and the memory reader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Final

from shoal.broker import memory
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.router import Router
from shoal.ipc import messages as m

log = logging.getLogger("shoal.broker")

#: How long an instance asked to stop (over its memory limit) has before it is killed.
STOP_GRACE_S: Final = 10.0
#: How long an instance told to stop for good (its model unloaded or replaced) has: it
#: is idle, but one still loading its model reads the order only once loaded.
RETIRE_GRACE_S: Final = 30.0


class Endings:
    def __init__(
        self,
        table: ModelTable,
        router: Router,
        execution_timeout_s: float,
        default_limit_mb: int,
        kill: Callable[[Instance], None],
        ask_to_stop: Callable[[Instance], None],
        read: Callable[[int], int | None] = memory.private_memory,
        supported: bool = True,
    ) -> None:
        self.table, self.router = table, router
        self.execution_timeout_s = execution_timeout_s
        self.default_limit_mb = default_limit_mb
        self._kill, self._ask_to_stop, self._read = kill, ask_to_stop, read
        self._supported = supported  # the kernel reports a process's own memory
        self._warned = False
        # ident -> why, and how: "was killed (...)", "was stopped (...)"
        self._ended: dict[bytes, tuple[m.ExitReason, str]] = {}
        self._stopping: dict[bytes, tuple[float, str]] = {}  # ident -> (kill at, reason)
        self._retiring: dict[bytes, float] = {}  # ident -> kill at (told to stop for good)
        self._next_check = 0.0

    def limit_mb(self, model: str, version: int) -> int:
        """The limit on each instance's own memory: its config's, else the server's."""
        return self._limit_of(self.table.version(model, version))

    def _limit_of(self, mv: ModelVersion | None) -> int:
        if mv is not None and mv.memory_limit_mb is not None:
            return mv.memory_limit_mb
        return self.default_limit_mb

    def expect_exit(self, inst: Instance, now: float) -> None:
        """``inst`` was told to stop for good: killed if it has not exited in time."""
        self._retiring[inst.ident] = now + RETIRE_GRACE_S

    def pop(self, ident: bytes) -> tuple[m.ExitReason, str]:
        """At an instance's death: why it ended and how ("crash", "exited" when the
        broker did not end it)."""
        self._stopping.pop(ident, None)
        self._retiring.pop(ident, None)
        return self._ended.pop(ident, ("crash", "exited"))

    def tick(self, now: float, unwatched: Container[bytes] = ()) -> None:
        """Hung instances, stops that ran out of time, and (each ``CHECK_EVERY_S``) the
        memory of the instances whose pid is watched: an unwatched pid number might be
        another process's by now."""
        for inst in self.router.overdue(now, self.execution_timeout_s):
            if inst.ident not in self._ended:
                self.kill(
                    inst,
                    "execution_timeout",
                    f"it had run one batch for {now - inst.dispatched_at:.0f} s, longer than "
                    f"--model-execution-timeout-secs ({self.execution_timeout_s:g})",
                )
        if self._stopping:  # (the loop's every turn comes here: nothing to build if none)
            self._kill_late_stops(now)
        for ident in [i for i, due in self._retiring.items() if now >= due]:
            del self._retiring[ident]
            late = self.table.by_ident.get(ident)
            if late is not None:
                self.kill(
                    late,
                    "crash",  # (not counted: an instance told to stop for good)
                    f"it had not exited {RETIRE_GRACE_S:g} s after its model was unloaded "
                    "or reloaded",
                )
        if now >= self._next_check:
            self._next_check = now + memory.CHECK_EVERY_S
            self._check_memory(now, unwatched)

    def _kill_late_stops(self, now: float) -> None:
        for ident in [i for i, (due, _) in self._stopping.items() if now >= due]:
            _, reason = self._stopping.pop(ident)
            late = self.table.by_ident.get(ident)
            if late is not None:
                self.kill(
                    late, "memory_limit", f"{reason}; it had not stopped {STOP_GRACE_S:g} s later"
                )

    def kill(self, inst: Instance, why: m.ExitReason, reason: str) -> None:
        log.error(
            "instance %d of %s/%d (pid %d) is killed: %s",
            inst.index, inst.model, inst.version, inst.pid, reason,
        )  # fmt: skip
        self._ended[inst.ident] = (why, f"was killed ({reason})")
        self.router.retire(inst)  # not one more batch: a killed instance is often idle
        self._kill(inst)

    def _check_memory(self, now: float, unwatched: Container[bytes]) -> None:
        instances = [i for i in self.table.by_ident.values() if i.ident not in unwatched]

        def limit(inst: Instance) -> int:  # its own copy's (a reload runs two for a while)
            return self._limit_of(self.table.owner(inst))

        if not self._supported:
            if not self._warned and any(limit(i) > 0 for i in instances):
                self._warned = True
                log.warning(
                    "this kernel does not report a process's own memory (RssAnon): the "
                    "instance memory limits are not enforced"
                )
            return
        for over in memory.over_limit(instances, limit, self._read, self._stopping):
            inst, reason = over.inst, over.reason
            if over.runaway:  # at once, even while it is being stopped
                self._stopping.pop(inst.ident, None)
                self.kill(inst, "memory_limit", reason)
            elif inst.ident not in self._stopping:
                log.error(
                    "instance %d of %s/%d (pid %d) is stopped after its batch: %s",
                    inst.index, inst.model, inst.version, inst.pid, reason,
                )  # fmt: skip
                self._ended[inst.ident] = ("memory_limit", f"was stopped ({reason})")
                self._stopping[inst.ident] = (now + STOP_GRACE_S, reason)
                self.router.retire(inst)
                self._ask_to_stop(inst)
