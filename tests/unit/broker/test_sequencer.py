"""Triton's sequence batcher (shoal/broker/sequencer.py) with a fake clock: slots, the backlog,
idle sequences, Direct's rows and delays, Oldest's one request per sequence at a time,
and the router that sends its batches."""

from __future__ import annotations

import pytest

from shoal.broker.models import Instance, ModelTable
from shoal.broker.router import Router
from shoal.broker.sequencer import SequenceBatcher, SequenceConfig, SequenceRefused
from shoal.ipc import messages as m
from shoal.ipc.errors import Code

W0, W1 = b"w0", b"w1"


def _batcher(
    strategy: str = "direct", mbs: int = 2, instances: tuple[bytes, ...] = (W0,), **kw: object
) -> SequenceBatcher:
    slots = kw.pop("slots", max(1, mbs))
    cfg = SequenceConfig(strategy, mbs, slots, **kw)  # type: ignore[arg-type]
    sb = SequenceBatcher("acc", cfg)
    for ident in instances:
        sb.add_instance(ident)
    return sb


_ids = iter(range(1, 1_000_000))


def _item(
    corrid: int | str,
    start: bool = False,
    end: bool = False,
    shape: tuple[int, ...] = (1, 1),
    batch: int = 1,
) -> m.WorkItem:
    inputs = [m.TensorRef("INPUT", "INT32", list(shape), 4, data=b"\0\0\0\0")]
    req = m.InferRequest(next(_ids), "acc", 1, inputs, [], batch_size=batch)
    req.sequence_id, req.sequence_start, req.sequence_end = corrid, start, end
    return m.WorkItem(b"f", req)


def _corrids(items: list[m.WorkItem]) -> list[tuple[int | str, int]]:
    return [(it.request.sequence_id, it.slot) for it in items]


def _run(sb: SequenceBatcher, now: float, ident: bytes = W0) -> list[m.WorkItem]:
    """The instance's next batch, taken and completed at ``now``."""
    batch = sb.take(ident, now)
    sb.completed(ident, batch, now)
    return batch


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (_item(0, start=True), "inference request to model 'acc' must specify a non-zero or "
         "non-empty correlation ID"),
        (_item("", start=True), "must specify a non-zero or non-empty correlation ID"),
        (_item(3, start=True, batch=2), "inference request to model 'acc' must specify "
         "batch-size 1 due to requirements of sequence batcher"),
        (_item(3), "inference request for sequence 3 to model 'acc' must specify the START "
         "flag on the first request of the sequence"),
        (_item("abc", start=True), "sequence batching control 'CORRID' data-type is 'BYTES', "
         "but model 'acc' expects 'UINT64'"),
    ],
)  # fmt: skip
def test_requests_are_refused_in_tritons_words(item: m.WorkItem, message: str) -> None:
    sb = _batcher(corrid_type="UINT64")
    with pytest.raises(SequenceRefused) as err:
        sb.enqueue(item, 0.0)
    assert err.value.code == Code.INVALID_ARG
    assert message in err.value.message
    assert len(sb) == 0 and not sb.open


def test_a_string_id_needs_a_string_corrid_control() -> None:
    sb = _batcher(corrid_type="BYTES")
    with pytest.raises(SequenceRefused, match="data-type is 'UINT64', but model 'acc' expects"):
        sb.enqueue(_item(7, start=True), 0.0)
    with pytest.raises(SequenceRefused, match="for sequence seven to model 'acc' must specify"):
        sb.enqueue(_item("seven"), 0.0)
    sb.enqueue(_item("seven", start=True), 0.0)
    assert _corrids(_run(sb, 0.0)) == [("seven", 0)]


def test_sequences_take_the_lowest_free_slot_spreading_over_instances() -> None:
    sb = _batcher(instances=(W0, W1))
    for corrid in (1, 2, 3, 4, 5):
        sb.enqueue(_item(corrid, start=True), 0.0)
    assert {c: (s.instance, s.slot) for c, s in sb.open.items() if s.instance} == {
        1: (W0, 0),
        2: (W1, 0),
        3: (W0, 1),
        4: (W1, 1),
    }
    assert [s.corrid for s in sb.backlog] == [5]  # every slot is taken


def test_direct_batches_span_the_slots_up_to_the_highest_with_a_request() -> None:
    sb = _batcher(mbs=4)
    for corrid in (1, 2, 3):
        sb.enqueue(_item(corrid, start=True), 0.0)
    assert _corrids(_run(sb, 0.0)) == [(1, 0), (2, 1), (3, 2)]
    sb.enqueue(_item(3), 1.0)
    sb.enqueue(_item(1), 1.0)
    batch = _run(sb, 1.0)
    assert _corrids(batch) == [(1, 0), (3, 2)]  # slot 1's row is a null row
    assert sb.rows(W0) == 3
    assert _run(sb, 1.0) == [] and len(sb) == 0


def test_each_slot_gives_one_request_per_batch_in_order() -> None:
    sb = _batcher(mbs=2)
    first, second = _item(1, start=True), _item(1)
    sb.enqueue(first, 0.0)
    sb.enqueue(second, 0.0)
    assert _run(sb, 0.0) == [first]
    assert _run(sb, 0.0) == [second]


def test_end_frees_the_slot_for_the_oldest_backlogged_sequence_with_its_queue() -> None:
    sb = _batcher(mbs=1)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.1)  # backlogged
    sb.enqueue(_item(2), 0.2)
    sb.enqueue(_item(3, start=True), 0.3)  # backlogged behind 2
    sb.enqueue(_item(1, end=True), 0.4)
    assert 1 not in sb.open  # closed at once: a request without START is refused now
    with pytest.raises(SequenceRefused):
        sb.enqueue(_item(1), 0.5)
    assert _corrids(_run(sb, 1.0)) == [(1, 0)]  # the first request of 1
    assert _corrids(_run(sb, 1.0)) == [(1, 0)]  # its END: the slot goes to 2
    assert [s.corrid for s in sb.backlog] == [3]
    assert _corrids(_run(sb, 1.0)) == [(2, 0)]
    assert _corrids(_run(sb, 1.0)) == [(2, 0)]


def test_a_sequence_may_start_and_end_in_the_backlog() -> None:
    sb = _batcher(mbs=1)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True, end=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.1)  # the same ID again: a new sequence
    assert [s.corrid for s in sb.backlog] == [2, 2]
    sb.enqueue(_item(1, end=True), 0.2)
    assert _corrids(_run(sb, 1.0)) == [(1, 0)]
    assert _corrids(_run(sb, 1.0)) == [(1, 0)]
    assert _corrids(_run(sb, 1.0)) == [(2, 0)]  # the first 2 ended: the slot frees
    assert _corrids(_run(sb, 1.0)) == [(2, 0)]
    assert not sb.backlog and 2 in sb.open


def test_start_for_an_open_sequence_joins_its_queue() -> None:
    sb = _batcher(mbs=2)
    sb.enqueue(_item(1, start=True), 0.0)
    again = _item(1, start=True)
    sb.enqueue(again, 0.1)
    assert len(sb.open) == 1 and len(sb) == 2
    _run(sb, 0.2)
    assert _run(sb, 0.2) == [again]  # same slot, after the first


def test_an_idle_sequence_is_closed_and_its_slot_freed() -> None:
    sb = _batcher(mbs=1, max_idle_us=1_000_000)
    sb.enqueue(_item(1, start=True), 0.0)
    _run(sb, 0.0)
    sb.enqueue(_item(2, start=True), 0.5)  # waits for 1's slot
    assert sb.next_wakeup([W0]) == pytest.approx(1.0)
    sb.expire(0.9)
    assert 1 in sb.open
    sb.expire(1.0)
    assert 1 not in sb.open  # forgotten: its next request needs START
    with pytest.raises(SequenceRefused, match="must specify the START flag"):
        sb.enqueue(_item(1), 1.1)
    assert _corrids(sb.take(W0, 1.1)) == [(2, 0)]


def test_a_sequence_is_idle_only_once_nothing_of_it_is_queued_or_running() -> None:
    """Unlike Triton, which counts from the last arrival: a request that waits behind a
    slow model does not cost its sequence."""
    sb = _batcher(mbs=1, max_idle_us=1_000_000)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.0)
    sb.expire(2.0)  # 1's request is still queued
    batch = sb.take(W0, 2.0)
    sb.expire(4.0)  # ... then running
    assert 1 in sb.open and sb.next_wakeup([]) is None
    sb.completed(W0, batch, 4.0)  # answered: idle from now
    assert sb.next_wakeup([]) == pytest.approx(5.0)
    sb.expire(4.9)
    assert 1 in sb.open
    sb.expire(5.0)
    assert 1 not in sb.open
    assert _corrids(sb.take(W0, 5.0)) == [(2, 0)]


def test_backlogged_sequences_are_never_idle() -> None:
    sb = _batcher(mbs=1, max_idle_us=1_000_000)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.0)
    _run(sb, 0.0)
    sb.enqueue(_item(1), 0.9)
    _run(sb, 0.9)
    sb.expire(5.0)  # 1 closes; 2, backlogged for 5 s, is still open
    assert 2 in sb.open and 1 not in sb.open
    assert _corrids(sb.take(W0, 5.0)) == [(2, 0)]


def test_direct_waits_for_slot_utilization_or_the_delay() -> None:
    sb = _batcher(mbs=4, max_queue_delay_us=10_000, minimum_slot_utilization=0.5)
    sb.enqueue(_item(1, start=True), 0.0)
    assert not sb.due(W0, 0.001)  # 1 of 4 slots
    assert sb.next_wakeup([W0]) == pytest.approx(0.01)
    sb.enqueue(_item(2, start=True), 0.002)
    assert sb.due(W0, 0.002)  # 2 of 4: half
    assert len(_run(sb, 0.002)) == 2
    sb.enqueue(_item(1), 0.003)
    assert _run(sb, 0.004) == []
    assert len(_run(sb, 0.0131)) == 1  # the delay ran out


def test_requests_of_another_shape_wait_for_the_next_batch() -> None:
    """The lowest slot's head sets the shape, as in Triton, whichever came first; the
    batch still spans the slot of the head left out (its row a null row)."""
    sb = _batcher(mbs=4)
    sb.enqueue(_item(3, start=True, shape=(1, 1)), 0.0)  # slot 0
    sb.enqueue(_item(1, start=True, shape=(1, 2)), 0.0)  # slot 1
    sb.enqueue(_item(2, start=True, shape=(1, 1)), 0.0)  # slot 2
    sb.enqueue(_item(4, start=True, shape=(1, 3)), 0.0)  # slot 3
    assert _corrids(_run(sb, 0.0)) == [(3, 0), (2, 2)]
    assert sb.rows(W0) == 4
    assert _corrids(_run(sb, 0.0)) == [(1, 1)]
    assert sb.rows(W0) == 4
    assert _corrids(_run(sb, 0.0)) == [(4, 3)]
    assert sb.rows(W0) == 4


def test_direct_slot_utilization_counts_heads_of_any_shape() -> None:
    sb = _batcher(mbs=2, max_queue_delay_us=1_000_000, minimum_slot_utilization=1.0)
    sb.enqueue(_item(1, start=True, shape=(1, 1)), 0.0)
    assert sb.take(W0, 0.0) == []
    sb.enqueue(_item(2, start=True, shape=(1, 2)), 0.0)  # both slots have a request
    assert _corrids(_run(sb, 0.0)) == [(1, 0)]


def test_oldest_runs_one_request_per_sequence_oldest_first() -> None:
    sb = _batcher("oldest", mbs=2, slots=3)
    sb.enqueue(_item(1, start=True), 0.2)
    sb.enqueue(_item(2, start=True), 0.1)
    sb.enqueue(_item(3, start=True), 0.0)
    sb.enqueue(_item(3), 0.3)
    batch = sb.take(W0, 0.5)
    assert _corrids(batch) == [(3, 2), (2, 1)]  # the two oldest heads, at most 2
    assert sb.rows(W0) == 0  # no null rows
    # 3's next must wait for its first to finish; 1 may go
    assert _corrids(sb.take(W0, 0.5)) == [(1, 0)]
    assert sb.take(W0, 0.5) == []
    sb.completed(W0, batch, 0.6)
    assert _corrids(sb.take(W0, 0.6)) == [(3, 2)]


def test_oldest_waits_for_its_preferred_size_or_the_delay() -> None:
    sb = _batcher("oldest", mbs=4, max_queue_delay_us=10_000, preferred_batch_sizes=(2,))
    sb.enqueue(_item(1, start=True), 0.0)
    assert not sb.due(W0, 0.005)
    sb.enqueue(_item(2, start=True), 0.006)
    assert len(sb.take(W0, 0.006)) == 2
    sb.enqueue(_item(3, start=True), 0.007)
    assert sb.take(W0, 0.008) == []
    assert len(sb.take(W0, 0.0171)) == 1


def test_an_instance_lost_ends_the_sequences_that_ran_there() -> None:
    sb = _batcher(mbs=1, instances=(W0, W1))
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.0)
    _run(sb, 0.0)  # 1 ran on w0: its state is there
    queued = _item(1)
    sb.enqueue(queued, 0.1)
    assert sb.remove_instance(W0) == [queued]
    assert 1 not in sb.open and 2 in sb.open and len(sb) == 1
    with pytest.raises(SequenceRefused, match="START"):
        sb.enqueue(_item(1), 0.2)


def test_a_sequence_that_never_ran_goes_back_to_the_backlog_first() -> None:
    sb = _batcher(mbs=1, instances=(W0, W1))
    for corrid in (1, 2, 3):  # 1 on w0, 2 on w1, 3 backlogged
        sb.enqueue(_item(corrid, start=True), 0.0)
    _run(sb, 0.0, W1)
    assert sb.remove_instance(W0) == []  # 1 had run nothing there
    assert [s.corrid for s in sb.backlog] == [1, 3]
    sb.enqueue(_item(2, end=True), 0.1)
    _run(sb, 0.1, W1)  # 2 ends: its slot goes to 1, the older
    assert _corrids(sb.take(W1, 0.2)) == [(1, 0)]


def test_a_retired_instance_takes_no_new_sequence() -> None:
    sb = _batcher(mbs=2, instances=(W0, W1))
    sb.retire(W0)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.0)
    assert {s.instance for s in sb.open.values()} == {W1}


def test_cancelled_requests_leave_and_a_closed_sequence_frees_its_slot() -> None:
    sb = _batcher(mbs=1)
    sb.enqueue(_item(1, start=True), 0.0)
    _run(sb, 0.0)
    end = _item(1, end=True)
    sb.enqueue(end, 0.1)
    sb.enqueue(_item(2, start=True), 0.1)
    assert sb.remove(lambda it: it is end) == [end]
    assert _corrids(_run(sb, 0.2)) == [(2, 0)]  # 1 ended with nothing left: 2 moved in


def test_drain_ends_everything() -> None:
    sb = _batcher(mbs=1)
    sb.enqueue(_item(1, start=True), 0.0)
    sb.enqueue(_item(2, start=True), 0.0)
    assert len(sb.drain()) == 2
    assert len(sb) == 0 and not sb.open and not sb.backlog and not sb.holds_work()


# -- through the router -----------------------------------------------------------------


def _router(config_text: str, instances: int = 1) -> tuple[Router, list[Instance]]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    table = ModelTable()
    table.add_model("acc", {1: instances}, "onnxruntime_onnx")
    mv = table.version("acc", 1)
    assert mv is not None
    mv.set_config(text_format.Parse(config_text, pb.ModelConfig()).SerializeToString())
    router = Router(table)
    insts = []
    for i in range(instances):
        inst = Instance(f"w{i}".encode(), "acc", 1, i, 1000 + i, state="READY")
        mv.instances[inst.ident] = inst
        table.by_ident[inst.ident] = inst
        insts.append(inst)
        mv.refresh_state()
        router.instance_ready(inst, 0.0)
    return router, insts


def test_the_router_sends_direct_batches_with_their_rows() -> None:
    router, (w0,) = _router('name: "acc" max_batch_size: 4 sequence_batching { }')
    mv = router.table.version("acc", 1)
    assert mv is not None and mv.sequencer is not None
    assert mv.sequencer.cfg.max_idle_us == 1_000_000  # Triton's default
    (inst, batch), = router.submit(mv, _item(1, start=True), 0.0)  # fmt: skip
    assert inst is w0 and batch.rows == 1
    router.submit(mv, _item(2, start=True), 0.1)
    router.submit(mv, _item(3, start=True), 0.1)
    assert mv.pending == 2
    router.batch_done(w0, m.BatchDone(batch.batch_id, 1), 0.2)
    nxt = w0.in_flight
    assert nxt is not None and nxt.rows == 3  # slots 1 and 2; row 0 null
    assert [it.slot for it in nxt.items] == [1, 2]
    stats = mv.stats.snapshot()
    assert stats.inference_count == 1 and stats.execution_count == 1


def test_the_router_closes_idle_sequences_on_its_tick() -> None:
    router, (w0,) = _router(
        'name: "acc" max_batch_size: 1 sequence_batching { max_sequence_idle_microseconds: 500000 }'
    )
    mv = router.table.version("acc", 1)
    assert mv is not None
    (_, batch), = router.submit(mv, _item(1, start=True), 0.0)  # fmt: skip
    router.batch_done(w0, m.BatchDone(batch.batch_id, 1), 0.1)
    assert router.submit(mv, _item(2, start=True), 0.2) == []  # backlogged behind 1
    assert router.next_wakeup() == pytest.approx(0.6)  # idle from its answer at 0.1
    assert router.tick(0.55) == ([], [])
    dispatches, failures = router.tick(0.6)
    assert failures == [] and [it.request.sequence_id for it in dispatches[0][1].items] == [2]


def test_the_router_fails_the_queued_requests_of_a_lost_instances_sequences() -> None:
    router, (w0, w1) = _router('name: "acc" max_batch_size: 1 sequence_batching { }', 2)
    mv = router.table.version("acc", 1)
    assert mv is not None and mv.sequencer is not None
    router.submit(mv, _item(1, start=True), 0.0)  # on w0
    (inst, _), = router.submit(mv, _item(2, start=True), 0.0)  # fmt: skip
    assert inst is w1
    queued = _item(1)
    router.submit(mv, queued, 0.0)
    failed, _ = router.instance_lost(w0, 0.1)
    assert queued in failed
    assert mv.stats.snapshot().inference_stats.fail.count == 2  # the one it ran, too
    assert list(mv.sequencer.open) == [2]  # w1's sequence goes on


def test_a_cancelled_request_ends_its_whole_sequence() -> None:
    """As Triton cancels a sequence: a backlogged one whose START is cancelled does not
    go on without it (and never gets a slot's state)."""
    sb = _batcher(mbs=1)
    sb.enqueue(_item(1, start=True), 0.0)
    start, follow = _item(2, start=True), _item(2)
    sb.enqueue(start, 0.0)
    sb.enqueue(follow, 0.1)
    assert sb.remove(lambda it: it is start) == [start, follow]
    assert not sb.backlog and 2 not in sb.open and len(sb) == 1
    with pytest.raises(SequenceRefused, match="sequence 2 to model 'acc' must specify"):
        sb.enqueue(_item(2), 0.2)


def test_an_iterative_sequence_without_an_id_is_a_sequence_of_its_own() -> None:
    """iterative_sequence: a request with no correlation ID gets one of the server's, with
    START and END (its worker runs it again while the model reschedules it), and its slot
    is free for the next once it was taken."""
    sb = _batcher("oldest", mbs=0, iterative=True)
    first, second = _item(0), _item(0)
    sb.enqueue(first, 0.0)
    sb.enqueue(second, 0.0)
    ids = [first.request.sequence_id, second.request.sequence_id]
    assert all(isinstance(i, int) and i > 0 for i in ids) and ids[0] != ids[1]
    assert first.request.sequence_start and first.request.sequence_end
    assert _run(sb, 1.0) == [first]
    assert _run(sb, 2.0) == [second]
