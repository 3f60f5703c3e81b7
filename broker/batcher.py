"""Triton's dynamic batcher and queue policies, as a pure class (no sockets, no clock).

The caller passes ``now`` (seconds, monotonic) into every method, so tests drive it with
a fake clock. One ``DynamicBatcher`` per model version:

* ``enqueue`` admits a request into its priority level's queue, or refuses it
  ("Exceeds maximum queue size").
* ``take_batch`` forms the next batch for an idle instance: at once when the queued
  requests add up to a preferred size (the largest one reachable) or else to
  ``max_batch_size``; otherwise once the oldest request has waited ``max_queue_delay``;
  otherwise nothing, and ``next_wakeup`` says when to ask again.
* ``expire`` removes requests whose queue timeout passed (REJECT) or demotes them behind
  the others (DELAY).

Requests join a batch only if their non-batch shapes match (inputs that allow ragged
batching are exempt), and a batch never exceeds ``max_batch_size``. Priority level 1 is
the highest; within a level, arrival order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from ipc import messages as m

TimeoutAction = Literal["REJECT", "DELAY"]

QUEUE_FULL = "Exceeds maximum queue size"
TIMEOUT_EXPIRED = "Request timeout expired"


@dataclass(frozen=True)
class QueuePolicy:
    timeout_action: TimeoutAction = "REJECT"
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unlimited


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0  # 0: one level
    default_priority_level: int = 0
    default_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_policies: dict[int, QueuePolicy] = field(default_factory=dict)
    ragged_inputs: frozenset[str] = frozenset()


@dataclass
class Pending:
    item: m.WorkItem
    arrived: float
    deadline: float | None  # queue timeout, absolute
    signature: tuple[tuple[str, tuple[int, ...]], ...]
    size: int
    delayed: bool = False


class Rejected(Exception):
    """A request the batcher refuses; ``message`` is Triton's wording."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DynamicBatcher:
    def __init__(self, config: BatcherConfig) -> None:
        self.c = config
        self.levels = max(config.priority_levels, 1)
        self.queues: list[deque[Pending]] = [deque() for _ in range(self.levels)]

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)

    # -- admission -------------------------------------------------------------------

    def _level(self, priority: int) -> int:
        """Queue index for a request's ``priority``: 0 or a level that does not exist
        means the default level (as Triton's SetPriority)."""
        if self.levels == 1:
            return 0
        if 1 <= priority <= self.levels:
            return priority - 1
        return (self.c.default_priority_level or self.levels) - 1

    def _policy(self, index: int) -> QueuePolicy:
        return self.c.priority_policies.get(index + 1, self.c.default_policy)

    def enqueue(self, item: m.WorkItem, now: float) -> None:
        req = item.request
        index = self._level(req.priority)
        policy = self._policy(index)
        queue = self.queues[index]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            raise Rejected(QUEUE_FULL)
        timeout_us = policy.default_timeout_us
        # A request may shorten the default timeout, never lengthen it (0 = none).
        shorter = req.timeout_us and (not timeout_us or req.timeout_us < timeout_us)
        if policy.allow_timeout_override and shorter:
            timeout_us = req.timeout_us
        deadline = now + timeout_us / 1e6 if timeout_us else None
        signature = tuple(
            (t.name, tuple(t.shape[1:])) for t in req.inputs if t.name not in self.c.ragged_inputs
        )
        queue.append(Pending(item, now, deadline, signature, max(req.batch_size, 1)))

    # -- timeouts --------------------------------------------------------------------

    def expire(self, now: float) -> list[m.WorkItem]:
        """Requests whose queue timeout passed with action REJECT (answer them with
        TIMEOUT_EXPIRED). DELAY requests move behind the others of their level."""
        rejected: list[m.WorkItem] = []
        for index, queue in enumerate(self.queues):
            policy = self._policy(index)
            if not any(p.deadline is not None and p.deadline <= now for p in queue):
                continue
            keep: deque[Pending] = deque()
            late: list[Pending] = []
            for p in queue:
                if p.deadline is not None and p.deadline <= now and not p.delayed:
                    if policy.timeout_action == "REJECT":
                        rejected.append(p.item)
                    else:
                        p.delayed = True
                        late.append(p)
                else:
                    keep.append(p)
            keep.extend(late)
            self.queues[index] = keep
        return rejected

    # -- batch formation -------------------------------------------------------------

    def _candidates(self) -> list[Pending]:
        """Queued requests in scheduling order: priority, then arrival (delayed last)."""
        return [p for q in self.queues for p in q]

    def take_batch(self, now: float) -> list[m.WorkItem]:
        """The batch to run now on an idle instance, or [] to wait (see next_wakeup)."""
        order = self._candidates()
        if not order:
            return []
        head = order[0]
        chosen: list[Pending] = []
        total = 0
        best_preferred = 0  # how many of `chosen` make the largest preferred size
        for p in order:
            if p.signature != head.signature:
                continue
            if total + p.size > self.c.max_batch_size:
                break
            chosen.append(p)
            total += p.size
            if total in self.c.preferred_batch_sizes:
                best_preferred = len(chosen)
            if total == self.c.max_batch_size:
                break
        # A reachable preferred size wins over a full batch (Triton's QA: 12 requests,
        # max 8, preferred 6 -> two batches of 6).
        if best_preferred:
            return self._pop(chosen[:best_preferred])
        if total == self.c.max_batch_size:
            return self._pop(chosen)
        if self.c.max_queue_delay_us == 0 or now - head.arrived >= self.c.max_queue_delay_us / 1e6:
            return self._pop(chosen)
        return []

    def next_wakeup(self, can_dispatch: bool = True) -> float | None:
        """When the caller must next ask (absolute), if ever: a queued request's timeout
        runs out, or, when an instance could take a batch (``can_dispatch``), the oldest
        request's queue delay does. While every instance is busy a delay that ran out
        changes nothing: the next batch forms when an instance reports done, so waking
        for it would only spin."""
        times = [
            p.deadline for q in self.queues for p in q if p.deadline is not None and not p.delayed
        ]
        if can_dispatch and self.c.max_queue_delay_us:
            head = next((p for q in self.queues for p in q), None)
            if head is not None:
                times.append(head.arrived + self.c.max_queue_delay_us / 1e6)
        return min(times) if times else None

    def _pop(self, chosen: list[Pending]) -> list[m.WorkItem]:
        ids = {id(p) for p in chosen}
        for index, queue in enumerate(self.queues):
            if any(id(p) in ids for p in queue):
                self.queues[index] = deque(p for p in queue if id(p) not in ids)
        return [p.item for p in chosen]

    def drain(self) -> list[m.WorkItem]:
        """Remove and return everything queued (the version lost its last instance)."""
        items = [p.item for p in self._candidates()]
        for q in self.queues:
            q.clear()
        return items

    def drop_frontend(self, frontend: bytes) -> list[m.WorkItem]:
        dropped: list[m.WorkItem] = []
        for index, queue in enumerate(self.queues):
            dropped += [p.item for p in queue if p.item.frontend == frontend]
            self.queues[index] = deque(p for p in queue if p.item.frontend != frontend)
        return dropped
