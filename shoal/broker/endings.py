"""The instances the broker ends itself, and why.

- One whose batch has run longer than the execution timeout is hung: it is killed.
- One over its memory limit (shoal/broker/memory.py) gets no more batches and is asked to
  stop after the batch it runs, so that its answers leave; it is killed if it has not
  stopped ``STOP_GRACE_S`` later, and at once at twice its limit (a runaway), which is
  read again while it stops.

Each ending is remembered until the instance's death is seen (``pop``), whose error
then names it, and ``lost`` answers the requests of any instance that exited. A pure
core like the router: no sockets, no signals; the shell passes in how to kill an
instance and how to ask one to stop, the clock, and the memory reader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Final, NamedTuple

from shoal.broker import memory
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.ordering import OrderedRelease
from shoal.broker.router import Dispatch, Router
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError

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

    def lost(self, inst: Instance, stopping: bool, now: float) -> Loss:
        """``inst``'s worker exited (taken out of the table's instances already;
        ``stopping``: the broker stops, and its workers with it). Its version forgets it
        and counts the exit, unless it was told to stop or had reported its load failed
        (such an instance is not restarted); one still loading fails its version's load.
        Its requests fail: those it ran, and those queued that no instance left can run."""
        why, ended = self.pop(inst.ident)
        if inst.retiring:  # told to stop for good (unloaded, or replaced by a reload)
            ended = "stopped: its model was unloaded or reloaded"
        counted = (why != "crash" or inst.state != "DEAD") and not inst.retiring
        # When the broker is stopping (SIGTERM), the workers are being stopped with it
        # (the launcher signals them together): an exit is the stop, not a fault.
        log.log(
            logging.INFO if stopping or inst.retiring else logging.ERROR,
            "instance %d of %s/%d (pid %d) %s", inst.index, inst.model, inst.version, inst.pid,
            "stopped" if stopping else ended,
        )  # fmt: skip
        was_loading = inst.state == "LOADING"
        ran = {id(item) for item in inst.in_flight.items} if inst.in_flight else set()
        ran |= {id(item) for item in inst.streams.values()}  # a decoupled model's, open
        failed, dispatches = self.router.instance_lost(inst, now)
        version = self.table.owner(inst)
        if version is not None:
            if counted and not stopping:
                version.exits[why] = version.exits.get(why, 0) + 1
            version.instances.pop(inst.ident, None)
            if was_loading:
                version.load_failed(inst, f"instance {inst.index} {ended} while loading")
        err, orphaned, sequence_lost = _lost_errors(inst, ended)
        siblings = (
            version is not None and version.sequencer is not None and bool(version.schedulable())
        )
        answers = [
            (item, err if id(item) in ran else sequence_lost if siblings else orphaned)
            for item in failed
        ]
        ordering = version.ordering if version is not None else None
        return Loss(answers, ordering, err, dispatches)

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


class Loss(NamedTuple):
    """What an instance's exit leaves to answer (``Endings.lost``)."""

    answers: list[tuple[m.WorkItem, ServingError]]  # each request it held or left queued
    ordering: OrderedRelease | None  # its version's order of answers (preserve_ordering)
    error: ServingError  # what its requests that ran got: its unconfirmed answers' error
    dispatches: list[Dispatch]  # batches its siblings were given meanwhile


def _lost_errors(inst: Instance, ended: str) -> tuple[ServingError, ServingError, ServingError]:
    """The errors of the requests ``inst`` ran, of those queued that no instance left can
    run, and of those queued for a sequence whose state it held, in Triton's words."""
    ran = ServingError(
        Code.UNAVAILABLE,
        f"Failed to process the request(s) for model instance '{inst.name}', "
        f"message: the instance's worker process (pid {inst.pid}) {ended}",
    )
    # (those still queued that no instance left can run: it was the model's last, or the
    # last on the GPU their CUDA memory is on; no instance ever saw them)
    orphaned = ServingError(
        Code.UNAVAILABLE,
        f"Failed to process the request(s) for model '{inst.model}' version "
        f"{inst.version}, message: instance '{inst.name}' (pid {inst.pid}) {ended} "
        "and no instance left can run them",
    )
    # (those queued for a sequence that ran on it, shoal/broker/sequencer.py: its state
    # is gone)
    sequence_lost = ServingError(
        Code.UNAVAILABLE,
        f"Failed to process the request(s) for model '{inst.model}' version "
        f"{inst.version}, message: instance '{inst.name}' (pid {inst.pid}) {ended}, and "
        "with it the state of the sequence they belong to",
    )
    return ran, orphaned, sequence_lost
