"""Requests in client CUDA memory reach only instances that can read it: an instance on
their GPU, or a CPU instance. The batcher and router against a fake clock."""

from __future__ import annotations

import itertools

import pytest

from shoal.broker.batcher import BatcherConfig, DynamicBatcher, QueuePolicy
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.router import Router
from shoal.ipc import messages as m
from shoal.ipc.errors import Code
from tests.unit.broker.test_router import _config_with_batching

_ids = itertools.count(1)


def _item(gpu: int | None = None, *, req_id: int | None = None) -> m.WorkItem:
    """A request with its input in CUDA shared memory on ``gpu`` (None: in host memory)."""
    rid = next(_ids) if req_id is None else req_id
    req = m.InferRequest(rid, "simple", 1, [m.TensorRef("INPUT0", "FP32", [1, 4], 16)], [])
    if gpu is None:
        return m.WorkItem(b"f-0-1", req)
    region = m.ClientRegion(reg_id=rid, kind="cuda", device_id=gpu, byte_size=16)
    return m.WorkItem(b"f-0-1", req, regions=[region])


def _ids_of(items: list[m.WorkItem]) -> list[int]:
    return [it.request.req_id for it in items]


def _version(
    gpus: list[int | None], batching: bool, config: bytes = b""
) -> tuple[Router, ModelVersion, list[Instance]]:
    table = ModelTable()
    table.add_model("simple", {1: len(gpus)}, "onnxruntime_onnx")
    mv = table.version("simple", 1)
    assert mv is not None
    if batching or config:
        mv.set_config(config or _config_with_batching())  # max_batch_size 8, delay 100 ms
    router = Router(table)
    insts = []
    for i, gpu in enumerate(gpus):
        inst = _instance(router, mv, i, gpu)
        inst.state = "READY"
        insts.append(inst)
    mv.refresh_state()
    for inst in insts:
        assert router.instance_ready(inst, 0.0) == []
    return router, mv, insts


def _instance(router: Router, mv: ModelVersion, index: int, gpu: int | None) -> Instance:
    """A worker's hello: the instance is known, LOADING, on ``gpu``."""
    inst = Instance(f"w{index}-{len(mv.instances)}".encode(), "simple", 1, index, 1000, gpu=gpu)
    mv.add_instance(inst)
    router.table.by_ident[inst.ident] = inst
    return inst


def _send(router: Router, mv: ModelVersion, item: m.WorkItem, now: float) -> list:
    """Submit ``item``; with batching, also let its queue delay (100 ms) run out."""
    dispatches = router.submit(mv, item, now)
    if mv.batcher is not None:
        dispatches += router.tick(now + 0.1)[0]
    return dispatches


# -- the batcher ---------------------------------------------------------------------


def test_a_gpu_instance_passes_over_requests_in_another_gpus_memory() -> None:
    b = DynamicBatcher(BatcherConfig(8))
    on1, host, on0, also1 = _item(1), _item(), _item(0), _item(1)
    for it in (on1, host, on0, also1):
        b.enqueue(it, now=0.0)
    assert _ids_of(b.take_batch(0.0, gpu=0)) == _ids_of([host, on0])
    assert _ids_of(b.take_batch(0.0, gpu=0)) == []
    assert _ids_of(b.take_batch(0.0, gpu=1)) == _ids_of([on1, also1])
    assert len(b) == 0


def test_a_cpu_instance_takes_requests_in_any_gpus_memory() -> None:
    b = DynamicBatcher(BatcherConfig(8))
    items = [_item(1), _item(), _item(0)]
    for it in items:
        b.enqueue(it, now=0.0)
    assert _ids_of(b.take_batch(0.0)) == _ids_of(items)


def test_requests_passed_over_keep_their_order_and_their_place() -> None:
    b = DynamicBatcher(BatcherConfig(2))  # max_batch_size 2
    first, second, host1, host2, host3 = _item(1), _item(1), _item(), _item(), _item()
    for it in (first, host1, second, host2, host3):
        b.enqueue(it, now=0.0)
    assert _ids_of(b.take_batch(0.0, gpu=0)) == _ids_of([host1, host2])
    # GPU 1's instance finds its two requests first, then what is left behind them
    assert _ids_of(b.take_batch(0.0, gpu=1)) == _ids_of([first, second])
    assert _ids_of(b.take_batch(0.0, gpu=1)) == _ids_of([host3])


def test_requests_passed_over_after_a_delay_timeout_leave_the_delayed_queue() -> None:
    policy = QueuePolicy(timeout_action="DELAY", default_timeout_us=600_000)
    b = DynamicBatcher(BatcherConfig(8, default_policy=policy))
    late1, late_host = _item(1), _item()
    b.enqueue(late1, now=0.0)
    b.enqueue(late_host, now=0.0)
    fresh1 = _item(1)
    b.enqueue(fresh1, now=0.5)
    # at 1 s the first two have timed out (at 0.6 s): delayed, behind fresh1
    assert _ids_of(b.take_batch(1.0, gpu=0)) == _ids_of([late_host])
    assert _ids_of(b.take_batch(1.0, gpu=1)) == _ids_of([fresh1, late1])
    assert len(b) == 0 and b.cuda_queued == 0


def test_the_count_of_queued_cuda_requests_follows_every_way_out() -> None:
    policy = QueuePolicy(default_timeout_us=1_000)  # REJECT
    b = DynamicBatcher(BatcherConfig(8, default_policy=policy))
    for it in (_item(1), _item(1), _item()):
        b.enqueue(it, now=0.0)
    assert b.cuda_queued == 2
    assert len(b.expire(1.0)) == 3 and b.cuda_queued == 0
    dropped, kept = _item(0), _item(0)
    b.enqueue(dropped, now=2.0)
    b.enqueue(kept, now=2.0)
    assert b.remove(lambda it: it is dropped) == [dropped] and b.cuda_queued == 1
    assert b.drain() == [kept] and b.cuda_queued == 0


def test_with_preserve_ordering_nothing_is_passed_over() -> None:
    """Answers go back in dispatch order: passing a request over would answer a later
    one first, so a batch ends at the first request the instance cannot serve."""
    b = DynamicBatcher(BatcherConfig(8, preserve_ordering=True))
    host1, on1, host2 = _item(), _item(1), _item()
    for it in (host1, on1, host2):
        b.enqueue(it, now=0.0)
    assert _ids_of(b.take_batch(0.0, gpu=0)) == _ids_of([host1])  # at once: it is full
    assert b.take_batch(0.0, gpu=0) == []  # GPU 1's request is next
    assert _ids_of(b.take_batch(0.0, gpu=1)) == _ids_of([on1, host2])


def test_the_queue_delay_wakes_the_broker_only_for_an_instance_that_can_run_the_batch() -> None:
    b = DynamicBatcher(BatcherConfig(8, max_queue_delay_us=5_000))
    b.enqueue(_item(1), now=0.0)
    assert b.next_wakeup(idle=[0]) is None  # GPU 0's instance could not take it
    assert b.next_wakeup(idle=[0, 1]) == 0.005
    assert b.next_wakeup(idle=[None]) == 0.005
    assert b.take_batch(0.004, gpu=1) == []
    assert len(b.take_batch(0.005, gpu=1)) == 1


# -- the router ----------------------------------------------------------------------


def test_a_request_goes_to_the_instance_on_its_gpu_though_another_is_idle_first() -> None:
    for batching in (False, True):
        router, mv, (on0, on1) = _version([0, 1], batching)
        ((inst, _),) = _send(router, mv, _item(1), 0.0)
        assert inst is on1
        ((inst, _),) = _send(router, mv, _item(), 1.0)
        assert inst is on0  # a request in host memory: any instance


def test_a_busy_gpu_holds_its_requests_while_the_others_take_theirs() -> None:
    router, mv, (on0, on1) = _version([0, 1], batching=False)
    ((_, running),) = router.submit(mv, _item(1), 0.0)  # on1 busy from now
    waiting = _item(1)
    assert router.submit(mv, waiting, 0.0) == []  # on0 idle, but cannot read GPU 1
    ((inst, batch),) = router.submit(mv, _item(req_id=500), 0.0)
    assert inst is on0 and _ids_of(batch.items) == [500]  # passed over the GPU 1 request
    assert _ids_of(list(mv.queue)) == _ids_of([waiting])
    ((inst, batch),) = router.batch_done(on1, m.BatchDone(running.batch_id, 1), 0.1)
    assert inst is on1 and _ids_of(batch.items) == _ids_of([waiting])


def test_a_version_busy_on_one_gpu_does_not_spin_on_its_queue_delay() -> None:
    router, mv, (_, on1) = _version([0, 1], batching=True)
    router.submit(mv, _item(1), 0.0)
    ((inst, _),) = router.tick(0.1)[0]
    assert inst is on1
    router.submit(mv, _item(1), 0.2)
    assert router.next_wakeup() is None  # on0 is idle, but the queue is GPU 1's alone
    router.submit(mv, _item(), 0.3)
    assert router.next_wakeup() == pytest.approx(0.4)  # on0's batch: the host request


def test_requests_of_a_gpu_whose_instance_died_fail_and_the_rest_stay_queued() -> None:
    router, mv, (_, on1) = _version([0, 1], batching=False)
    router.submit(mv, _item(0), 0.0)
    router.submit(mv, _item(1), 0.0)  # both busy from now
    stranded, host = _item(1), _item()
    router.submit(mv, stranded, 0.0)
    router.submit(mv, host, 0.0)
    failed, dispatches = router.instance_lost(on1, 0.5)
    assert _ids_of(failed)[1:] == _ids_of([stranded])  # after the batch on1 was running
    assert dispatches == []
    assert _ids_of(list(mv.queue)) == _ids_of([host])
    assert mv.stats.snapshot().inference_stats.fail.count == 2


def test_a_cpu_instance_left_keeps_every_request_queued() -> None:
    router, mv, (cpu, on1) = _version([None, 1], batching=True)
    _send(router, mv, _item(1), 0.0)
    _send(router, mv, _item(1), 1.0)  # cpu and on1 busy from now
    assert cpu.in_flight is not None and on1.in_flight is not None
    router.submit(mv, _item(1), 1.2)
    failed, _ = router.instance_lost(on1, 1.5)
    assert len(failed) == 1  # only what on1 was running
    assert mv.batcher is not None and len(mv.batcher) == 1


def test_a_request_no_instance_can_reach_is_refused_with_the_reason() -> None:
    _, mv, _ = _version([0, 1], batching=False)
    assert mv.unreachable(frozenset()) is None
    assert mv.unreachable(frozenset({1})) is None
    err = mv.unreachable(frozenset({0, 1}))  # a GPU instance sees one GPU alone
    assert err is not None and err.code == Code.INVALID_ARG
    assert err.message == (
        "model 'simple' version 1 has no instance that can read CUDA shared memory on "
        "GPU 0, GPU 1: its instances run on GPU 0, GPU 1"
    )
    _, cpu_mv, _ = _version([None], batching=False)
    assert cpu_mv.unreachable(frozenset({0, 1})) is None  # through the host


def test_a_gpu_whose_instance_is_restarting_is_unavailable_not_a_bad_request() -> None:
    router, mv, (_, on1) = _version([0, 1], batching=False)
    router.instance_lost(on1, 0.0)
    del mv.instances[on1.ident]  # as the broker drops an exited instance
    err = mv.unreachable(frozenset({1}))
    assert err is not None and err.code == Code.UNAVAILABLE  # 503: worth retrying
    assert "can read CUDA shared memory on GPU 1: it is being restarted" in err.message
    _instance(router, mv, 1, 1)  # its replacement said hello: requests wait for it
    assert mv.unreachable(frozenset({1})) is None


def test_a_request_waiting_for_a_replacement_stays_when_another_gpu_loses_one() -> None:
    router, mv, (a0, _, on1) = _version([0, 0, 1], batching=False)
    router.instance_lost(on1, 0.0)
    del mv.instances[on1.ident]
    _instance(router, mv, 2, 1)  # LOADING on GPU 1
    waiting = _item(1)
    assert router.submit(mv, waiting, 0.1) == []
    failed, _ = router.instance_lost(a0, 0.2)
    assert failed == []
    assert _ids_of(list(mv.queue)) == _ids_of([waiting])


def test_with_batching_requests_of_a_gpu_whose_instance_died_fail() -> None:
    router, mv, (on0, on1) = _version([0, 1], batching=True)
    _send(router, mv, _item(0), 0.0)
    _send(router, mv, _item(1), 1.0)  # both busy from now
    stranded, host = _item(1), _item()
    router.submit(mv, stranded, 1.2)
    router.submit(mv, host, 1.2)
    assert mv.batcher is not None and mv.batcher.cuda_queued == 1
    failed, _ = router.instance_lost(on1, 1.5)
    assert _ids_of(failed)[1:] == _ids_of([stranded])
    assert mv.batcher.cuda_queued == 0 and len(mv.batcher) == 1
    ((inst, batch),) = router.batch_done(on0, m.BatchDone(on0.in_flight.batch_id, 1), 1.6)  # type: ignore[union-attr]
    assert inst is on0 and _ids_of(batch.items) == _ids_of([host])


def test_the_instances_gpu_is_in_the_models_state() -> None:
    router, _, _ = _version([None, 3], batching=False)
    ((state),) = router.table.states()
    assert [i.gpu for i in state.instances] == [None, 3]


# -- the metrics' gpu_uuid -------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "only"),
    [([0, 0], 0), ([1], 1), ([None], -1), ([0, None], -1), ([0, 1], -1)],
)
def test_a_version_is_on_one_gpu_only_when_all_its_instances_are(
    gpus: list[int | None], only: int
) -> None:
    router, mv, _ = _version(gpus, batching=False)
    assert mv.only_gpu() == only
    (vm,) = router.table.metrics([], 0.0)
    assert vm.gpu == only


def test_a_dead_instance_does_not_count_where_the_version_runs() -> None:
    _, mv, insts = _version([0, None], batching=False)
    insts[1].state = "DEAD"
    assert mv.only_gpu() == 0
