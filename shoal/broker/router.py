"""Routing of queued requests to idle instances (pure: no sockets; time is passed in).

Each model version keeps its queue (a DynamicBatcher when the config asks for dynamic
batching, else a FIFO where every request is its own batch) and a deque of idle
instances; an instance holds at most one batch at a time. Idle instances are used
least-recently-used first, which spreads work over all of them. A request in client CUDA
memory goes only to an instance that can reach it (``batcher.serves``): one on its GPU,
or one on the CPU; the others pass it over and take the requests behind it. Statistics
are kept here because this is where arrival, dispatch and completion meet.

With Triton's rate limiter on (a RateLimiter), an idle instance runs a batch only once
it holds the resources its instance group lists, and the instances waiting for a turn
go in the limiter's order, across every model: the first in that order whose batch is
due goes first. One whose resources are taken claims them: nobody behind it may take
any of them, so an instance that needs much is never starved by ones that need little.
Triton's limiter goes further and lets nobody at all pass the head of its queue, so a
model that needs nothing waits behind one that waits for a resource; here only those
that need something claimed wait. A batch forms when its instance gets its turn, so
requests that arrive meanwhile join it. A rate-limited batch is never shared among idle
instances: each turn is one batch.

The broker calls ``tick``, ``next_wakeup`` and ``overdue`` on every turn of its loop, so
they cost what is active, not what is loaded: they see only the versions whose batcher
holds something (``_armed``) and the instances running a batch (``_busy``, in dispatch
order), never the whole repository. A repository of hundreds of idle models must not
tax each request to the one that is busy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from shoal.broker.batcher import TIMEOUT_EXPIRED, cuda_devices, serves
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.rate_limiter import RateLimiter
from shoal.configs.rate_limits import ResourceKey
from shoal.ipc import messages as m
from shoal.ipc.messages import FailureReason

#: How long the broker remembers which requests an instance reported answered. A worker
#: sends its answers, then its report; both sit in its ZeroMQ queues until its I/O thread
#: writes them, so a worker killed right after the report may take answers with it. The
#: real risk lasts microseconds; seconds leave room for a starved or stopped process.
UNCONFIRMED_WINDOW_S = 2.0

Dispatch = tuple[Instance, m.ExecuteBatch]
Failure = tuple[m.WorkItem, str]  # an item to answer with an error, and the message


def _key(item: m.WorkItem) -> tuple[bytes, int]:
    return item.frontend, item.request.req_id


class Router:
    def __init__(self, table: ModelTable, limiter: RateLimiter | None = None) -> None:
        self.table = table
        self.limiter = limiter
        self._next_batch = 1
        self._arrived: dict[tuple[bytes, int], float] = {}
        self._queued_ns: dict[tuple[bytes, int], int] = {}
        # The version whose queue holds each queued request: a cancel looks there only.
        self._queued_in: dict[tuple[bytes, int], ModelVersion] = {}
        # Batching versions whose batcher holds a request or an unreported rejection.
        self._armed: dict[int, ModelVersion] = {}  # by id: a reload keeps two copies
        # Instances running a batch, oldest dispatch first (re-inserted on each dispatch).
        self._busy: dict[bytes, Instance] = {}
        # Rate-limited only: versions that hold queued requests, the idle instances whose
        # due batch the limiter holds back (a release, not their queue delay, is what
        # can let them go), and when next_wakeup last said tick has work.
        self._waiting: dict[int, ModelVersion] = {}
        self._held_back: set[bytes] = set()
        self._wake_at: float | None = None

    def submit(
        self, mv: ModelVersion, item: m.WorkItem, now: float, dispatch: bool = True
    ) -> list[Dispatch]:
        """Queue ``item``; raises Rejected when refused. A refused request is not a
        statistic: Triton hands the error back before its scheduler owns the request (a
        full queue leaves ``fail`` at 0 on Triton 2.51). ``dispatch=False`` leaves the
        batches to a later ``dispatch``: requests that arrived together are all queued
        before any batch is formed from them."""
        if mv.sequencer is not None:
            mv.sequencer.enqueue(item, now)  # SequenceRefused: no sequence takes it
            self._armed[id(mv)] = mv
        elif mv.batcher is not None:
            mv.batcher.enqueue(item, now)
            self._armed[id(mv)] = mv
        else:
            mv.queue.append(item)
        self._arrived[_key(item)] = now
        self._queued_in[_key(item)] = mv
        if self.limiter is not None:
            self._waiting[id(mv)] = mv
        return self._dispatch(mv, now) if dispatch else []

    def holds(self, frontend: bytes, req_id: int) -> bool:
        """The request is queued or running here: its batch (or its failure) answers it."""
        return (frontend, req_id) in self._arrived

    def dispatch(self, mv: ModelVersion, now: float) -> list[Dispatch]:
        """Batches for the idle instances of ``mv``, after submits that did not dispatch."""
        return self._dispatch(mv, now)

    def instance_ready(self, inst: Instance, now: float) -> list[Dispatch]:
        mv = self.table.owner(inst)
        if mv is None:
            return []
        if inst.index in mv.passive or inst.state != "READY":
            return []  # never scheduled (a passive instance group), or killed
        if inst.ident not in mv.idle and inst.in_flight is None:
            mv.idle.append(inst.ident)
        if mv.sequencer is not None:
            mv.sequencer.add_instance(inst.ident)
        return self._dispatch(mv, now)

    def batch_done(self, inst: Instance, done: m.BatchDone, now: float) -> list[Dispatch]:
        """The instance finished its batch. A stale report (not its current batch) is
        ignored: the batch it holds is still running."""
        batch = inst.in_flight
        if batch is None or batch.batch_id != done.batch_id:
            return []
        inst.in_flight = None
        self._busy.pop(inst.ident, None)
        if self.limiter is not None:
            self.limiter.release(inst)
        still_open = set(done.open)
        for pos in still_open:
            if 0 <= pos < len(batch.items):
                inst.streams[_key(batch.items[pos])] = batch.items[pos]
        self._remember_answered(inst, batch, now, still_open)
        mv = self.table.owner(inst)
        if mv is not None:
            if mv.sequencer is not None:
                mv.sequencer.completed(inst.ident, batch.items, now)
            failed, refused = set(done.failed), set(done.refused)
            ok_ns: list[int] = []
            samples = 0
            for pos, item in enumerate(batch.items):
                elapsed = int((now - self._arrived.pop(_key(item), now)) * 1e9)
                waited = self._queued_ns.pop(_key(item), 0)
                if pos in refused:
                    continue  # malformed: Triton refuses it before any statistic
                if pos in failed:
                    mv.stats.failed(elapsed, "BACKEND")
                else:
                    mv.stats.queued(waited, now)  # Triton counts queue time of successes only
                    ok_ns.append(elapsed)
                    samples += max(item.request.batch_size, 1)
                    if item.request.cache_miss_ns >= 0:
                        mv.stats.cache_missed(item.request.cache_miss_ns, now)
            if ok_ns:
                mv.stats.executed(done, ok_ns, samples, now)
            if mv.batcher is not None and not failed and not refused:  # a quick failure
                # says nothing of what the model takes
                mv.batcher.observe(done.batch_size, done.input_ns + done.infer_ns + done.output_ns)
        if inst.state != "READY":
            return self._allocate(now) if self.limiter is not None else []
        return self.instance_ready(inst, now)

    def streams_ended(self, inst: Instance, keys: list[tuple[bytes, int]]) -> list[m.WorkItem]:
        """A decoupled model's requests that got their final response; returns them."""
        ended = (inst.streams.pop((frontend, req_id), None) for frontend, req_id in keys)
        return [item for item in ended if item is not None]

    def running(self, frontend: bytes, req_id: int) -> Instance | None:
        """The instance that runs the request, or still answers it (a decoupled model's)."""
        key = (frontend, req_id)
        for inst in self._busy.values():
            batch = inst.in_flight
            if batch is not None and any(_key(it) == key for it in batch.items):
                return inst
        for inst in self.table.by_ident.values():
            if key in inst.streams:
                return inst
        return None

    def _remember_answered(
        self, inst: Instance, batch: m.ExecuteBatch, now: float, still_open: set[int]
    ) -> None:
        # Ordered answers travel with the report, through the broker: never unconfirmed;
        # nor are open streams (their requests are inst.streams', until they end).
        direct = [
            _key(item)
            for pos, item in enumerate(batch.items)
            if not item.seq and pos not in still_open
        ]
        if direct:
            inst.answered.append((now, direct))
        while inst.answered and now - inst.answered[0][0] > UNCONFIRMED_WINDOW_S:
            inst.answered.popleft()

    def unconfirmed(self, inst: Instance, now: float) -> dict[bytes, list[int]]:
        """The requests ``inst`` reported answered within the window, by frontend (for
        an instance that died: their answers may have died with it)."""
        by_frontend: dict[bytes, list[int]] = {}
        for when, keys in inst.answered:
            if now - when <= UNCONFIRMED_WINDOW_S:
                for frontend, req_id in keys:
                    by_frontend.setdefault(frontend, []).append(req_id)
        inst.answered.clear()
        return by_frontend

    def retire(self, inst: Instance) -> None:
        """Take ``inst`` out of scheduling at once: the broker has killed it (a hang, its
        memory), and its death, seen a little later (``instance_lost``), answers the batch
        it runs. Until then no batch goes to it, so its siblings take the requests."""
        inst.state = "DEAD"
        mv = self.table.owner(inst)
        if mv is None:
            return
        if inst.ident in mv.idle:
            mv.idle.remove(inst.ident)
        if mv.sequencer is not None:
            mv.sequencer.retire(inst.ident)
        mv.refresh_state()

    def instance_lost(self, inst: Instance, now: float) -> tuple[list[m.WorkItem], list[Dispatch]]:
        """Mark ``inst`` dead. Returns the items it was running or still answering (they
        failed) and, if no instance that can be sent requests is left, every queued item
        of the version too (a passive instance never takes them)."""
        mv = self.table.owner(inst)
        failed = list(inst.in_flight.items) if inst.in_flight else []
        # Open streams counted as successes when their batch returned (as Triton counts
        # a decoupled model's requests): they fail now, and count no more.
        streams = list(inst.streams.values())
        inst.streams.clear()
        inst.in_flight = None
        self._busy.pop(inst.ident, None)
        inst.state = "DEAD"
        if self.limiter is not None:
            self.limiter.release(inst)
        if mv is None:
            failed += streams
            return failed, self._allocate(now) if self.limiter is not None else []
        if inst.ident in mv.idle:
            mv.idle.remove(inst.ident)
        mv.refresh_state()
        if mv.sequencer is not None:  # its sequences' state died with it
            failed += mv.sequencer.remove_instance(inst.ident)
        if not mv.schedulable():
            failed.extend(mv.queue)
            mv.queue.clear()
            if mv.batcher is not None:
                failed.extend(mv.batcher.drain())
            if mv.sequencer is not None:
                failed.extend(mv.sequencer.drain())
        elif None not in (left := mv.reachable_gpus()):  # a CPU instance serves any
            # Requests in the CUDA memory of a GPU no instance left runs on (or loads on):
            # they fail now, as a version's queue does when its last instance goes.
            failed += self._remove_queued(
                mv, lambda it: not any(serves(g, cuda_devices(it.regions)) for g in left)
            )
        for item in failed:
            self._fail(mv, item, now, "BACKEND")
        failed += streams
        if self.limiter is not None:  # what it held is free: any version may go
            return failed, self._allocate(now)
        return failed, self._dispatch(mv, now)

    def tick(self, now: float) -> tuple[list[Dispatch], list[Failure]]:
        """Queue delays and timeouts that ran out: batches to send, requests to refuse."""
        dispatches: list[Dispatch] = []
        failures: list[Failure] = []
        for key, mv in list(self._armed.items()):
            if mv.sequencer is not None:
                mv.sequencer.expire(now)  # idle sequences free their slots
                if self.limiter is None and mv.idle:
                    dispatches.extend(self._dispatch(mv, now))
                if not mv.sequencer.holds_work():
                    del self._armed[key]
                continue
            batcher = mv.batcher
            if batcher is not None:
                for item in batcher.expire(now):
                    self._fail(mv, item, now, "REJECTED")
                    failures.append((item, TIMEOUT_EXPIRED))
                if self.limiter is None:
                    dispatches.extend(self._dispatch(mv, now))
            if batcher is None or not batcher.holds_work():
                del self._armed[key]
        # Rate-limited: once for all (it ranks every version), and only when a delay or a
        # timeout ran out: arrivals and releases allocate for themselves.
        ran_out = failures or (self._wake_at is not None and now >= self._wake_at)
        if self.limiter is not None and self._waiting and ran_out:
            dispatches.extend(self._allocate(now))
        return dispatches, failures

    def overdue(self, now: float, limit_s: float) -> list[Instance]:
        """Instances whose current batch has run longer than ``limit_s`` (hung, probably):
        the oldest dispatches, up to the first one still within the limit."""
        out: list[Instance] = []
        if limit_s <= 0:
            return out
        for inst in self._busy.values():
            if now - inst.dispatched_at <= limit_s:
                break
            out.append(inst)
        return out

    def due(self, now: float) -> bool:
        """Whether the time ``next_wakeup`` last found has come (``tick`` has work)."""
        return self._wake_at is not None and now >= self._wake_at

    def next_wakeup(self) -> float | None:
        """When ``tick`` next has work: a queue timeout, or a queue delay of a version
        with an idle instance (a busy version's next batch waits for its batch_done)."""
        times = [
            t
            for mv in self._armed.values()
            if mv.batcher is not None
            and (t := mv.batcher.next_wakeup(self._idle_gpus(mv))) is not None
        ]
        times += [
            t
            for mv in self._armed.values()
            if mv.sequencer is not None
            and (t := mv.sequencer.next_wakeup(self._idle_idents(mv))) is not None
        ]
        self._wake_at = min(times) if times else None
        return self._wake_at

    def _idle_gpus(self, mv: ModelVersion) -> list[int | None]:
        """Where ``mv``'s idle instances are, but those whose due batch the rate limiter
        holds back (for them, as for a busy one, only a timeout can wake)."""
        return [mv.instances[i].gpu for i in self._idle_idents(mv)]

    def _idle_idents(self, mv: ModelVersion) -> list[bytes]:
        return [i for i in mv.idle if i not in self._held_back]

    def forget_frontend(self, frontend: bytes, now: float) -> list[m.WorkItem]:
        """Drop the queued requests of a frontend that exited (failures, in the
        statistics); returns them."""
        holding = {id(mv): mv for key, mv in self._queued_in.items() if key[0] == frontend}
        return self._take_queued(holding.values(), lambda it: it.frontend == frontend, now, "OTHER")

    def cancel(self, frontend: bytes, req_id: int, now: float) -> m.WorkItem | None:
        """Drop a request its client gave up on, if it is still queued (a failure, in the
        statistics, as Triton counts a cancelled request); None once it is running.
        Triton drops cancelled requests only in its dynamic and sequence batchers; shoal
        drops them from every queue, so that an abandoned request costs no execution."""
        key = (frontend, req_id)
        mv = self._queued_in.get(key)
        if mv is None:  # running, answered or unknown: nothing to drop
            return None
        taken = self._take_queued([mv], lambda it: _key(it) == key, now, "CANCELED")
        return taken[0] if taken else None

    def _take_queued(
        self,
        versions: Iterable[ModelVersion],
        match: Callable[[m.WorkItem], bool],
        now: float,
        reason: FailureReason,
    ) -> list[m.WorkItem]:
        taken: list[m.WorkItem] = []
        for mv in list(versions):
            gone = self._remove_queued(mv, match)
            for item in gone:
                self._fail(mv, item, now, reason)
            taken += gone
        return taken

    @staticmethod
    def _remove_queued(mv: ModelVersion, match: Callable[[m.WorkItem], bool]) -> list[m.WorkItem]:
        gone = [it for it in mv.queue if match(it)]
        if gone:
            kept = [it for it in mv.queue if not match(it)]
            mv.queue.clear()
            mv.queue.extend(kept)
        if mv.batcher is not None:
            gone += mv.batcher.remove(match)
        if mv.sequencer is not None:
            gone += mv.sequencer.remove(match)
        return gone

    def _fail(self, mv: ModelVersion, item: m.WorkItem, now: float, reason: FailureReason) -> None:
        self._queued_ns.pop(_key(item), None)
        self._queued_in.pop(_key(item), None)
        arrived = self._arrived.pop(_key(item), now)
        mv.stats.failed(int((now - arrived) * 1e9), reason)

    def _next(self, mv: ModelVersion, now: float, inst: Instance) -> list[m.WorkItem]:
        """The next batch for the idle instance ``inst``, or []."""
        gpu = inst.gpu
        if mv.sequencer is not None:
            return mv.sequencer.take(inst.ident, now)
        if mv.batcher is not None:
            return mv.batcher.take_batch(now, gpu)
        for i, item in enumerate(mv.queue):  # the first one, but for client CUDA memory
            if serves(gpu, cuda_devices(item.regions)):
                del mv.queue[i]
                return [item]
        return []

    def _take(self, mv: ModelVersion, now: float) -> list[tuple[Instance, list[m.WorkItem]]]:
        """Idle instances that have a batch to run, least recently used first, and their
        batches: one, or (a batch shared among the idle instances, see
        DynamicBatcher.take_batches) several. Instances on the same GPU see the same
        requests: one of them asks for them all; while no request in CUDA memory is
        queued, every instance would see the same."""
        if mv.sequencer is not None:  # each instance has its own sequences
            for ident in mv.idle:
                if items := mv.sequencer.take(ident, now):
                    mv.idle.remove(ident)
                    return [(mv.instances[ident], items)]
            return []
        if mv.batcher is not None and not mv.batcher.cuda_queued:
            batches = mv.batcher.take_batches(now, share=len(mv.idle))
            return [(mv.instances[mv.idle.popleft()], items) for items in batches]
        if mv.batcher is None:
            if not mv.queue:
                return []
            if not mv.queue[0].regions:  # in host memory: for any instance
                return [(mv.instances[mv.idle.popleft()], [mv.queue.popleft()])]
        asked: set[int | None] = set()
        for ident in mv.idle:
            inst = mv.instances[ident]
            if inst.gpu in asked:
                continue
            items = self._next(mv, now, inst)
            if items:
                mv.idle.remove(ident)
                return [(inst, items)]
            asked.add(inst.gpu)
        return []

    def _dispatch(self, mv: ModelVersion, now: float) -> list[Dispatch]:
        if self.limiter is not None:
            self._waiting[id(mv)] = mv
            # With every instance of it busy, its work changes nobody's turn.
            return self._allocate(now) if mv.idle else []
        out: list[Dispatch] = []
        while mv.idle and (taken := self._take(mv, now)):
            out += [self._send(mv, inst, items, now) for inst, items in taken]
        return out

    def _allocate(self, now: float) -> list[Dispatch]:
        """Rate-limited dispatch, across versions: the idle instances of the versions that
        hold requests, in the limiter's order. Each whose batch is due takes its
        resources and its batch; one that cannot have them, and every one behind it
        that needs any of them, waits for a release. A pass that sent batches and held
        some back runs again: what it sent may have left an instance that claimed
        resources with nothing due, and its claim must not hold back the rest."""
        out: list[Dispatch] = []
        while True:
            sent = self._allocation_pass(now)
            out += sent
            if not sent or not self._held_back:
                break
        for key, mv in list(self._waiting.items()):
            if not mv.pending:
                del self._waiting[key]
        return out

    def _allocation_pass(self, now: float) -> list[Dispatch]:
        limiter = self.limiter
        assert limiter is not None
        waiting = [
            (limiter.rank(inst), inst, mv)
            for mv in self._waiting.values()
            for inst in [mv.instances[ident] for ident in mv.idle]
        ]
        waiting.sort(key=lambda entry: entry[0])
        out: list[Dispatch] = []
        self._held_back.clear()
        claimed: set[ResourceKey] = set()  # by those ahead that wait for them
        for _, inst, mv in waiting:
            if not self._due(mv, inst, now):
                continue
            needs = [key for key, _ in limiter.needs(inst).needs]
            if claimed.intersection(needs) or not limiter.acquire(inst):
                claimed.update(needs)
                self._held_back.add(inst.ident)
                continue
            items = self._next(mv, now, inst)
            if not items:  # not due after all (a timeout moved what it would take)
                limiter.release(inst, executed=False)
                continue
            mv.idle.remove(inst.ident)
            out.append(self._send(mv, inst, items, now))
        return out

    @staticmethod
    def _due(mv: ModelVersion, inst: Instance, now: float) -> bool:
        """Whether ``inst`` (idle) would be handed a batch of ``mv`` now."""
        if mv.sequencer is not None:
            return mv.sequencer.due(inst.ident, now)
        if mv.batcher is not None:
            return mv.batcher.due(now, inst.gpu)
        return any(serves(inst.gpu, cuda_devices(item.regions)) for item in mv.queue)

    def _send(
        self, mv: ModelVersion, inst: Instance, items: list[m.WorkItem], now: float
    ) -> Dispatch:
        """``items`` become the batch ``inst`` runs."""
        for item in items:
            # preserve_ordering orders the requests taken into batches, as Triton's
            # completion queue does: a refusal from the queue is answered at once.
            if mv.ordering is not None:
                item.seq = mv.ordering.assign()
            key = _key(item)
            self._queued_in.pop(key, None)
            self._queued_ns[key] = int((now - self._arrived.get(key, now)) * 1e9)
        rows = mv.sequencer.rows(inst.ident) if mv.sequencer is not None else 0
        batch = m.ExecuteBatch(self._next_batch, items, rows)
        self._next_batch += 1
        inst.in_flight = batch
        inst.dispatched_at = now
        self._busy.pop(inst.ident, None)  # to the end: the newest dispatch
        self._busy[inst.ident] = inst
        return inst, batch
