"""The dynamic batcher against a model of Triton's, on random traffic (a fake clock).

``TritonModel`` restates, as plainly as possible, what Triton's core does
(src/dynamic_batch_scheduler.cc GetDynamicBatch, src/scheduler_utils.cc PriorityQueue):
levels by priority, a request's timeout (its level's default, shortened by the request's
when the policy allows), admission against max_queue_size, and batch formation as one
walk from the head of the queue that applies the timeout policy to each request as it
reaches it (ApplyPolicyAtCursor): DELAY moves it behind, REJECT drops it. While the
instance is busy, Triton rejects the timed-out REJECT requests only (RejectTimeoutRequests).

One instance, random configurations, arrivals, sizes, shapes, priorities and timeouts:
every admission and every batch must agree. Timeouts are drawn in whole 100 µs steps with
arrivals jittered inside a step, so no deadline falls on a tick, where ``<`` and ``<=``
would differ.

The same random traffic, with client CUDA memory on two GPUs and preserve_ordering, also
checks that next_wakeup never makes the broker turn for nothing (a spin).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from shoal.broker.batcher import BatcherConfig, DynamicBatcher, QueuePolicy, Rejected
from shoal.ipc import messages as m


@dataclass
class _Entry:
    item: m.WorkItem
    arrived: float
    deadline: float  # 0: none


@dataclass
class _Level:
    policy: QueuePolicy
    queue: list[_Entry] = field(default_factory=list)
    delayed: list[_Entry] = field(default_factory=list)


def _signature(item: m.WorkItem) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((t.name, tuple(t.shape[1:])) for t in item.request.inputs))


class TritonModel:
    def __init__(self, c: BatcherConfig) -> None:
        self.c = c
        self.levels: dict[int, _Level] = {}
        self.rejected: list[m.WorkItem] = []
        self.max_preferred = max(c.preferred_batch_sizes, default=c.max_batch_size)

    def _priority(self, p: int) -> int:
        if not self.c.priority_levels:
            return 0
        return self.c.default_priority_level if p == 0 or p > self.c.priority_levels else p

    def _policy(self, level: int) -> QueuePolicy:
        if not self.c.priority_levels:
            return self.c.default_policy
        return self.c.priority_policies.get(level, self.c.default_policy)

    def enqueue(self, item: m.WorkItem, now: float) -> None:
        index = self._priority(item.request.priority)
        level = self.levels.get(index) or _Level(self._policy(index))
        policy = level.policy
        if policy.max_queue_size and len(level.queue) + len(level.delayed) >= policy.max_queue_size:
            raise Rejected("Exceeds maximum queue size")
        timeout = policy.default_timeout_us
        asked = item.request.timeout_us
        if policy.allow_timeout_override and 0 < asked < timeout:
            timeout = asked
        self.levels[index] = level
        level.queue.append(_Entry(item, now, now + timeout / 1e6 if timeout else 0.0))

    def reject_timeouts(self, now: float) -> None:
        for level in self.levels.values():
            if level.policy.timeout_action == "REJECT":
                for e in [e for e in level.queue if e.deadline and now > e.deadline]:
                    level.queue.remove(e)
                    self.rejected.append(e.item)
        self._drop_empty()

    def _drop_empty(self) -> None:
        for index in [i for i, lv in self.levels.items() if not lv.queue and not lv.delayed]:
            del self.levels[index]

    def _walk(self, now: float) -> Iterator[_Entry]:
        for index in sorted(self.levels):
            level = self.levels[index]
            i = 0
            while True:
                while i < len(level.queue) and level.queue[i].deadline:
                    if now <= level.queue[i].deadline:
                        break
                    e = level.queue.pop(i)
                    if level.policy.timeout_action == "DELAY":
                        level.delayed.append(_Entry(e.item, e.arrived, 0.0))
                    else:
                        self.rejected.append(e.item)
                if i >= len(level.queue):
                    break
                yield level.queue[i]
                i += 1
            yield from list(level.delayed)

    def take(self, now: float) -> list[m.WorkItem]:
        chosen: list[_Entry] = []
        pending = best = 0
        send_now = False
        for e in self._walk(now):
            size = max(e.item.request.batch_size, 1)
            if chosen:
                if pending + size > self.max_preferred and not best:
                    best = len(chosen)
                if pending + size > self.c.max_batch_size or _signature(e.item) != _signature(
                    chosen[0].item
                ):
                    send_now = True
                    break
            chosen.append(e)
            pending += size
            if pending in self.c.preferred_batch_sizes:
                best = len(chosen)
        self._drop_empty()
        if not chosen:
            return []
        delay = self.c.max_queue_delay_us / 1e6
        exceeded = delay != 0 and now - min(e.arrived for e in chosen) >= delay
        if best and not exceeded:
            out = chosen[:best]
        elif send_now or pending >= self.max_preferred or exceeded or delay == 0:
            out = chosen
        else:
            return []
        for e in out:
            for level in self.levels.values():
                for queue in (level.queue, level.delayed):
                    if e in queue:
                        queue.remove(e)
        self._drop_empty()
        return [e.item for e in out]


def _config(r: random.Random) -> BatcherConfig:
    mbs = r.choice([1, 2, 4, 8])
    preferred = tuple(sorted(r.sample(range(1, mbs + 1), r.randint(1, min(3, mbs)))))
    levels = r.choice([0, 0, 2, 3])

    def policy() -> QueuePolicy:
        return QueuePolicy(
            r.choice(["REJECT", "DELAY"]),
            r.choice([0, 0, 3000, 10000]),
            r.random() < 0.5,
            r.choice([0, 0, 3, 6]),
        )

    return BatcherConfig(
        mbs,
        preferred,
        r.choice([0, 0, 2000, 5000]),
        False,
        levels,
        r.randint(1, levels) if levels else 0,
        policy(),
        {k: policy() for k in range(1, levels + 1) if r.random() < 0.5},
    )


def _ids(items: list[m.WorkItem]) -> list[int]:
    return [it.request.req_id for it in items]


@pytest.mark.parametrize("seed", range(300))
def test_batches_and_admissions_agree_with_triton_s(seed: int) -> None:
    r = random.Random(seed)
    c = _config(r)
    shoal, triton = DynamicBatcher(c), TritonModel(c)
    busy_until, req_id = 0.0, 0
    for step in range(3000):
        now = step * 1e-4 + r.random() * 1e-5
        if r.random() < 0.08:
            req_id += 1
            size = r.randint(1, c.max_batch_size)
            shape = [size, r.choice([4, 4, 4, 7])]
            req = m.InferRequest(
                req_id, "m", 1, [m.TensorRef("IN", "FP32", shape, 4)], [],
                batch_size=size, priority=r.choice([0, 1, 2, 3]),
                timeout_us=r.choice([0, 0, 1000, 20000]),
            )  # fmt: skip
            item = m.WorkItem(b"f", req)
            answers = []
            for batcher in (shoal, triton):
                try:
                    batcher.enqueue(item, now)
                    answers.append("queued")
                except Rejected:
                    answers.append("full")
            assert answers[0] == answers[1], f"t={now:.4f} request {req_id}"
        shoal.expire(now)
        if now < busy_until:
            triton.reject_timeouts(now)
            continue
        got, want = _ids(shoal.take_batch(now)), _ids(triton.take(now))
        assert got == want, f"t={now:.4f}: {c}"
        if got:
            busy_until = now + r.choice([0.0002, 0.002, 0.01])


@pytest.mark.parametrize("seed", range(200))
def test_next_wakeup_never_asks_for_a_turn_that_changes_nothing(seed: int) -> None:
    """The broker sleeps until next_wakeup: a time already past makes it turn again at
    once, so such a time must mean that a take_batch now would send something. Random
    traffic with client CUDA memory on two GPUs (a GPU instance can take only its own)
    and preserve_ordering, where a walk stops at the first request the instance cannot
    serve."""
    r = random.Random(seed)
    c = dataclasses.replace(_config(r), preserve_ordering=seed % 2 == 1)
    b = DynamicBatcher(c)
    gpus: list[int | None] = [0, 1] if seed % 4 >= 2 else [None]
    busy_until = dict.fromkeys(gpus, 0.0)
    for step in range(2000):
        now = step * 1e-4 + r.random() * 1e-5
        if r.random() < 0.1:
            size = r.randint(1, c.max_batch_size)
            req = m.InferRequest(
                step, "m", 1, [m.TensorRef("IN", "FP32", [size, 4], 4)], [],
                batch_size=size, priority=r.choice([0, 1, 2, 3]),
                timeout_us=r.choice([0, 0, 1000, 20000]),
            )  # fmt: skip
            on_gpu = gpus != [None] and r.random() < 0.5
            regions = [m.ClientRegion(1, "cuda", device_id=r.choice([0, 1]))] if on_gpu else []
            with contextlib.suppress(Rejected):
                b.enqueue(m.WorkItem(b"f", req, regions=regions), now)
        b.expire(now)
        for gpu in gpus:
            if busy_until[gpu] <= now and b.take_batch(now, gpu):
                busy_until[gpu] = now + r.choice([0.0002, 0.002, 0.01])
        idle = [g for g in gpus if busy_until[g] <= now]
        wake = b.next_wakeup(idle)
        if wake is not None and wake <= now:  # the broker would turn again at once
            b.expire(now)
            sent = {g: b.take_batch(now, g) for g in idle}
            for gpu in (g for g, batch in sent.items() if batch):
                busy_until[gpu] = now + 0.002
            again = b.next_wakeup([g for g, batch in sent.items() if not batch])
            assert any(sent.values()) or again is None or again > now, f"spins at {now:.4f}: {c}"
