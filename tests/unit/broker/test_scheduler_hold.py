"""Triton's scheduler-delay test hooks (shoal/broker/scheduler_hold.py): read from the
environment as Triton reads them, and holding the dynamic and sequence batchers until
their counts are reached, once."""

from __future__ import annotations

import pytest

from shoal.broker.batcher import BatcherConfig, DynamicBatcher, QueuePolicy
from shoal.broker.scheduler_hold import HoldCounts, SchedulerHold
from shoal.broker.sequencer import SequenceBatcher, SequenceConfig
from tests.unit.broker.test_batcher import item
from tests.unit.broker.test_sequencer import _corrids, _item, _run

W0, W1 = b"w0", b"w1"


@pytest.mark.parametrize(
    ("env", "counts"),
    [
        ({}, HoldCounts(0, 0)),
        ({"TRITONSERVER_DELAY_SCHEDULER": "12"}, HoldCounts(12, 0)),
        (
            {"TRITONSERVER_DELAY_SCHEDULER": "10", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "2"},
            HoldCounts(10, 2),
        ),
        ({"TRITONSERVER_DELAY_SCHEDULER": " 8x"}, HoldCounts(8, 0)),  # atoi
        ({"TRITONSERVER_DELAY_SCHEDULER": "many"}, HoldCounts(0, 0)),
        ({"TRITONSERVER_DELAY_SCHEDULER": ""}, HoldCounts(0, 0)),
        ({"TRITONSERVER_DELAY_SCHEDULER": "-3"}, HoldCounts(0, 0)),
    ],
)
def test_counts_are_read_as_triton_reads_them(env: dict[str, str], counts: HoldCounts) -> None:
    assert HoldCounts.from_env(env) == counts


def test_a_hold_is_let_go_once_for_good() -> None:
    hold = SchedulerHold(HoldCounts(3, 1))
    assert hold.holds(2, 1)
    assert hold.holds(3, 0)
    assert not hold.holds(3, 1)
    assert not hold.holds(0, 0)  # the queue emptied: still let go


def test_a_backlog_count_alone_holds_nothing() -> None:
    assert not SchedulerHold(HoldCounts(0, 5)).holds(0, 0)


def test_the_dynamic_batcher_holds_until_its_queue_has_the_count() -> None:
    b = DynamicBatcher(BatcherConfig(max_batch_size=8), HoldCounts(3))
    b.enqueue(item(), 0.0)
    b.enqueue(item(), 0.0)
    assert b.take_batch(1.0) == []
    assert not b.due(1.0)
    assert b.next_wakeup() is None  # nothing to wake for: an arrival releases it
    b.enqueue(item(), 2.0)
    assert len(b.take_batch(2.0)) == 3
    b.enqueue(item(), 3.0)
    assert len(b.take_batch(3.0)) == 1  # let go: one request is a batch again


def test_a_held_dynamic_batcher_still_times_requests_out() -> None:
    cfg = BatcherConfig(max_batch_size=8, default_policy=QueuePolicy(default_timeout_us=1000))
    b = DynamicBatcher(cfg, HoldCounts(5))
    b.enqueue(item(), 0.0)
    assert b.next_wakeup() == pytest.approx(0.001)
    assert len(b.expire(0.002)) == 1


def _sequences(
    hold: HoldCounts, mbs: int = 2, instances: tuple[bytes, ...] = (W0,)
) -> SequenceBatcher:
    sb = SequenceBatcher("acc", SequenceConfig("direct", mbs, max(1, mbs)), hold)
    for ident in instances:
        sb.add_instance(ident)
    return sb


def test_direct_holds_until_the_slots_have_the_count_then_batches_them_together() -> None:
    sb = _sequences(HoldCounts(4))
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(1), 0.0)
    sb.enqueue(_item(2, start=True), 0.0)
    assert sb.take(W0, 1.0) == []
    assert sb.next_wakeup([W0]) is None
    sb.enqueue(_item(2, end=True), 1.0)
    assert _corrids(_run(sb, 1.0)) == [(1, 0), (2, 1)]
    assert _corrids(_run(sb, 1.0)) == [(1, 0), (2, 1)]


def test_direct_holds_for_the_backlog_count_too() -> None:
    """TRITONSERVER_BACKLOG_DELAY_SCHEDULER: the requests of sequences that found no slot."""
    sb = _sequences(HoldCounts(2, 1), mbs=1)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(1, end=True), 0.0)
    assert sb.take(W0, 0.0) == []  # two in the slot, none in the backlog
    sb.enqueue(_item(2, start=True, end=True), 0.0)
    assert _corrids(_run(sb, 0.0)) == [(1, 0)]
    assert _corrids(_run(sb, 0.0)) == [(1, 0)]
    assert _corrids(_run(sb, 0.0)) == [(2, 0)]  # the backlogged one took the freed slot


def test_direct_counts_the_slots_of_every_instance() -> None:
    sb = _sequences(HoldCounts(2), mbs=1, instances=(W0, W1))
    sb.enqueue(_item(1, start=True), 0.0)
    assert sb.take(W0, 0.0) == []
    sb.enqueue(_item(2, start=True), 0.0)  # on the other instance
    assert _corrids(sb.take(W0, 0.0)) == [(1, 0)]
    assert _corrids(sb.take(W1, 0.0)) == [(2, 0)]


def test_oldest_holds_each_instance_on_its_own_count() -> None:
    cfg = SequenceConfig("oldest", 2, 2)
    sb = SequenceBatcher("acc", cfg, HoldCounts(2, 7))  # (no backlog count under Oldest)
    sb.add_instance(W0)
    sb.enqueue(_item(1, start=True), 0.0)
    assert sb.take(W0, 0.0) == []
    sb.enqueue(_item(2, start=True), 0.0)
    assert sorted(c for c, _ in _corrids(sb.take(W0, 0.0))) == [1, 2]
