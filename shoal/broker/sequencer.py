"""Triton's sequence batcher, for stateful models, as a pure class (no sockets, no clock).

A model whose config has ``sequence_batching`` gets one ``SequenceBatcher`` per version
in place of the dynamic batcher. The requests of one sequence (one correlation ID, the
request's ``sequence_id``) all run on the same instance, in arrival order, one at a time,
because the model (or the implicit state the worker keeps for it) carries something from
each request to the next. Triton 2.51's rules (sequence_batch_scheduler.cc):

* Each instance has slots: ``max(1, max_batch_size)`` under the Direct strategy (the
  default), ``max_candidate_sequences`` (default the same) under Oldest. A request with
  START opens a sequence, which takes the free slot with the lowest number on any
  instance (so sequences spread over the instances first), or waits in the backlog, in
  arrival order, for one to free. Its later requests join its queue; END closes it, and
  its slot frees once that request has been taken into a batch. A sequence may start and
  end in the backlog; the whole of its queue moves into the slot it gets.
* A request with a batch of more than one, without a correlation ID, or without START
  for a sequence that is not open is refused, in Triton's words. START for an open
  sequence is not an error: the open one ends early (a warning), and the request joins
  its queue, as Triton does (the model sees START and the state starts again). A request
  of a sequence that is cancelled (or whose frontend exits) while queued ends its whole
  sequence, as in Triton: its other queued requests fail with it.
* A sequence in a slot with nothing queued or running for ``max_sequence_idle_microseconds``
  (default 1 s; to within 10 ms) is closed: its correlation ID is forgotten, so a later
  request without START is refused, and its slot frees. Nothing is sent to the model. Backlogged
  sequences are never idle. (Triton counts from the sequence's last arrival, so a
  prompt client whose requests wait behind a slow model loses its sequence; here the
  time counts from its last answer, or its last arrival if later.)
* Direct: an instance's batch takes the request at the head of each slot's queue. It
  spans slots 0..N, N the highest slot with a request; the rows of slots without one are
  null rows, READY false (the worker fills them: shoal/workers/sequence_io.py; a Python model
  gets them as null requests). A request whose input shapes differ from those of the
  lowest slot's request waits for a later batch, its row a null row. With a queue delay
  and a ``minimum_slot_utilization``, a batch waits until that share of the slots have a
  request or its oldest request has waited the delay.
* Oldest: an instance's batch takes the oldest heads of its sequences that have nothing
  running (a sequence runs one request at a time), as a dynamic batch: at once when it
  reaches the largest preferred size (default ``max_batch_size``) or the delay is 0,
  else when its oldest request has waited the delay.

An instance that dies takes the state of the sequences that ran on it: those end, and
their queued requests fail. A sequence that had only been placed in one of its slots,
nothing run, goes back to the front of the backlog, for another instance.

``TRITONSERVER_DELAY_SCHEDULER`` and ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``, Triton's test
hooks, hold the batches until that many requests are queued (shoal/broker/scheduler_hold.py).

Null rows count in the batch size a model executes (batch_stats), not in
``inference_count``. Client CUDA memory plays no part here: a sequence's requests go to
its instance, whatever GPU they were written on (a CPU instance copies through the host).
The request ``timeout`` parameter and priorities do not apply to sequence models.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from shoal.broker.scheduler_hold import NO_HOLD, HoldCounts, SchedulerHold
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, RequestError, ServingError

log = logging.getLogger("shoal.broker")

#: Where the IDs the server gives iterative sequences start (far from clients' own).
_ITERATIVE_IDS = 1 << 62

Strategy = Literal["direct", "oldest"]
CorrId = int | str


@dataclass(frozen=True)
class SequenceConfig:
    strategy: Strategy
    max_batch_size: int  # the config's (0: the model does not batch)
    slots: int  # per instance
    max_idle_us: int = 1_000_000
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0  # direct
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest
    preserve_ordering: bool = False  # oldest
    corrid_type: str = ""  # the CORRID control's: "BYTES", "UINT64"...; "" without one
    # iterative_sequence: a request without a correlation ID is a sequence of its own,
    # which its worker runs again while its model reschedules it
    iterative: bool = False


class SequenceRefused(ServingError):
    """A request the sequence batcher refuses (INVALID_ARG, in Triton's words). As core's
    sequence scheduler words them, they do not name the request."""


class CorridTypeRefused(SequenceRefused, RequestError):
    """A CORRID of the wrong type: Triton's request validation refuses it, and its words
    name the request ("[request id: ...] ")."""


@dataclass(eq=False)
class Sequence:
    corrid: CorrId
    queue: deque[tuple[m.WorkItem, float]] = field(default_factory=deque)  # (item, arrived)
    idle_since: float = 0.0  # its last arrival or its last request's end, the later
    instance: bytes | None = None  # None: in the backlog
    slot: int = -1
    closed: bool = False  # END came, or it was idle too long: nothing joins it any more
    running: bool = False  # one of its requests is executing
    ran: bool = False  # a request of it has been taken into a batch: its instance has state

    def idle(self) -> bool:
        return not (self.closed or self.queue or self.running)


def _shapes(item: m.WorkItem) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((t.name, tuple(t.shape)) for t in item.request.inputs))


class SequenceBatcher:
    def __init__(self, model: str, cfg: SequenceConfig, hold: HoldCounts = NO_HOLD) -> None:
        self.model = model
        self.cfg = cfg
        self._iterations = 0  # iterative sequences given an ID of the server's
        # TRITONSERVER_(BACKLOG_)DELAY_SCHEDULER (shoal/broker/scheduler_hold.py): Direct holds
        # every instance until the slots' and the backlog's counts are reached; Oldest,
        # Triton's dynamic batcher per instance, holds each instance on its own count.
        self._hold_counts = hold if cfg.strategy == "direct" else HoldCounts(hold.queued)
        self._hold = SchedulerHold(self._hold_counts)
        self._instance_holds: dict[bytes, SchedulerHold] = {}
        self._rows: dict[bytes, int] = {}  # of the batch last taken, by instance
        self.open: dict[CorrId, Sequence] = {}  # by correlation ID: those requests may join
        self.backlog: deque[Sequence] = deque()
        self.slots: dict[bytes, list[Sequence | None]] = {}  # per instance
        self.retired: set[bytes] = set()  # instances about to go: no new sequence there
        self.queued = 0

    def __len__(self) -> int:
        return self.queued

    def holds_work(self) -> bool:
        """Something a tick may act on: a queued request, or a sequence in a slot (its
        idle time runs)."""
        return self.queued > 0 or any(s is not None for ss in self.slots.values() for s in ss)

    def summary(self) -> m.SequenceSummary:
        in_slots = sum(s is not None for slots in self.slots.values() for s in slots)
        return m.SequenceSummary(self.cfg.strategy, self.cfg.slots, in_slots, len(self.backlog))

    # -- instances -------------------------------------------------------------------

    def add_instance(self, ident: bytes) -> None:
        """An instance that may run sequences (ready): its slots take the backlog."""
        if ident in self.slots:
            return
        self.slots[ident] = [None] * self.cfg.slots
        for slot in range(self.cfg.slots):
            self._fill(ident, slot)

    def retire(self, ident: bytes) -> None:
        """The instance is being stopped: no sequence is placed there any more."""
        if ident in self.slots:
            self.retired.add(ident)

    def remove_instance(self, ident: bytes) -> list[m.WorkItem]:
        """An instance died: the sequences that ran on it end (their state died with
        it) and their queued requests are handed back, to fail; those that never ran go
        back to the front of the backlog, for the other instances' free slots."""
        self.retired.discard(ident)
        lost: list[m.WorkItem] = []
        unplaced: list[Sequence] = []
        for seq in self.slots.pop(ident, []):
            if seq is None:
                continue
            if not seq.ran and seq.queue:
                seq.instance, seq.slot = None, -1
                unplaced.append(seq)
                continue
            lost += self._end(seq)
        self.backlog.extendleft(reversed(unplaced))
        self._fill_free()
        return lost

    def _end(self, seq: Sequence) -> list[m.WorkItem]:
        """End ``seq`` at once: its queued requests, handed back."""
        if self.open.get(seq.corrid) is seq:
            del self.open[seq.corrid]
        seq.closed = True
        gone = [item for item, _ in seq.queue]
        self.queued -= len(gone)
        seq.queue.clear()
        return gone

    # -- requests --------------------------------------------------------------------

    def enqueue(self, item: m.WorkItem, now: float) -> None:
        """Queue a request of a sequence; raises SequenceRefused."""
        req = item.request
        corrid = req.sequence_id
        model = self.model
        if req.batch_size > 1:
            raise SequenceRefused(
                Code.INVALID_ARG,
                f"inference request to model '{model}' must specify batch-size 1 due to "
                "requirements of sequence batcher",
            )
        if (corrid == 0 or corrid == "") and self.cfg.iterative:
            # Triton's IterativeSequencer: an ID of the server's, with START; here END
            # too, as the worker runs it again (shoal/workers/rescheduling.py)
            self._iterations += 1
            corrid = req.sequence_id = _ITERATIVE_IDS + self._iterations
            req.sequence_start = req.sequence_end = True
        if corrid == 0 or corrid == "":
            raise SequenceRefused(
                Code.INVALID_ARG,
                f"inference request to model '{model}' must specify a non-zero or non-empty "
                "correlation ID",
            )
        given = "BYTES" if isinstance(corrid, str) else "UINT64"
        expected = self.cfg.corrid_type
        if expected and (given == "BYTES") != (expected == "BYTES"):
            raise CorridTypeRefused(
                Code.INVALID_ARG,
                f"sequence batching control 'CORRID' data-type is '{given}', but model "
                f"'{model}' expects '{expected}'",
            )
        seq = self.open.get(corrid)
        if seq is None:
            if not req.sequence_start:
                raise SequenceRefused(
                    Code.INVALID_ARG,
                    f"inference request for sequence {corrid} to model '{model}' must specify "
                    "the START flag on the first request of the sequence",
                )
            seq = self.open[corrid] = Sequence(corrid)
            self._place(seq)
        elif req.sequence_start:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end "
                "before this sequence start. Previous sequence will be terminated early.",
                corrid, model,
            )  # fmt: skip
        seq.queue.append((item, now))
        seq.idle_since = now
        self.queued += 1
        if req.sequence_end:
            self._close(seq)

    def _place(self, seq: Sequence) -> None:
        """The free slot with the lowest number (on the instance with fewest sequences),
        else the backlog."""
        best: tuple[int, int, bytes] | None = None
        for ident, slots in self.slots.items():
            if ident in self.retired:
                continue
            free = next((i for i, s in enumerate(slots) if s is None), None)
            if free is None:
                continue
            candidate = (free, sum(s is not None for s in slots), ident)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        if best is None:
            self.backlog.append(seq)
            return
        slot, _, ident = best
        self.slots[ident][slot] = seq
        seq.instance, seq.slot = ident, slot

    def _close(self, seq: Sequence) -> None:
        """No request joins ``seq`` any more; its slot frees once its queue is empty."""
        seq.closed = True
        if self.open.get(seq.corrid) is seq:
            del self.open[seq.corrid]
        self._release_if_done(seq)

    def _release_if_done(self, seq: Sequence) -> None:
        if not seq.closed or seq.queue or seq.instance is None:
            return
        ident, slot = seq.instance, seq.slot
        slots = self.slots.get(ident)
        if slots is not None and slots[slot] is seq:
            slots[slot] = None
            self._fill(ident, slot)

    def _fill(self, ident: bytes, slot: int) -> None:
        """The oldest backlogged sequence takes the free slot."""
        if self.backlog and ident not in self.retired:
            seq = self.backlog.popleft()
            self.slots[ident][slot] = seq
            seq.instance, seq.slot = ident, slot

    def _fill_free(self) -> None:
        """Backlogged sequences into free slots, lowest first."""
        while self.backlog:
            seq = self.backlog.popleft()
            self._place(seq)
            if seq.instance is None:  # back in the backlog, at its end: put it first
                self.backlog.pop()
                self.backlog.appendleft(seq)
                return

    # -- batches ---------------------------------------------------------------------

    def _heads(self, ident: bytes) -> list[tuple[int, Sequence]]:
        """(slot, sequence) of the instance's sequences whose next request may run."""
        return [
            (i, s)
            for i, s in enumerate(self.slots.get(ident, ()))
            if s is not None and s.queue and not s.running
        ]

    def _candidates(self, ident: bytes) -> tuple[list[tuple[int, Sequence]], int]:
        """The heads a batch of the instance may take (a batch has one input shape), and
        the rows it spans. Direct, as Triton's DirectSequenceBatch: the heads of the
        lowest slot's head's shapes, by slot, the batch spanning slots 0 to the highest
        with a request (a head of another shape waits, its row a null row). Oldest: the
        heads of the oldest head's shapes, oldest first (0 rows: laid out in order)."""
        heads = self._heads(ident)
        if not heads:
            return heads, 0
        if self.cfg.strategy == "direct":
            shape = _shapes(heads[0][1].queue[0][0])
            same = [h for h in heads if _shapes(h[1].queue[0][0]) == shape]
            return same, heads[-1][0] + 1
        oldest = min(heads, key=lambda h: h[1].queue[0][1])
        shape = _shapes(oldest[1].queue[0][0])
        heads = [h for h in heads if _shapes(h[1].queue[0][0]) == shape]
        heads.sort(key=lambda h: h[1].queue[0][1])
        return heads, 0

    def _held(self, ident: bytes) -> bool:
        """Whether the scheduler hold keeps the instance from running a batch."""
        if self.cfg.strategy == "direct":
            if self._hold.released:
                return False
            in_slots = sum(len(s.queue) for ss in self.slots.values() for s in ss if s is not None)
            return self._hold.holds(in_slots, sum(len(s.queue) for s in self.backlog))
        if self._hold_counts.queued <= 0:  # no hook set: nothing to count or keep
            return False
        hold = self._instance_holds.setdefault(ident, SchedulerHold(self._hold_counts))
        if hold.released:
            return False
        return hold.holds(sum(len(s.queue) for s in self.slots.get(ident, ()) if s is not None))

    def _chosen(self, ident: bytes, now: float) -> tuple[list[tuple[int, Sequence]], int]:
        """The sequences whose head request the instance's batch takes now, and the rows
        the batch spans; ([], 0) when none is due. Direct's slot utilization and queue
        delay count every slot with a request, as Triton's do."""
        heads, rows = self._candidates(ident)
        if not heads or self._held(ident):
            return [], 0
        cfg = self.cfg
        delay = cfg.max_queue_delay_us * 1e-6
        if cfg.strategy == "direct":
            ready = self._heads(ident)
            # (as next_wakeup computes it: a wake-up at that time finds it due)
            overdue = now >= min(h[1].queue[0][1] for h in ready) + delay
            utilization = len(ready) / max(1, cfg.max_batch_size)
            if (
                delay <= 0
                or cfg.minimum_slot_utilization <= 0
                or utilization >= cfg.minimum_slot_utilization
                or overdue
            ):
                return heads, rows
            return [], 0
        overdue = now >= min(h[1].queue[0][1] for h in heads) + delay
        limit = max(1, cfg.max_batch_size)
        heads = heads[:limit]
        target = max(cfg.preferred_batch_sizes, default=limit)
        if delay <= 0 or len(heads) >= target or overdue:
            return heads, 0
        return [], 0

    def due(self, ident: bytes, now: float) -> bool:
        """Whether ``take`` would hand the instance a batch now."""
        return bool(self._chosen(ident, now)[0])

    def take(self, ident: bytes, now: float) -> list[m.WorkItem]:
        """The instance's next batch, each item's ``slot`` set (its row under Direct,
        where the batch spans ``rows(ident)``), or [] when none is due."""
        chosen, self._rows[ident] = self._chosen(ident, now)
        items: list[m.WorkItem] = []
        for slot, seq in chosen:
            item, _ = seq.queue.popleft()
            item.slot = slot
            items.append(item)
            self.queued -= 1
            seq.running = seq.ran = True
        for _, seq in chosen:
            self._release_if_done(seq)
        return items

    def rows(self, ident: bytes) -> int:
        """The rows of the batch ``take`` last handed the instance: under Direct, slots 0
        to the highest with a request, the slots without one in the batch null rows;
        else 0 (the worker lays the items out in order)."""
        return self._rows.get(ident, 0)

    def completed(self, ident: bytes, items: list[m.WorkItem], now: float) -> None:
        """The instance's batch ended: its sequences may run their next request, and
        those with none queued are idle from now."""
        slots = self.slots.get(ident)
        if slots is None:
            return
        for item in items:
            if not 0 <= item.slot < len(slots):
                continue
            seq = slots[item.slot]
            # (the slot may have a new sequence: the item's ended, and freed it)
            if seq is not None and seq.corrid == item.request.sequence_id and seq.running:
                seq.running = False
                seq.idle_since = max(seq.idle_since, now)

    # -- time ------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Close the sequences in slots that have been idle for the limit."""
        limit = self.cfg.max_idle_us * 1e-6
        for ident, slots in self.slots.items():
            for seq in slots:
                if seq is not None and seq.idle() and now >= seq.idle_since + limit:
                    log.debug(
                        "sequence %s of model '%s' idle longer than %d us: its slot %d on "
                        "instance %r is released", seq.corrid, self.model,
                        self.cfg.max_idle_us, seq.slot, ident,
                    )  # fmt: skip
                    self._close(seq)

    def next_wakeup(self, idle: list[bytes]) -> float | None:
        """When ``expire`` or ``take`` (for the ``idle`` instances) next has work."""
        times: list[float] = []
        limit = self.cfg.max_idle_us * 1e-6
        for slots in self.slots.values():
            times += [s.idle_since + limit for s in slots if s is not None and s.idle()]
        if times:  # on a 10 ms grid: a stream of answers, each moving the time a little,
            # re-arms the broker's timer once per 10 ms, not once per answer
            times = [math.ceil(min(times) * 100) / 100]
        delay = self.cfg.max_queue_delay_us * 1e-6
        if delay > 0:
            for ident in idle:
                heads = self._heads(ident)
                if heads and not self._held(ident):
                    times.append(min(h[1].queue[0][1] for h in heads) + delay)
        return min(times) if times else None

    # -- removal ---------------------------------------------------------------------

    def _sequences(self) -> Iterator[Sequence]:
        for slots in self.slots.values():
            yield from (s for s in slots if s is not None)
        yield from self.backlog

    def remove(self, match: Callable[[m.WorkItem], bool]) -> list[m.WorkItem]:
        """Take out the queued requests ``match`` accepts (cancelled, their frontend
        gone), each with its whole sequence, as Triton cancels a sequence: its other
        queued requests are handed back too, and its slot frees."""
        gone: list[m.WorkItem] = []
        ended = [seq for seq in self._sequences() if any(match(item) for item, _ in seq.queue)]
        for seq in ended:
            gone += self._end(seq)
            if seq.instance is None:
                self.backlog.remove(seq)
            else:
                self._release_if_done(seq)
        return gone

    def drain(self) -> list[m.WorkItem]:
        """Every queued request, handed back; every sequence ends."""
        items = [item for seq in self._sequences() for item, _ in seq.queue]
        self.open.clear()
        self.backlog.clear()
        self.slots = {ident: [None] * len(s) for ident, s in self.slots.items()}
        self.queued = 0
        return items
