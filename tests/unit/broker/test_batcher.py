"""The dynamic batcher against a fake clock: no sockets, no sleeps."""

from __future__ import annotations

import itertools

import pytest

from shoal.broker.batcher import (
    QUEUE_FULL,
    BatcherConfig,
    DynamicBatcher,
    QueuePolicy,
    Rejected,
)
from shoal.ipc import messages as m

_ids = itertools.count(1)


def item(
    batch: int = 1,
    dims: tuple[int, ...] = (16,),
    priority: int = 0,
    timeout_us: int = 0,
    frontend: bytes = b"f-0-1",
) -> m.WorkItem:
    shape = [batch, *dims]
    req = m.InferRequest(
        next(_ids),
        "model",
        1,
        [m.TensorRef("INPUT0", "FP32", shape, 4 * batch)],
        [],
        batch_size=batch,
        priority=priority,
        timeout_us=timeout_us,
    )
    return m.WorkItem(frontend, req)


def sizes(batch: list[m.WorkItem]) -> list[int]:
    return [it.request.batch_size for it in batch]


def test_preferred_size_is_sent_at_once_then_the_rest_after_the_delay() -> None:
    b = DynamicBatcher(BatcherConfig(8, (6,), max_queue_delay_us=1_000_000))
    for _ in range(12):
        b.enqueue(item(), now=0.0)
    assert len(b.take_batch(now=0.0)) == 6
    assert len(b.take_batch(now=0.0)) == 6
    assert b.take_batch(now=0.0) == []


def test_largest_reachable_preferred_size_wins() -> None:
    b = DynamicBatcher(BatcherConfig(16, (2, 4, 6), max_queue_delay_us=10_000))
    for _ in range(5):
        b.enqueue(item(), now=0.0)
    assert len(b.take_batch(now=0.0)) == 4
    assert b.take_batch(now=0.0) == []  # one left: waits for the delay
    assert len(b.take_batch(now=0.02)) == 1


def test_max_batch_size_sends_immediately_and_is_never_exceeded() -> None:
    b = DynamicBatcher(BatcherConfig(8, (), max_queue_delay_us=10**9))
    for n in (4, 4, 1):
        b.enqueue(item(batch=n), now=0.0)
    assert sizes(b.take_batch(now=0.0)) == [4, 4]


def test_a_request_that_would_overflow_the_batch_sends_it_at_once() -> None:
    # Triton's GetDynamicBatch: the batch can grow no more, so waiting gains nothing.
    b = DynamicBatcher(BatcherConfig(8, (), max_queue_delay_us=10**9))
    for n in (3, 3, 3):
        b.enqueue(item(batch=n), now=0.0)
    assert sizes(b.take_batch(now=0.0)) == [3, 3]
    assert b.take_batch(now=0.0) == []  # the last 3 waits for company or the delay
    b2 = DynamicBatcher(BatcherConfig(8, (), max_queue_delay_us=10**9))
    b2.enqueue(item(batch=5), now=0.0)
    b2.enqueue(item(batch=5), now=0.0)
    assert sizes(b2.take_batch(now=0.0)) == [5]


def test_past_the_largest_preferred_size_what_is_queued_goes_at_once() -> None:
    b = DynamicBatcher(BatcherConfig(8, (4,), max_queue_delay_us=10**9))
    b.enqueue(item(batch=3), now=0.0)
    b.enqueue(item(batch=3), now=0.0)
    assert sizes(b.take_batch(now=0.0)) == [3]


def test_once_the_delay_ran_out_a_batch_takes_all_that_fits() -> None:
    b = DynamicBatcher(BatcherConfig(8, (2,), max_queue_delay_us=1_000))
    for _ in range(3):
        b.enqueue(item(), now=0.0)
    assert len(b.take_batch(now=1.0)) == 3  # not the preferred 2


def test_the_delay_counts_from_the_oldest_request_of_the_batch() -> None:
    cfg = BatcherConfig(8, (), max_queue_delay_us=10_000, priority_levels=2)
    b = DynamicBatcher(cfg)
    b.enqueue(item(priority=2), now=0.0)
    b.enqueue(item(priority=1), now=0.005)  # first in order, not the oldest
    assert b.next_wakeup() == pytest.approx(0.010)
    assert b.take_batch(now=0.009) == []
    assert len(b.take_batch(now=0.010)) == 2


def test_delay_expiry_sends_what_is_queued() -> None:
    b = DynamicBatcher(BatcherConfig(8, (), max_queue_delay_us=5_000))
    b.enqueue(item(), now=0.0)
    b.enqueue(item(), now=0.001)
    assert b.take_batch(now=0.004) == []
    assert b.next_wakeup() == pytest.approx(0.005)
    assert len(b.take_batch(now=0.005)) == 2


def test_delay_is_no_wakeup_while_no_instance_could_take_a_batch() -> None:
    policy = QueuePolicy(default_timeout_us=20_000)
    b = DynamicBatcher(BatcherConfig(8, (), max_queue_delay_us=5_000, default_policy=policy))
    b.enqueue(item(), now=0.0)
    assert b.next_wakeup() == pytest.approx(0.005)
    assert b.next_wakeup(idle=()) == pytest.approx(0.020)  # the timeout only


def test_zero_delay_sends_whatever_is_queued() -> None:
    b = DynamicBatcher(BatcherConfig(8))
    b.enqueue(item(), now=0.0)
    b.enqueue(item(), now=0.0)
    assert len(b.take_batch(now=0.0)) == 2
    assert b.next_wakeup() is None


def test_different_shapes_do_not_share_a_batch_and_keep_their_order() -> None:
    b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=10**9))
    b.enqueue(item(dims=(16,)), now=0.0)
    b.enqueue(item(dims=(8,)), now=0.0)
    b.enqueue(item(dims=(16,)), now=0.0)
    # The head's batch can grow no more: it goes now, and nothing overtakes the [8].
    assert [it.request.inputs[0].shape for it in b.take_batch(now=0.0)] == [[1, 16]]
    assert [it.request.inputs[0].shape for it in b.take_batch(now=0.0)] == [[1, 8]]
    assert b.take_batch(now=0.0) == []
    assert [it.request.inputs[0].shape for it in b.take_batch(now=1e3)] == [[1, 16]]


def test_shapes_are_compared_by_input_name_not_by_listing_order() -> None:
    def two_inputs(names: tuple[str, str]) -> m.WorkItem:
        refs = [m.TensorRef(n, "FP32", [1, 4], 16) for n in names]
        return m.WorkItem(b"f-0-1", m.InferRequest(next(_ids), "model", 1, refs, []))

    b = DynamicBatcher(BatcherConfig(8))
    b.enqueue(two_inputs(("A", "B")), now=0.0)
    b.enqueue(two_inputs(("B", "A")), now=0.0)
    assert len(b.take_batch(now=0.0)) == 2


def test_ragged_inputs_batch_despite_different_shapes() -> None:
    b = DynamicBatcher(BatcherConfig(8, ragged_inputs=frozenset({"INPUT0"})))
    b.enqueue(item(dims=(16,)), now=0.0)
    b.enqueue(item(dims=(8,)), now=0.0)
    assert len(b.take_batch(now=0.0)) == 2


def test_higher_priority_goes_first() -> None:
    b = DynamicBatcher(BatcherConfig(1, priority_levels=3, default_priority_level=2))
    low = item(priority=3)
    default = item()
    high = item(priority=1)
    for it in (low, default, high):
        b.enqueue(it, now=0.0)
    order = [b.take_batch(now=0.0)[0] for _ in range(3)]
    assert order == [high, default, low]


def test_max_queue_size_rejects() -> None:
    b = DynamicBatcher(
        BatcherConfig(8, max_queue_delay_us=10**6, default_policy=QueuePolicy(max_queue_size=2))
    )
    b.enqueue(item(), now=0.0)
    b.enqueue(item(), now=0.0)
    with pytest.raises(Rejected) as e:
        b.enqueue(item(), now=0.0)
    assert e.value.message == QUEUE_FULL


def test_timeout_reject() -> None:
    policy = QueuePolicy(timeout_action="REJECT", default_timeout_us=1_000)
    b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=10**6, default_policy=policy))
    a = item()
    b.enqueue(a, now=0.0)
    assert b.next_wakeup() == pytest.approx(0.001)
    assert b.expire(now=0.0005) == []
    assert b.expire(now=0.001) == [a]
    assert len(b) == 0


def test_timed_out_delay_requests_go_behind_the_others_later_arrivals_too() -> None:
    policy = QueuePolicy(timeout_action="DELAY", default_timeout_us=1_000)
    b = DynamicBatcher(BatcherConfig(1, default_policy=policy))
    late, before, after = item(), item(), item()
    b.enqueue(late, now=0.0)
    b.enqueue(before, now=0.0015)
    assert b.expire(now=0.002) == []  # `late` timed out: delayed, not rejected
    b.enqueue(after, now=0.0022)  # arrives once `late` was delayed: still goes first
    assert [b.take_batch(now=0.0022) for _ in range(3)] == [[before], [after], [late]]


def test_requests_that_timed_out_while_busy_are_delayed_in_arrival_order() -> None:
    """Triton moves a timed-out DELAY request when its batch-forming walk reaches it, and
    that walk runs only once an instance is free: requests that timed out meanwhile keep
    their queue order, even when a later one's own ``timeout`` ran out first."""
    policy = QueuePolicy("DELAY", default_timeout_us=10_000, allow_timeout_override=True)
    b = DynamicBatcher(BatcherConfig(1, (1,), default_policy=policy))
    running, first, second, fresh = item(), item(), item(timeout_us=2_000), item()
    b.enqueue(running, now=0.0)
    assert b.take_batch(now=0.0) == [running]  # the one instance is busy from here on
    b.enqueue(first, now=0.001)  # times out at 0.011
    b.enqueue(second, now=0.002)  # at 0.004: sooner
    b.enqueue(fresh, now=0.040)
    for now in (0.005, 0.012, 0.030):
        assert b.expire(now) == []  # broker ticks while busy: DELAY moves nothing yet
        assert b.next_wakeup(idle=[]) is None  # and a passed DELAY timeout wakes no one
    assert b.next_wakeup() == pytest.approx(0.004)  # an idle instance: due at once
    batches = [b.take_batch(now=0.045) for _ in range(3)]
    assert batches == [[fresh], [first], [second]]


def test_an_expired_reject_request_is_never_batched() -> None:
    policy = QueuePolicy(timeout_action="REJECT", default_timeout_us=1_000)
    b = DynamicBatcher(BatcherConfig(8, default_policy=policy))
    a, c = item(), item()
    b.enqueue(a, now=0.0)
    b.enqueue(c, now=0.0015)
    assert b.take_batch(now=0.002) == [c]  # before the caller's next expire()
    assert b.expire(now=0.002) == [a]
    assert len(b) == 0 and b.next_wakeup() is None


def test_timeout_override_may_only_shorten() -> None:
    policy = QueuePolicy(default_timeout_us=10_000, allow_timeout_override=True)
    b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=10**6, default_policy=policy))
    short, long_ = item(timeout_us=1_000), item(timeout_us=50_000)
    b.enqueue(short, now=0.0)
    b.enqueue(long_, now=0.0)
    assert b.expire(now=0.002) == [short]
    assert b.expire(now=0.011) == [long_]
    no_override = DynamicBatcher(
        BatcherConfig(
            8, max_queue_delay_us=10**6, default_policy=QueuePolicy(10_000 and "REJECT", 10_000)
        )
    )
    it = item(timeout_us=1_000)
    no_override.enqueue(it, now=0.0)
    assert no_override.expire(now=0.002) == []


def test_per_priority_policies() -> None:
    cfg = BatcherConfig(
        1,
        priority_levels=2,
        default_priority_level=2,
        priority_policies={1: QueuePolicy(max_queue_size=1)},
    )
    b = DynamicBatcher(cfg)
    b.enqueue(item(priority=1), now=0.0)
    with pytest.raises(Rejected):
        b.enqueue(item(priority=1), now=0.0)
    b.enqueue(item(priority=2), now=0.0)
    b.enqueue(item(priority=2), now=0.0)
    assert len(b) == 3


def test_remove_and_drain() -> None:
    b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=10**6))
    gone, kept = item(frontend=b"f-0-1"), item(frontend=b"f-1-2")
    b.enqueue(gone, now=0.0)
    b.enqueue(kept, now=0.0)
    assert b.remove(lambda it: it.frontend == b"f-0-1") == [gone]
    assert b.drain() == [kept]
    assert len(b) == 0


def test_priority_outside_the_levels_means_the_default_level() -> None:
    b = DynamicBatcher(BatcherConfig(1, priority_levels=3, default_priority_level=1))
    lowest, odd = item(priority=3), item(priority=99)
    b.enqueue(lowest, now=0.0)
    b.enqueue(odd, now=0.0)  # level 99 does not exist: the default (1), ahead of level 3
    assert b.take_batch(now=0.0) == [odd]
    assert b.take_batch(now=0.0) == [lowest]


def test_a_request_timeout_needs_a_default_timeout_to_shorten() -> None:
    policy = QueuePolicy(allow_timeout_override=True)  # no default timeout
    b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=10**9, default_policy=policy))
    b.enqueue(item(timeout_us=1_000), now=0.0)
    assert b.expire(now=1.0) == []  # Triton: override only if 0 < timeout < default
    assert len(b) == 1


def test_without_priority_levels_only_the_default_policy_applies() -> None:
    level_1 = {1: QueuePolicy(max_queue_size=1)}
    cfg = BatcherConfig(8, max_queue_delay_us=10**9, priority_policies=level_1)
    b = DynamicBatcher(cfg)
    b.enqueue(item(), now=0.0)
    b.enqueue(item(), now=0.0)  # level 1's max_queue_size of 1 does not apply
    assert len(b) == 2


def test_requests_gone_from_the_queue_do_not_pile_up_behind_a_long_timeout() -> None:
    long_wait = QueuePolicy(default_timeout_us=60_000_000)
    b = DynamicBatcher(
        BatcherConfig(1, priority_levels=2, default_priority_level=1, default_policy=long_wait)
    )
    b.enqueue(item(priority=2), now=0.0)  # waits behind everything, its timeout on top
    for i in range(10_000):
        b.enqueue(item(priority=1), now=i * 1e-6)
        assert len(b.take_batch(now=i * 1e-6)) == 1
    assert len(b) == 1
    assert len(b._reject_at) + len(b._delay_at) <= 2 * len(b) + 64


def test_waking_at_next_wakeup_always_finds_the_batch_due() -> None:
    for arrived in (0.1, 0.3, 1 / 3, 12345.678901):
        b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=700))
        b.enqueue(item(), now=arrived)
        wake = b.next_wakeup()
        assert wake is not None and len(b.take_batch(now=wake)) == 1


def open_levels(b: DynamicBatcher) -> list[int]:
    """The priority levels that hold queues now (internal: nothing public shows them)."""
    assert b._active == sorted(b._levels)
    return [index + 1 for index in b._active]


def test_huge_priority_levels_cost_nothing_until_used() -> None:
    # priority_levels is a uint64 in Triton's model config: levels exist only once used.
    top = 2**63
    cfg = BatcherConfig(
        8,
        max_queue_delay_us=10_000,
        priority_levels=top,
        default_priority_level=top,
        priority_policies={2**40: QueuePolicy(max_queue_size=1)},
    )
    b = DynamicBatcher(cfg)
    low, default, beyond, high = (
        item(priority=top),
        item(),
        item(priority=2**64 - 1),
        item(priority=1),
    )
    for it in (low, default, beyond):
        b.enqueue(it, now=0.0)
    b.enqueue(high, now=0.005)
    assert open_levels(b) == [1, top]
    assert b.next_wakeup() == pytest.approx(0.010)  # the oldest of the batch: `low`
    assert b.take_batch(now=0.009) == []
    assert b.take_batch(now=0.010) == [high, low, default, beyond]
    assert len(b) == 0 and open_levels(b) == []
    b.enqueue(item(priority=2**40), now=0.0)
    with pytest.raises(Rejected):  # the policy of a level named in priority_queue_policy
        b.enqueue(item(priority=2**40), now=0.0)


def test_a_level_is_dropped_once_empty_and_keeps_its_policy_when_used_again() -> None:
    cfg = BatcherConfig(
        1,
        priority_levels=3,
        default_priority_level=2,
        priority_policies={1: QueuePolicy(max_queue_size=1)},
    )
    b = DynamicBatcher(cfg)
    first, default = item(priority=1), item()
    b.enqueue(default, now=0.0)
    b.enqueue(first, now=0.0)
    assert open_levels(b) == [1, 2]
    assert b.take_batch(now=0.0) == [first]
    assert open_levels(b) == [2]
    again = item(priority=1)
    b.enqueue(again, now=0.0)
    with pytest.raises(Rejected):
        b.enqueue(item(priority=1), now=0.0)
    assert open_levels(b) == [1, 2]
    assert [b.take_batch(now=0.0) for _ in range(2)] == [[again], [default]]
    assert open_levels(b) == []


def test_remove_drops_the_levels_it_empties_and_keeps_priority_order() -> None:
    b = DynamicBatcher(BatcherConfig(1, priority_levels=3, default_priority_level=2))
    low, kept, high = item(priority=3), item(frontend=b"f-1-2"), item(priority=1)
    for it in (low, kept, high):
        b.enqueue(it, now=0.0)
    assert b.remove(lambda it: it.frontend == b"f-0-1") == [high, low]
    assert open_levels(b) == [2]
    assert b.remove(lambda it: False) == [] and open_levels(b) == [2]
    assert b.take_batch(now=0.0) == [kept]
    assert open_levels(b) == [] and len(b) == 0
    b.enqueue(item(priority=3), now=0.0)
    b.enqueue(item(priority=1), now=0.0)
    assert len(b.drain()) == 2 and open_levels(b) == []


def test_a_delayed_request_keeps_its_level_until_it_leaves() -> None:
    delay = QueuePolicy(timeout_action="DELAY", default_timeout_us=1_000)
    cfg = BatcherConfig(
        1, priority_levels=2, default_priority_level=2, priority_policies={1: delay}
    )
    b = DynamicBatcher(cfg)
    late, low = item(priority=1), item(priority=2)
    b.enqueue(late, now=0.0)
    b.enqueue(low, now=0.0)
    assert b.expire(now=0.002) == []  # `late` is delayed: its level stays
    assert open_levels(b) == [1, 2]
    after = item(priority=1)
    b.enqueue(after, now=0.003)
    assert [b.take_batch(now=0.003) for _ in range(2)] == [[after], [late]]
    assert open_levels(b) == [2]
    assert b.take_batch(now=0.003) == [low]
    assert open_levels(b) == []


def test_a_level_emptied_by_rejected_timeouts_is_dropped() -> None:
    reject = QueuePolicy(timeout_action="REJECT", default_timeout_us=1_000)
    cfg = BatcherConfig(
        8,
        max_queue_delay_us=10**9,
        priority_levels=3,
        default_priority_level=3,
        priority_policies={1: reject, 2: reject},
    )
    b = DynamicBatcher(cfg)
    one, two, three = item(priority=1), item(priority=2), item(priority=3)
    for it in (one, two, three):
        b.enqueue(it, now=0.0)
    assert b.expire(now=0.002) == [one, two]
    assert open_levels(b) == [3] and len(b) == 1
    assert b.next_wakeup() == pytest.approx(1000.0)  # the delay of `three` alone


def ids(batch: list[m.WorkItem]) -> list[int]:
    return [it.request.req_id for it in batch]


def test_a_batch_that_goes_for_its_delay_is_shared_among_the_idle_instances() -> None:
    b = DynamicBatcher(BatcherConfig(64, (), max_queue_delay_us=2000, share_min_compute_us=0))
    queued = [item() for _ in range(7)]
    for it in queued:
        b.enqueue(it, now=0.0)
    assert b.take_batches(now=0.001, share=2) == []  # the delay has not run out
    parts = b.take_batches(now=0.002, share=2)
    assert [ids(p) for p in parts] == [ids(queued[:3]), ids(queued[3:])]  # in order
    assert len(b) == 0


def test_with_delay_zero_a_burst_is_shared_at_once() -> None:
    b = DynamicBatcher(BatcherConfig(64, (), share_min_compute_us=0))
    for n in (3, 1, 1, 1, 2):
        b.enqueue(item(batch=n), now=0.0)
    parts = b.take_batches(now=0.0, share=3)
    assert [sizes(p) for p in parts] == [[3], [1, 1], [1, 2]]  # cut nearest 8/3 and 16/3


def test_sharing_never_makes_more_parts_than_requests_or_instances() -> None:
    b = DynamicBatcher(BatcherConfig(64, (), share_min_compute_us=0))
    for _ in range(2):
        b.enqueue(item(), now=0.0)
    assert [len(p) for p in b.take_batches(now=0.0, share=4)] == [1, 1]
    b.enqueue(item(batch=5), now=0.0)
    assert [sizes(p) for p in b.take_batches(now=0.0, share=2)] == [[5]]  # never cut


def test_a_full_batch_or_a_preferred_size_is_not_shared() -> None:
    # Full: it is what Triton sends, and the next requests make the next instance's batch.
    b = DynamicBatcher(BatcherConfig(4, (), max_queue_delay_us=10**9, share_min_compute_us=0))
    for _ in range(6):
        b.enqueue(item(), now=0.0)
    assert [len(p) for p in b.take_batches(now=0.0, share=2)] == [4]
    # A model that names its sizes gets them, even once the delay ran out.
    b = DynamicBatcher(BatcherConfig(64, (4,), max_queue_delay_us=1000, share_min_compute_us=0))
    for _ in range(6):
        b.enqueue(item(), now=0.0)
    assert [len(p) for p in b.take_batches(now=0.0, share=2)] == [4]
    assert [len(p) for p in b.take_batches(now=0.01, share=2)] == [2]


def test_the_preferred_size_triton_fills_in_does_not_stop_sharing() -> None:
    # An empty preferred_batch_size becomes [max_batch_size] (Triton's normalization):
    # no size is preferred but a full one, so a batch that goes short of it is shared.
    b = DynamicBatcher(BatcherConfig(8, (8,), max_queue_delay_us=1000, share_min_compute_us=0))
    for _ in range(6):
        b.enqueue(item(), now=0.0)
    assert [len(p) for p in b.take_batches(now=0.01, share=2)] == [3, 3]
    # A smaller size named beside it is a preference: the batch is not shared (and, its
    # delay run out, it takes all that fits, as Triton's does).
    b = DynamicBatcher(BatcherConfig(8, (4, 8), max_queue_delay_us=1000, share_min_compute_us=0))
    for _ in range(6):
        b.enqueue(item(), now=0.0)
    assert [len(p) for p in b.take_batches(now=0.01, share=2)] == [6]


def test_a_batch_is_cut_at_the_request_boundaries_nearest_an_even_share() -> None:
    def parts(batches: tuple[int, ...], share: int) -> list[list[int]]:
        b = DynamicBatcher(BatcherConfig(64, (), share_min_compute_us=0))
        for n in batches:
            b.enqueue(item(batch=n), now=0.0)
        return [sizes(p) for p in b.take_batches(now=0.0, share=share)]

    assert parts((1, 3), 2) == [[1], [3]]
    assert parts((1, 1, 4), 2) == [[1, 1], [4]]
    assert parts((1,) * 10, 4) == [[1, 1], [1, 1, 1], [1, 1], [1, 1, 1]]
    assert parts((1, 1, 1), 5) == [[1], [1], [1]]


def burst(b: DynamicBatcher, n: int, batch: int = 1) -> None:
    for _ in range(n):
        b.enqueue(item(batch=batch), now=0.0)


def shares(b: DynamicBatcher, share: int) -> list[int]:
    return [sum(sizes(p)) for p in b.take_batches(now=0.0, share=share)]


def test_a_batch_is_shared_only_in_parts_worth_an_execution() -> None:
    """By default each part must be expected to take 1 ms of compute off the others,
    judged by the executions seen: a part costs an execution's hops whatever it computes."""
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    burst(b, 6)
    assert shares(b, 2) == [6]  # nothing seen yet
    b.observe(8, 80_000)  # 10 µs a sample: a small model
    burst(b, 6)
    assert shares(b, 2) == [6]
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(8, 4_000_000)  # 500 µs a sample: a part needs 2
    burst(b, 6)  # three parts would be worth it, but two instances are idle
    assert shares(b, 2) == [3, 3]
    burst(b, 5)  # four idle: two parts of at least 2 samples, not four
    assert shares(b, 4) == [2, 3]
    burst(b, 3)  # 1.5 ms: one part
    assert shares(b, 2) == [3]


def test_parts_too_small_to_be_worth_it_make_fewer_parts() -> None:
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(10, 4_000_000)  # 400 µs a sample: a part needs 3
    burst(b, 10)  # 4 ms: three parts, not 3 + 3 + 3 + 1 over four instances
    assert shares(b, 4) == [3, 4, 3]
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(10, 4_000_000)
    for n in (5, 1, 1):  # 7 samples: two parts of 3.5 would do, but [5], [1, 1] is short
        b.enqueue(item(batch=n), now=0.0)
    assert shares(b, 2) == [7]
    for n in (1, 5):  # [1], [5] at first: the first part joins the one after it
        b.enqueue(item(batch=n), now=0.0)
    assert [sizes(p) for p in b.take_batches(now=0.0, share=2)] == [[1, 5]]
    for n in (1, 5, 1, 1, 5):  # three parts would be [1, 5], [1, 1], [5]: two, then
        b.enqueue(item(batch=n), now=0.0)
    assert [sizes(p) for p in b.take_batches(now=0.0, share=3)] == [[1, 5], [1, 1, 5]]


def test_a_fixed_cost_per_execution_is_not_what_sharing_saves() -> None:
    """A model that takes 900 µs an execution plus 1 µs a sample (a GPU, typically): a
    part of a few samples takes nothing off the others, however long it runs."""
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(1, 901_000)
    b.observe(8, 908_000)
    burst(b, 8)
    assert shares(b, 4) == [8]
    proportional = DynamicBatcher(BatcherConfig(64, (64,)))
    proportional.observe(1, 900_000)
    proportional.observe(8, 7_200_000)
    burst(proportional, 8)
    assert shares(proportional, 4) == [2, 2, 2, 2]


def test_the_compute_estimate_follows_the_executions() -> None:
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(4, 4_000_000)  # 1 ms a sample
    b.observe(4, 40_000)  # then 10 µs a sample: the earlier one still counts
    burst(b, 6)
    assert shares(b, 2) == [3, 3]
    for _ in range(30):
        b.observe(4, 40_000)  # 10 µs a sample, for a while: it is forgotten
    burst(b, 6)
    assert shares(b, 2) == [6]
    b.observe(0, 5_000_000)  # an execution of nothing says nothing
    burst(b, 6)
    assert shares(b, 2) == [6]


def test_minus_one_never_shares() -> None:
    b = DynamicBatcher(BatcherConfig(64, (64,), share_min_compute_us=-1))
    b.observe(8, 80_000_000)  # 10 ms a sample
    burst(b, 8)
    assert shares(b, 4) == [8]


def test_sharing_keeps_every_request_once_in_order_in_parts_worth_it() -> None:
    """Over many random bursts: the parts, joined, are the batch Triton would send; none
    is empty; there are no more parts than idle instances; each part is worth its
    execution (or there is only one)."""
    import random

    rng = random.Random(20261203)
    for _ in range(2000):
        per_sample_us = rng.choice([10, 200, 400, 700, 1500])
        least_us = rng.choice([0, 1000, 2500])
        b = DynamicBatcher(BatcherConfig(64, (64,), share_min_compute_us=least_us))
        b.observe(8, per_sample_us * 8 * 1000)
        queued = [item(batch=rng.choice([1, 1, 1, 2, 3, 5])) for _ in range(rng.randint(1, 12))]
        if sum(sizes(queued)) > 64:
            continue
        for it in queued:
            b.enqueue(it, now=0.0)
        share = rng.randint(1, 5)
        parts = b.take_batches(now=0.0, share=share)
        assert [i for p in parts for i in ids(p)] == ids(queued)
        assert all(parts) and len(parts) <= share
        least = max(1, -(-least_us // per_sample_us)) if least_us else 1
        assert len(parts) == 1 or all(sum(sizes(p)) >= least for p in parts)
        assert len(b) == 0


def test_more_idle_instances_than_requests_still_share() -> None:
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(8, 8_000_000)  # 1 ms a sample
    for share in (2, 4):
        burst(b, 2, batch=8)
        assert shares(b, share) == [8, 8]


def test_one_odd_execution_does_not_make_the_estimate() -> None:
    """With two sizes seen, the fitted slope is the difference of their mean times, how
    little the odd one weighs notwithstanding: one execution of 9 among a hundred of 8,
    1% faster by jitter, would say a sample costs nothing."""
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    for _ in range(100):
        b.observe(8, 8_000_000)  # 1 ms a sample
    b.observe(9, 7_900_000)
    burst(b, 4)
    assert shares(b, 2) == [2, 2]


def test_an_estimate_under_a_nanosecond_a_sample_shares_nothing() -> None:
    b = DynamicBatcher(BatcherConfig(64, (64,)))
    b.observe(8, 8_000_000)
    for _ in range(7000):
        b.observe(8, 0)  # decays to a subnormal number: no division by it
    burst(b, 4)
    assert shares(b, 2) == [4]
