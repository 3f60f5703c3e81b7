"""Routing of queued requests to idle instances (pure: no sockets, no clock).

Each model version keeps one FIFO queue and a deque of idle instances; an instance
holds at most one batch at a time. Idle instances are used least-recently-used first,
which spreads work over all instances. Without a batcher, a batch is one request.
"""

from __future__ import annotations

from broker.models import Instance, ModelTable, ModelVersion
from ipc import messages as m

Dispatch = tuple[Instance, m.ExecuteBatch]


class Router:
    def __init__(self, table: ModelTable) -> None:
        self.table = table
        self._next_batch = 1

    def submit(self, mv: ModelVersion, item: m.WorkItem) -> list[Dispatch]:
        mv.queue.append(item)
        return self._dispatch(mv)

    def instance_ready(self, inst: Instance) -> list[Dispatch]:
        mv = self.table.version(inst.model, inst.version)
        if mv is None:
            return []
        if inst.ident not in mv.idle and inst.in_flight is None:
            mv.idle.append(inst.ident)
        return self._dispatch(mv)

    def batch_done(self, inst: Instance) -> list[Dispatch]:
        inst.in_flight = None
        if inst.state != "READY":
            return []
        return self.instance_ready(inst)

    def instance_lost(self, inst: Instance) -> tuple[list[m.WorkItem], list[Dispatch]]:
        """Mark ``inst`` dead. Returns the items it was running (they failed) and, if
        no instance is left, every queued item of the version too."""
        mv = self.table.version(inst.model, inst.version)
        failed = list(inst.in_flight.items) if inst.in_flight else []
        inst.in_flight = None
        inst.state = "DEAD"
        if mv is None:
            return failed, []
        if inst.ident in mv.idle:
            mv.idle.remove(inst.ident)
        mv.refresh_state()
        if not mv.live():
            failed.extend(mv.queue)
            mv.queue.clear()
        return failed, self._dispatch(mv)

    def _dispatch(self, mv: ModelVersion) -> list[Dispatch]:
        out: list[Dispatch] = []
        while mv.queue and mv.idle:
            inst = mv.instances[mv.idle.popleft()]
            batch = m.ExecuteBatch(self._next_batch, [mv.queue.popleft()])
            self._next_batch += 1
            inst.in_flight = batch
            out.append((inst, batch))
        return out
