"""Triton's dynamic batcher and queue policies, as a pure class (no sockets, no clock).

The caller passes ``now`` (seconds, monotonic) into every method, so tests drive it with
a fake clock. One ``DynamicBatcher`` per model version:

* ``enqueue`` admits a request into its priority level's queue, or refuses it
  ("Exceeds maximum queue size").
* ``take_batch`` forms the next batch for an idle instance the way Triton's
  ``GetDynamicBatch`` does. It walks the queue in scheduling order and stops at the
  first request that cannot join: one that would pass ``max_batch_size``, or whose
  non-batch shapes differ from the batch's (inputs that allow ragged batching are
  exempt); such a request means the batch can grow no more, so it goes at once.
  Otherwise a batch goes at once when it makes a preferred size (the largest one
  reachable), when it reaches the largest preferred size (``max_batch_size`` when none
  is configured), when the delay is 0, or once its oldest request has waited
  ``max_queue_delay``; else nothing, and ``next_wakeup`` says when to ask again. Once
  the delay has run out, a batch takes everything that fits, preferred size or not.
  ``take_batches`` does the same for several idle instances at once and, where Triton
  would leave all but one idle, shares a batch that goes before it is full among them.
* ``expire`` hands back the requests whose queue timeout passed under REJECT. Under DELAY
  they move to their level's delayed queue, behind every request that has not timed out,
  later arrivals included (Triton's ``delayed_queue_``), when the walk that forms a batch
  reaches them, as Triton's ApplyPolicyAtCursor does: a later request with a shorter
  ``timeout`` does not overtake an earlier one that timed out while every instance was
  busy, and one past the batch being formed keeps its place until a walk reaches it.

Scheduling order: priority level 1 first; within a level, arrival order, delayed last.

Client CUDA memory: a request whose tensors lie in CUDA shared memory can run only on an
instance of that GPU, or on a CPU instance (which copies through the host). ``take_batch``
and ``next_wakeup`` take the GPU of the instance asking (``None``: one that serves any
request); requests it cannot serve are passed over, as if not queued, so that each GPU's
instances take their own clients' requests while another GPU is busy. Passed-over
requests still count towards ``max_queue_size``, and each batch formed walks past them.
With ``preserve_ordering`` nothing is passed over: a batch ends at the first request the
instance cannot serve, so requests are still dispatched (and answered) in scheduling
order. Requests that reference no CUDA memory (nearly all) pass for every instance, and
while none of the other kind is queued (``cuda_queued``) no filtering is done at all.

A level's queues exist only while it holds a request (Triton's ``PriorityQueue`` creates a
level on its first request and erases it once empty), so ``priority_levels`` may be any
uint64 and costs nothing until used; batch formation walks only the non-empty levels.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from shoal.broker.scheduler_hold import NO_HOLD, HoldCounts, SchedulerHold
from shoal.ipc import messages as m

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
    # A batch is shared among idle instances only in parts each expected to take this much
    # compute (µs) off the others, judged by the executions seen so far (see _share);
    # 0: whenever instances are idle; -1: never (Triton's batching).
    share_min_compute_us: int = 1000


def cuda_devices(regions: list[m.ClientRegion]) -> frozenset[int]:
    """The GPUs whose memory a request's client regions (CUDA shared memory) are in."""
    if not regions:
        return frozenset()
    return frozenset(r.device_id for r in regions if r.kind == "cuda")


def serves(gpu: int | None, devices: frozenset[int]) -> bool:
    """Whether an instance on ``gpu`` (None: on the CPU) can run a request whose tensors
    lie in the memory of ``devices``: a GPU instance sees its own GPU alone; a CPU
    instance copies through the host."""
    return not devices or gpu is None or (len(devices) == 1 and gpu in devices)


@dataclass(eq=False)  # identity: a queue removes exactly this request
class Pending:
    item: m.WorkItem
    arrived: float
    deadline: float | None  # queue timeout, absolute; None once delayed
    signature: tuple[tuple[str, tuple[int, ...]], ...]
    size: int
    level: int
    devices: frozenset[int] = frozenset()  # cuda_devices(item.regions)
    queued: bool = True  # False once it left the queue (a batch, a rejection, a drop)


def _cut(chosen: list[Pending], total: int, parts: int, least: int) -> list[list[Pending]]:
    """``chosen`` (``total`` samples) cut in order into as many parts as it can, at most
    ``parts`` (<= len(chosen)), each of at least ``least`` samples: for each count from
    ``parts`` down, the cut at the request boundaries nearest the even shares (a request
    is never cut), the first whose parts are all large enough."""
    ends = list(itertools.accumulate(p.size for p in chosen))  # samples through each
    for k in range(parts, 1, -1):
        cuts: list[int] = []  # a part ends after chosen[i]
        for j in range(1, k):
            lo = cuts[-1] + 1 if cuts else 0
            hi = len(chosen) - (k - j) - 1  # a request left for each part still to come
            even = j * total / k
            cuts.append(min(range(lo, hi + 1), key=lambda i: abs(ends[i] - even)))
        bounds = [-1, *cuts, len(chosen) - 1]
        if all(
            ends[b] - (ends[a] if a >= 0 else 0) >= least for a, b in itertools.pairwise(bounds)
        ):
            return [chosen[a + 1 : b + 1] for a, b in itertools.pairwise(bounds)]
    return [chosen]


class _Cost:
    """What one more sample adds to an execution of this version (ns): the slope of
    compute time over batch size, fitted by least squares with recent executions weighing
    most. A fixed cost per execution (large on a GPU) is what sharing a batch cannot
    divide, so the slope, not the mean, says what a part takes off the others. Until
    executions of clearly different sizes have been seen, the mean per sample stands in."""

    DECAY = 0.9  # each execution's weight, against the one after it

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, samples: int, ns: int) -> None:
        d = self.DECAY
        self.w = d * self.w + 1
        self.x = d * self.x + samples
        self.y = d * self.y + ns
        self.xx = d * self.xx + samples * samples
        self.xy = d * self.xy + samples * ns

    def per_sample(self) -> float:
        if not self.x:
            return 0.0
        mean = self.y / self.x
        spread = self.w * self.xx - self.x * self.x
        # Sizes too alike (one size, or one odd execution among many of another) make
        # the slope a difference of noise: the mean stands in.
        if spread <= 0.01 * self.w * self.xx:
            return mean
        slope = (self.w * self.xy - self.x * self.y) / spread
        return min(max(slope, 0.0), mean)


class Rejected(Exception):
    """A request the batcher refuses; ``message`` is Triton's wording."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class _Level:
    policy: QueuePolicy
    queue: deque[Pending] = field(default_factory=deque)  # not timed out, arrival order
    delayed: deque[Pending] = field(default_factory=deque)  # timed out under DELAY

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


@dataclass
class _Formed:
    """The batch ``take_batch`` would send: its requests in order and whether to go now."""

    chosen: list[Pending]
    best: int  # how many of `chosen` make the best batch (a preferred size); 0: none
    full: bool  # the next request cannot join: the batch can grow no more
    total: int  # samples in `chosen`


class DynamicBatcher:
    def __init__(self, config: BatcherConfig, hold: HoldCounts = NO_HOLD) -> None:
        self.c = config
        # TRITONSERVER_DELAY_SCHEDULER: no batch until that many requests are queued
        self._hold = SchedulerHold(hold)
        self._level_count = max(config.priority_levels, 1)
        self._levels: dict[int, _Level] = {}  # by index (priority - 1); only non-empty ones
        self._active: list[int] = []  # the keys of _levels, ascending: scheduling order
        self._preferred = frozenset(config.preferred_batch_sizes)
        self._max_preferred = max(config.preferred_batch_sizes, default=config.max_batch_size)
        # No size preferred but a full batch (the [max_batch_size] Triton's normalization
        # fills in for an empty preferred_batch_size): a batch that goes before it is full
        # may be shared among idle instances.
        self._shareable = all(n >= config.max_batch_size for n in self._preferred)
        self._cost = _Cost()  # of the executions reported (observe)
        # Queue timeouts, heaps by action (stale entries skipped): a REJECT one is acted on
        # when it passes, a DELAY one when a batch is next formed.
        self._reject_at: list[tuple[float, int, Pending]] = []
        self._delay_at: list[tuple[float, int, Pending]] = []
        self._tiebreak = itertools.count()
        self._rejected: list[m.WorkItem] = []  # timed out under REJECT, for the next expire
        self.cuda_queued = 0  # queued requests in client CUDA memory (Pending.devices)

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def holds_work(self) -> bool:
        """Whether ``expire`` or ``take_batch`` may still have something to hand back: a
        queued request, or a rejection not handed back yet."""
        return bool(self._levels) or bool(self._rejected)

    # -- admission -------------------------------------------------------------------

    def _level(self, priority: int) -> int:
        """Queue index for a request's ``priority``: 0 or a level that does not exist
        means the default level (as Triton's SetPriority)."""
        if self._level_count == 1:
            return 0
        if 1 <= priority <= self._level_count:
            return priority - 1
        return (self.c.default_priority_level or self._level_count) - 1

    def _policy(self, index: int) -> QueuePolicy:
        if not self.c.priority_levels:  # one level: Triton uses the default policy alone
            return self.c.default_policy
        return self.c.priority_policies.get(index + 1, self.c.default_policy)

    def enqueue(self, item: m.WorkItem, now: float) -> None:
        req = item.request
        index = self._level(req.priority)
        level = self._levels.get(index)
        policy = self._policy(index) if level is None else level.policy
        if policy.max_queue_size and level is not None and len(level) >= policy.max_queue_size:
            raise Rejected(QUEUE_FULL)
        timeout_us = policy.default_timeout_us
        # A request may only shorten the default timeout; with no default (0) it has none.
        if policy.allow_timeout_override and 0 < req.timeout_us < timeout_us:
            timeout_us = req.timeout_us
        deadline = now + timeout_us / 1e6 if timeout_us else None
        # By input name: the order a client lists its inputs in does not matter.
        signature = tuple(
            sorted(
                (t.name, tuple(t.shape[1:]))
                for t in req.inputs
                if t.name not in self.c.ragged_inputs
            )
        )
        size = max(req.batch_size, 1)
        p = Pending(item, now, deadline, signature, size, index, cuda_devices(item.regions))
        if level is None:
            level = self._levels[index] = _Level(policy)
            bisect.insort(self._active, index)
        level.queue.append(p)
        if p.devices:
            self.cuda_queued += 1
        if deadline is not None:
            heap = self._reject_at if policy.timeout_action == "REJECT" else self._delay_at
            heapq.heappush(heap, (deadline, next(self._tiebreak), p))
            if len(heap) > 2 * len(self) + 64:
                self._compact_deadlines()

    def _drop_empty(self, touched: Iterable[int]) -> None:
        """Forget the levels among ``touched`` (indices) that no longer hold a request."""
        emptied = {index for index in touched if len(self._levels[index]) == 0}
        for index in emptied:
            del self._levels[index]
        if len(emptied) == 1:
            (index,) = emptied
            del self._active[bisect.bisect_left(self._active, index)]
        elif emptied:  # one pass, not one list deletion per level
            self._active = [index for index in self._active if index not in emptied]

    # -- timeouts --------------------------------------------------------------------

    def expire(self, now: float) -> list[m.WorkItem]:
        """Requests whose queue timeout passed with action REJECT (answer them with
        TIMEOUT_EXPIRED)."""
        self._reject_expired(now)
        rejected, self._rejected = self._rejected, []
        return rejected

    def _compact_deadlines(self) -> None:
        """Drop the entries of requests that left the queue. They go lazily, when they
        reach the top; a long timeout at the top would keep every later one (and its
        request) alive until it runs out."""
        for heap in (self._reject_at, self._delay_at):
            heap[:] = [e for e in heap if e[2].queued and e[2].deadline is not None]
            heapq.heapify(heap)

    def _reject_expired(self, now: float) -> None:
        """Reject the requests whose REJECT timeout passed by ``now``, however deep in
        the queue (as Triton's RejectTimeoutRequests)."""
        heap, expired = self._reject_at, []
        while heap and (heap[0][0] <= now or not heap[0][2].queued):
            deadline, _, p = heapq.heappop(heap)
            if p.queued and deadline <= now:  # else it left the queue before its timeout
                expired.append(p)
        for p in expired:
            self._levels[p.level].queue.remove(p)  # linear, but only for a timed-out one
            self._left(p)
            self._rejected.append(p.item)
        self._drop_empty({p.level for p in expired})

    # -- batch formation -------------------------------------------------------------

    def _left(self, p: Pending) -> None:
        """``p`` is no longer queued (batched, rejected or dropped)."""
        p.queued = False
        if p.devices:
            self.cuda_queued -= 1

    def _walk(self, now: float | None = None) -> Iterator[Pending]:
        """Queued requests in scheduling order: priority, then arrival (delayed last).
        With ``now``, the DELAY requests it finds timed out by then move to their level's
        delayed queue as it reaches them: Triton's ApplyPolicyAtCursor, which looks only
        as far as the batch being formed."""
        for index in self._active:
            level = self._levels[index]
            queue, i = level.queue, 0
            moves_by = now if level.policy.timeout_action == "DELAY" else None
            while i < len(queue):
                p = queue[i]
                if moves_by is not None and p.deadline is not None and p.deadline <= moves_by:
                    del queue[i]
                    p.deadline = None
                    level.delayed.append(p)
                    continue
                yield p
                i += 1
            yield from level.delayed

    def _form(self, gpu: int | None = None, now: float | None = None) -> _Formed:
        """The batch for an instance on ``gpu``, from the requests it can serve; with
        ``now``, to send (timed-out DELAY requests it walks past move behind)."""
        chosen: list[Pending] = []
        total = best = 0
        full = False
        for p in self._walk(now):
            if p.devices and not serves(gpu, p.devices):
                if self.c.preserve_ordering:
                    full = True  # dispatch order must stay scheduling order
                    break
                continue
            if chosen:
                if total + p.size > self._max_preferred and not best:
                    best = len(chosen)  # past every preferred size: what we have is best
                if total + p.size > self.c.max_batch_size or p.signature != chosen[0].signature:
                    full = True
                    break
            chosen.append(p)
            total += p.size
            if total in self._preferred:
                best = len(chosen)
        return _Formed(chosen, best, full, total)

    def take_batch(self, now: float, gpu: int | None = None) -> list[m.WorkItem]:
        """The batch to run now on an idle instance on ``gpu`` (None: a CPU instance), or
        [] to wait (see next_wakeup)."""
        batches = self.take_batches(now, gpu)
        return batches[0] if batches else []

    def take_batches(
        self, now: float, gpu: int | None = None, share: int = 1
    ) -> list[list[m.WorkItem]]:
        """The batches to run now on ``share`` idle instances (on ``gpu``; None: CPU
        ones), or [] to wait. One batch, as Triton forms it, unless it goes before it is
        full (its queue delay ran out, or the delay is 0), the model prefers no size but
        a full batch, and its executions so far say the parts would be worth their hops
        (``_share``): then it is shared among the idle instances, in parts of about equal
        samples, in scheduling order. Triton gives it all to one instance and leaves the
        others idle until more requests come; a burst then runs on one core (or GPU)
        while the rest of the model's instances wait."""
        f = self._walk_to(now, gpu)
        verdict = self._verdict(f, now)
        if verdict == "best":
            return [self._pop(f.chosen[: f.best])]
        if verdict == "all":
            return [self._pop(f.chosen)]
        if verdict == "share":
            return [self._pop(part) for part in self._share(f, share)]
        return []

    def due(self, now: float, gpu: int | None = None) -> bool:
        """Whether ``take_batch(now, gpu)`` would hand back a batch; takes nothing but
        what that walk moves, as it does (timed-out requests)."""
        return self._verdict(self._walk_to(now, gpu), now) != "wait"

    def _walk_to(self, now: float, gpu: int | None) -> _Formed:
        """The batch for ``gpu`` at ``now``, after rejecting the requests whose REJECT
        timeout passed and moving those whose DELAY timeout passed that the walk meets."""
        self._reject_expired(now)
        f = self._form(gpu, now)
        # DELAY timeouts passed by now: this walk moved those it reached, and the next
        # walk (an arrival, a finished batch) moves the rest. Waking for them again would
        # spin: with preserve_ordering a walk may stop short of them while an instance
        # that cannot take the head of the queue stays idle.
        while self._delay_at and self._delay_at[0][0] <= now:
            heapq.heappop(self._delay_at)
        return f

    def _verdict(self, f: _Formed, now: float) -> Literal["best", "all", "share", "wait"]:
        """What goes now of the batch ``f``: its best part (a preferred size), all of it,
        all of it shared among idle instances, or nothing yet."""
        # (the queue is counted only while a test hook holds it: not per batch otherwise)
        if not f.chosen or (not self._hold.released and self._hold.holds(len(self))):
            return "wait"
        delay = self.c.max_queue_delay_us / 1e6
        # The same sum next_wakeup returns, so waking at that time always finds it due.
        exceeded = delay > 0 and now >= min(p.arrived for p in f.chosen) + delay
        if f.best and not exceeded:
            return "best"
        if f.full or f.total >= self._max_preferred:
            return "all"
        if exceeded or delay == 0:
            return "share"
        return "wait"

    def _share(self, f: _Formed, share: int) -> list[list[Pending]]:
        """``f``, which goes short of full, as the batches of up to ``share`` idle
        instances. Each part must be expected to take at least ``share_min_compute_us``
        of compute off the others (by ``_Cost``): a part costs an execution's hops (the
        broker, the worker, their sockets: about 100 µs of CPU) whatever it computes.
        -1 never shares; 0 shares whenever instances are idle."""
        least_us = self.c.share_min_compute_us
        if share < 2 or not self._shareable or least_us < 0 or len(f.chosen) < 2:
            return [f.chosen]
        least = 1
        if least_us:
            per_sample = self._cost.per_sample()
            if per_sample < 1:  # nothing known yet, or under a nanosecond a sample
                return [f.chosen]
            least = max(1, math.ceil(least_us * 1000 / per_sample))
        parts = min(share, f.total // least, len(f.chosen))
        return _cut(f.chosen, f.total, parts, least) if parts > 1 else [f.chosen]

    def observe(self, samples: int, compute_ns: int) -> None:
        """An execution of ``samples`` that all succeeded took ``compute_ns`` (input,
        infer and output)."""
        if samples > 0:
            self._cost.add(samples, compute_ns)

    def next_wakeup(self, idle: Iterable[int | None] = (None,)) -> float | None:
        """When the caller must next ask (absolute), if ever: a queued request's timeout
        runs out, or the queue delay of a batch ``take_batch`` would form for one of the
        ``idle`` instances (their GPUs, None for a CPU one) does. While every instance is
        busy (``idle`` empty) a delay that ran out changes nothing: the next batch forms
        when an instance reports done, so waking for it would only spin."""
        times: list[float] = []
        # A held queue forms no batch: only its REJECT timeouts may need the caller.
        gpus = set(idle) if self._hold.released else set()
        # A DELAY timeout matters once a batch can form: while every instance is busy,
        # waking for one that passed would only spin.
        for heap in (self._reject_at, self._delay_at) if gpus else (self._reject_at,):
            while heap and (not heap[0][2].queued or heap[0][2].deadline is None):
                heapq.heappop(heap)  # gone, or delayed already
            if heap:
                times.append(heap[0][0])
        if self.c.max_queue_delay_us and gpus:
            if not self.cuda_queued:
                gpus = {None}  # every instance would form the same batch
            for gpu in gpus:
                chosen = self._form(gpu).chosen
                if chosen:
                    oldest = min(p.arrived for p in chosen)
                    times.append(oldest + self.c.max_queue_delay_us / 1e6)
        return min(times) if times else None

    def _pop(self, chosen: list[Pending]) -> list[m.WorkItem]:
        """Remove ``chosen``, in scheduling order, from the queues: each is at the head of
        its queue, unless requests the instance could not serve were passed over."""
        for p in chosen:
            level = self._levels[p.level]
            if level.queue and level.queue[0] is p:
                level.queue.popleft()
            elif level.delayed and level.delayed[0] is p:
                level.delayed.popleft()
            elif p in level.queue:  # by identity (eq=False)
                level.queue.remove(p)
            else:
                level.delayed.remove(p)
            self._left(p)
        self._drop_empty({p.level for p in chosen})
        return [p.item for p in chosen]

    def drain(self) -> list[m.WorkItem]:
        """Remove and return everything queued (the version lost its last instance),
        rejected requests not yet handed out included."""
        items = self._rejected + [p.item for p in self._walk()]
        self._rejected = []
        for p in self._walk():
            p.queued = False
        self.cuda_queued = 0
        self._levels.clear()
        self._active.clear()
        return items

    def remove(self, match: Callable[[m.WorkItem], bool]) -> list[m.WorkItem]:
        """Take out every queued request ``match`` selects (a frontend that exited, a
        request its client gave up on), rejected ones not yet handed out included."""
        removed = [it for it in self._rejected if match(it)]
        self._rejected = [it for it in self._rejected if not match(it)]
        touched: list[int] = []
        for index in self._active:
            level = self._levels[index]
            for name in ("queue", "delayed"):
                queue: deque[Pending] = getattr(level, name)
                gone = [p for p in queue if match(p.item)]
                if gone:
                    for p in gone:
                        self._left(p)
                    removed += [p.item for p in gone]
                    setattr(level, name, deque(p for p in queue if p.queued))
                    touched.append(index)
        self._drop_empty(touched)
        return removed
