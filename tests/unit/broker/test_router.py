"""The broker's pure core: model states and routing, without sockets or processes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from shoal.broker.batcher import Rejected
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.router import Router
from shoal.ipc import messages as m


def _table(
    instances: int = 2, passive: frozenset[int] = frozenset()
) -> tuple[ModelTable, Router, list[Instance]]:
    table = ModelTable()
    table.add_model("simple", {1: instances}, "onnxruntime_onnx", passive)
    mv = table.version("simple", 1)
    assert mv is not None
    insts = []
    for i in range(instances):
        inst = Instance(f"w{i}".encode(), "simple", 1, i, 1000 + i)
        mv.instances[inst.ident] = inst
        table.by_ident[inst.ident] = inst
        insts.append(inst)
    return table, Router(table), insts


def _item(req_id: int, frontend: bytes = b"f0") -> m.WorkItem:
    return m.WorkItem(frontend, m.InferRequest(req_id, "simple", 1, [], []))


def _done(router: Router, inst: Instance) -> list:
    assert inst.in_flight is not None
    return router.batch_done(inst, m.BatchDone(inst.in_flight.batch_id, 1), 1.0)


def _ready(table: ModelTable, router: Router, inst: Instance) -> list:
    inst.state = "READY"
    mv = table.version("simple", 1)
    assert mv is not None
    mv.refresh_state()
    return router.instance_ready(inst, 0.0)


def _lone_ready() -> tuple[ModelTable, Router, Instance, ModelVersion]:
    """A version of one instance, ready."""
    table, router, (a,) = _table(1)
    _ready(table, router, a)
    mv = table.version("simple", 1)
    assert mv is not None
    return table, router, a, mv


def test_version_is_loading_until_every_instance_reported() -> None:
    table, router, (a, b) = _table()
    mv = table.version("simple", 1)
    assert mv is not None and mv.state == "LOADING"
    _ready(table, router, a)
    assert mv.state == "LOADING"
    _ready(table, router, b)
    assert mv.state == "READY"
    assert table.resolve("simple", -1) is mv
    assert table.all_ready()


def test_requests_spread_over_idle_instances_one_batch_each() -> None:
    table, router, (a, b) = _table()
    _ready(table, router, a)
    _ready(table, router, b)
    mv = table.version("simple", 1)
    assert mv is not None
    d1 = router.submit(mv, _item(1), 0.0)
    d2 = router.submit(mv, _item(2), 0.0)
    d3 = router.submit(mv, _item(3), 0.0)
    assert [inst.ident for inst, _ in d1 + d2] == [b"w0", b"w1"]
    assert d3 == []  # both busy: queued
    assert len(mv.queue) == 1
    ((inst, batch),) = _done(router, a)
    assert inst is a and batch.items[0].request.req_id == 3


def test_lost_instance_fails_its_batch_and_queue_when_none_left() -> None:
    table, router, a, mv = _lone_ready()
    router.submit(mv, _item(1), 0.0)
    router.submit(mv, _item(2), 0.0)
    failed, dispatches = router.instance_lost(a, 0.0)
    assert [it.request.req_id for it in failed] == [1, 2]
    assert dispatches == []
    assert mv.stats.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}
    assert mv.state == "UNAVAILABLE"
    assert not table.all_ready()
    assert table.resolve("simple", -1) is None


def test_lost_instance_keeps_the_queue_for_the_survivor() -> None:
    table, router, (a, b) = _table()
    _ready(table, router, a)
    _ready(table, router, b)
    mv = table.version("simple", 1)
    assert mv is not None
    router.submit(mv, _item(1), 0.0)
    router.submit(mv, _item(2), 0.0)
    router.submit(mv, _item(3), 0.0)
    failed, dispatches = router.instance_lost(a, 0.0)
    assert [it.request.req_id for it in failed] == [1]
    assert dispatches == []  # b is still busy with 2
    assert mv.state == "READY"
    ((inst, batch),) = _done(router, b)
    assert inst is b and batch.items[0].request.req_id == 3


def test_failed_load_makes_the_version_unavailable() -> None:
    table, router, (a, b) = _table(2)
    mv = table.version("simple", 1)
    assert mv is not None
    _ready(table, router, a)
    mv.load_failed(b, "failed to load 'simple' version 1: bad")
    assert mv.state == "UNAVAILABLE"  # every instance must load, as in Triton
    assert table.startup_done()
    assert table.failures() == ["simple version 1: failed to load 'simple' version 1: bad"]


def test_config_errors_are_listed_as_unavailable() -> None:
    table = ModelTable()
    table.add_error("broken", "failed to load 'broken': bad field")
    assert table.states() == [
        m.ModelState("broken", -1, "UNAVAILABLE", "failed to load 'broken': bad field")
    ]
    assert not table.all_ready()


def test_restarted_instance_brings_the_version_back() -> None:
    table, router, (a,) = _table(1)
    mv = table.version("simple", 1)
    assert mv is not None
    _ready(table, router, a)
    router.instance_lost(a, 0.0)
    assert mv.state == "UNAVAILABLE"
    again = Instance(b"w9", "simple", 1, 0, 2000)
    mv.instances[again.ident] = again
    mv.refresh_state()
    assert mv.state == "LOADING"  # restarting
    _ready(table, router, again)
    assert mv.state == "READY"
    assert table.resolve("simple", -1) is mv


def test_statistics_count_requests_executions_and_batch_sizes() -> None:
    table, router, mv, inst = _batching_one_instance()
    router.submit(mv, _item(1), 0.0)
    router.submit(mv, _item(2), 0.0)
    ((owner, batch),) = router.instance_ready(inst, 0.5)  # delay passed: one batch of two
    assert owner is inst
    assert len(batch.items) == 2
    router.batch_done(inst, m.BatchDone(batch.batch_id, 2, 10, 100, 20), 1.0)
    (stats,) = table.stats("simple", -1)
    assert stats.inference_count == 2
    assert stats.execution_count == 1
    assert stats.inference_stats.success.count == 2
    assert stats.inference_stats.queue.count == 2
    assert stats.inference_stats.compute_infer.ns == 200
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(2, 1)]


def test_a_failure_is_counted_for_its_own_request_not_a_namesake_of_another_frontend() -> None:
    # req_ids are numbered per frontend process: one batch can hold two requests with
    # the same id, and the report names failures by their position in the batch.
    table, router, mv, inst = _batching_one_instance()
    router.submit(mv, _item(7, b"f0"), 0.0)
    router.submit(mv, _item(7, b"f1"), 0.0)
    ((_, batch),) = router.instance_ready(inst, 0.5)
    assert [it.frontend for it in batch.items] == [b"f0", b"f1"]
    router.batch_done(inst, m.BatchDone(batch.batch_id, 1, failed=[1]), 1.0)
    (stats,) = table.stats("simple", -1)
    assert stats.inference_stats.success.count == 1
    assert stats.inference_stats.fail.count == 1
    assert stats.inference_count == 1
    assert mv.stats.failures["BACKEND"] == 1  # its execution failed


def _batching_one_instance() -> tuple[ModelTable, Router, ModelVersion, Instance]:
    table = ModelTable()
    table.add_model("simple", {1: 1}, "onnxruntime_onnx")
    mv = table.version("simple", 1)
    assert mv is not None
    mv.set_config(_config_with_batching())
    inst = Instance(b"w0", "simple", 1, 0, 1000)
    mv.instances[inst.ident] = inst
    inst.state = "READY"
    mv.refresh_state()
    return table, Router(table), mv, inst


def _config_with_batching() -> bytes:
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = mc.ModelConfig(name="simple", max_batch_size=8)
    cfg.dynamic_batching.max_queue_delay_microseconds = 100_000
    return cfg.SerializeToString()


def test_a_stale_batch_done_is_ignored() -> None:
    table, router, (a,) = _table(1)
    _ready(table, router, a)
    mv = table.version("simple", 1)
    assert mv is not None
    ((_, batch),) = router.submit(mv, _item(1), 0.0)
    assert router.batch_done(a, m.BatchDone(batch.batch_id + 99, 1), 1.0) == []
    assert a.in_flight is batch  # still running


def test_forget_frontend_returns_its_queued_requests() -> None:
    table, router, _ = _table(1)
    mv = table.version("simple", 1)
    assert mv is not None
    router.submit(mv, _item(1, frontend=b"f-0-1"), 0.0)  # no instance ready: queued
    router.submit(mv, _item(2, frontend=b"f-1-2"), 0.0)
    dropped = router.forget_frontend(b"f-0-1", 1.0)
    assert [it.request.req_id for it in dropped] == [1]
    assert [it.request.req_id for it in mv.queue] == [2]
    assert mv.stats.snapshot().inference_stats.fail.count == 1  # cancelled: a failure
    assert mv.stats.failures["OTHER"] == 1  # its frontend exited


def test_a_busy_version_does_not_wake_the_broker_for_its_queue_delay() -> None:
    """Only an idle instance can take a batch: while all are busy, a queue delay that ran
    out must not make the broker's poll return at once (it would spin until batch_done)."""
    table, router, (a,) = _table(1)
    mv = table.version("simple", 1)
    assert mv is not None
    mv.set_config(_config_with_batching())  # delay 100 ms
    _ready(table, router, a)
    router.submit(mv, _item(1), 0.0)
    assert router.next_wakeup() == 0.1  # idle instance: wake when the delay runs out
    ((_, first),) = router.tick(0.1)[0]
    router.submit(mv, _item(2), 0.2)
    assert a.in_flight is first
    assert router.next_wakeup() is None  # busy: the delay at 0.3 is of no use
    assert router.tick(0.5) == ([], [])
    ((_, second),) = router.batch_done(a, m.BatchDone(first.batch_id, 1), 0.6)
    assert [it.request.req_id for it in second.items] == [2]  # delay long gone: sent at once


def _many_batching_versions(
    count: int, config: bytes | None = None
) -> tuple[ModelTable, Router, list[Instance]]:
    """``count`` models, one version each with dynamic batching (``config``, by default
    a queue delay of 100 ms) and one READY idle instance."""
    table = ModelTable()
    router = Router(table)
    insts = []
    for k in range(count):
        name = f"m{k}"
        table.add_model(name, {1: 1}, "onnxruntime_onnx")
        mv = table.version(name, 1)
        assert mv is not None
        mv.set_config(config or _config_with_batching())
        inst = Instance(f"w{k}".encode(), name, 1, 0, 1000 + k)
        mv.instances[inst.ident] = inst
        table.by_ident[inst.ident] = inst
        inst.state = "READY"
        mv.refresh_state()
        router.instance_ready(inst, 0.0)
        insts.append(inst)
    return table, router, insts


def _named_item(req_id: int, model: str, timeout_us: int = 0) -> m.WorkItem:
    return m.WorkItem(b"f0", m.InferRequest(req_id, model, 1, [], [], timeout_us=timeout_us))


def test_the_loop_sees_only_the_versions_holding_requests() -> None:
    """tick and next_wakeup run on every turn of the broker's loop: with hundreds of idle
    models loaded they must look at the one with a queue, and forget it once it empties."""
    table, router, _ = _many_batching_versions(300)
    busy = table.version("m7", 1)
    assert busy is not None
    assert router.next_wakeup() is None and router.tick(0.0) == ([], [])
    assert router._armed == {}
    router.submit(busy, _named_item(1, "m7"), 0.0)
    assert list(router._armed.values()) == [busy]
    assert router.next_wakeup() == 0.1
    ((inst, batch),) = router.tick(0.1)[0]  # the delay ran out: sent
    assert inst.model == "m7" and [it.request.req_id for it in batch.items] == [1]
    assert router._armed == {}  # nothing queued any more


def test_a_rejection_found_while_forming_a_batch_is_still_handed_back() -> None:
    """take_batch applies timeouts too: a request it finds expired is handed back by the
    next tick, even though the queue it left is empty by then."""
    table = ModelTable()
    table.add_model("simple", {1: 1}, "onnxruntime_onnx")
    mv = table.version("simple", 1)
    assert mv is not None
    mv.set_config(
        _batching_config(
            "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 100000 "
            "default_queue_policy { default_timeout_microseconds: 1000 } }"
        )
    )
    router = Router(table)
    router.submit(mv, _named_item(1, "simple"), 0.0)  # no instance yet: queued
    inst = Instance(b"w0", "simple", 1, 0, 1000)
    mv.instances[inst.ident] = inst
    inst.state = "READY"
    mv.refresh_state()
    assert router.instance_ready(inst, 0.5) == []  # expired while queued: no batch
    dispatches, failures = router.tick(0.5)
    assert dispatches == []
    assert [(it.request.req_id, why) for it, why in failures] == [(1, "Request timeout expired")]
    assert router._armed == {}
    assert mv.stats.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


def test_overdue_names_the_batches_running_too_long_oldest_first() -> None:
    no_delay = _batching_config("max_batch_size: 8 dynamic_batching { }")
    table, router, insts = _many_batching_versions(3, no_delay)
    versions = [table.version(f"m{k}", 1) for k in range(3)]
    for k, (mv, at) in enumerate(zip(versions, (0.0, 1.0, 2.0), strict=True)):
        assert mv is not None
        router.submit(mv, _named_item(k + 1, f"m{k}"), at)  # delay 0: runs at once
    assert [i.model for i in router.overdue(11.5, 10.0)] == ["m0", "m1"]
    first = insts[0]
    assert first.in_flight is not None
    router.batch_done(first, m.BatchDone(first.in_flight.batch_id, 1), 12.6)
    mv0 = versions[0]
    assert mv0 is not None
    router.submit(mv0, _named_item(9, "m0"), 13.0)  # m0 runs again: now the newest
    assert [i.model for i in router.overdue(13.5, 10.0)] == ["m1", "m2"]
    assert router.overdue(13.5, 0) == []  # 0: no limit


def test_requests_reported_answered_just_before_a_death_are_unconfirmed() -> None:
    table, router, (a,) = _table(1)
    _ready(table, router, a)
    mv = table.version("simple", 1)
    assert mv is not None
    router.submit(mv, _item(1, b"f0"), 0.0)
    router.submit(mv, _item(2, b"f1"), 0.0)
    router.submit(mv, _item(3, b"f0"), 0.0)
    ordered = _item(4, b"f1")
    ordered.seq = 7  # its answer travels with the report, through the broker
    router.submit(mv, ordered, 0.0)
    for t in (1.0, 2.0, 4.0, 4.5):
        assert a.in_flight is not None
        router.batch_done(a, m.BatchDone(a.in_flight.batch_id, 1), t)
    # At 5.0 only the batches reported within the window (2 s) may have lost answers.
    assert router.unconfirmed(a, 5.0) == {b"f0": [3]}
    assert router.unconfirmed(a, 5.0) == {}  # handed out once


def test_the_answered_record_of_a_live_instance_stays_bounded() -> None:
    table, router, (a,) = _table(1)
    _ready(table, router, a)
    mv = table.version("simple", 1)
    assert mv is not None
    for i in range(1, 101):
        router.submit(mv, _item(i), float(i))
        assert a.in_flight is not None
        router.batch_done(a, m.BatchDone(a.in_flight.batch_id, 1), float(i))
    assert [keys for _, keys in a.answered] == [[(b"f0", 98)], [(b"f0", 99)], [(b"f0", 100)]]


def _batching_config(text: str) -> bytes:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(text, mc.ModelConfig()).SerializeToString()


def test_preserve_ordering_orders_only_the_requests_taken_into_batches() -> None:
    table, router, (a,) = _table(1)
    mv = table.version("simple", 1)
    assert mv is not None
    mv.set_config(_batching_config("max_batch_size: 1 dynamic_batching { preserve_ordering: 1 }"))
    _ready(table, router, a)
    ((_, first),) = router.submit(mv, _item(1), 0.0)
    router.submit(mv, _item(2), 0.0)  # queued behind: no sequence number yet
    assert [it.seq for it in first.items] == [1]
    assert [it.seq for it in mv.batcher.drain()] == [0]  # type: ignore[union-attr]


def test_a_model_without_batching_still_gets_its_queue_policies() -> None:
    table, router, (a,) = _table(1)
    mv = table.version("simple", 1)
    assert mv is not None
    mv.set_config(
        _batching_config(
            "max_batch_size: 0 dynamic_batching { default_queue_policy { max_queue_size: 1 } }"
        )
    )
    _ready(table, router, a)
    router.submit(mv, _item(1), 0.0)  # runs
    router.submit(mv, _item(2), 0.0)  # queued
    with pytest.raises(Rejected):
        router.submit(mv, _item(3), 0.0)
    ((_, batch),) = _done(router, a)
    assert [it.request.req_id for it in batch.items] == [2]  # one request per execution


def test_a_cancelled_request_leaves_the_queue_but_not_a_running_batch() -> None:
    table, router, (a,) = _table(1)
    _ready(table, router, a)
    mv = table.version("simple", 1)
    assert mv is not None
    router.submit(mv, _item(1), 0.0)  # running on `a`
    router.submit(mv, _item(2), 0.0)  # queued behind it
    assert router.cancel(b"f0", 1, 0.5) is None  # running: its worker will answer
    cancelled = router.cancel(b"f0", 2, 0.5)
    assert cancelled is not None and cancelled.request.req_id == 2
    assert not mv.queue and router.cancel(b"f0", 2, 0.5) is None
    (stats,) = table.stats("simple", -1)
    assert stats.inference_stats.fail.count == 1
    assert mv.stats.failures["CANCELED"] == 1
    assert _done(router, a) == []  # nothing left to run


def test_cancels_and_exits_look_only_where_their_requests_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel (a gRPC deadline, a client gone) is answered from the version its request
    queues in, not by searching every loaded version; and nothing of a request stays
    indexed once it leaves the queue: dispatched, dropped or expired."""
    table, router, insts = _many_batching_versions(50)
    m3, m9 = table.version("m3", 1), table.version("m9", 1)
    assert m3 is not None and m9 is not None
    insts[3].state = insts[9].state = "LOADING"  # not idle: their requests stay queued
    m3.idle.clear()
    m9.idle.clear()
    router.submit(m3, _named_item(1, "m3"), 0.0)
    router.submit(m9, _named_item(2, "m9"), 0.0)
    router.submit(m9, m.WorkItem(b"f1", m.InferRequest(3, "m9", 1, [], [])), 0.0)
    searched: list[str] = []
    remove_queued = Router._remove_queued

    def spy(mv: ModelVersion, match: Callable[[m.WorkItem], bool]) -> list[m.WorkItem]:
        searched.append(mv.name)
        return remove_queued(mv, match)

    monkeypatch.setattr(Router, "_remove_queued", staticmethod(spy))
    cancelled = router.cancel(b"f0", 2, 0.5)
    assert cancelled is not None and cancelled.request.req_id == 2
    assert router.cancel(b"f0", 2, 0.5) is None  # gone: a second cancel finds nothing
    assert router.cancel(b"f0", 99, 0.5) is None  # never seen
    (gone,) = router.forget_frontend(b"f0", 0.6)
    assert gone.request.req_id == 1
    assert m9.batcher is not None and len(m9.batcher) == 1  # f1's request stays
    assert searched == ["m9", "m3"]  # one version per call, the one holding the request
    assert m3.stats.snapshot().inference_stats.fail.count == 1
    assert m9.stats.snapshot().inference_stats.fail.count == 1
    insts[9].state = "READY"
    m9.refresh_state()
    router.instance_ready(insts[9], 0.7)
    router.tick(0.8)  # the queue delay ran out: request 3 runs
    assert insts[9].in_flight is not None
    assert router.cancel(b"f1", 3, 0.9) is None  # running: its worker answers
    assert router._queued_in == {}


def test_a_passive_instance_loads_but_is_never_sent_work() -> None:
    table, router, (active, standby) = _table(passive=frozenset({1}))
    _ready(table, router, active)
    assert _ready(table, router, standby) == []
    mv = table.version("simple", 1)
    assert mv is not None and mv.state == "READY" and not mv.all_passive
    sent = [router.submit(mv, _item(i), 0.0) for i in range(3)]
    assert [inst for out in sent for inst, _ in out] == [active]
    while (nxt := _done(router, active)) != []:
        assert [inst for inst, _ in nxt] == [active]
    assert standby.in_flight is None


def test_a_version_of_passive_instances_only_is_known_as_such() -> None:
    table, _, _ = _table(instances=1, passive=frozenset({0}))
    mv = table.version("simple", 1)
    assert mv is not None and mv.all_passive


def test_losing_the_last_active_instance_fails_the_queue_despite_a_passive_one() -> None:
    """A passive instance never takes requests: with the active one gone, queued requests
    must fail at once and the version must stop being READY, not wait forever."""
    table, router, (active, standby) = _table(passive=frozenset({1}))
    _ready(table, router, active)
    _ready(table, router, standby)
    mv = table.version("simple", 1)
    assert mv is not None and mv.state == "READY"
    router.submit(mv, _item(1), 0.0)  # running on the active instance
    router.submit(mv, _item(2), 0.0)  # queued behind it
    failed, dispatches = router.instance_lost(active, 1.0)
    assert sorted(it.request.req_id for it in failed) == [1, 2]
    assert dispatches == [] and standby.in_flight is None
    assert mv.state == "UNAVAILABLE"
    assert mv.stats.snapshot().inference_stats.fail.count == 2


def test_a_passive_instance_alone_does_not_make_a_version_ready() -> None:
    table, router, (active, standby) = _table(passive=frozenset({1}))
    _ready(table, router, standby)
    mv = table.version("simple", 1)
    assert mv is not None and mv.state == "LOADING"  # the active one is still loading
    _ready(table, router, active)
    assert mv.state == "READY"


def test_metrics_carry_failures_pending_requests_tags_and_summaries() -> None:
    from tritonclient.grpc import model_config_pb2 as mc

    table = ModelTable()
    table.add_model("simple", {1: 1}, "onnxruntime_onnx")
    table.keep_summaries()  # a frontend serves latency summaries
    mv = table.version("simple", 1)
    assert mv is not None
    cfg = mc.ModelConfig(name="simple", max_batch_size=8)
    cfg.dynamic_batching.max_queue_delay_microseconds = 100_000
    cfg.metric_tags["team"] = "vision"
    mv.set_config(cfg.SerializeToString())
    assert table.metrics([0.5], 0.0) == []  # never READY yet: not shown, as in /stats
    inst = Instance(b"w0", "simple", 1, 0, 1000)
    mv.instances[inst.ident] = inst
    inst.state = "READY"
    mv.refresh_state()
    router = Router(table)
    router.instance_ready(inst, 0.0)
    router.submit(mv, _item(1), 0.0)
    router.submit(mv, _item(2), 0.0)
    (before,) = table.metrics([0.5], 0.0)
    assert before.pending == 2 and before.tags == {"team": "vision"}
    assert all(math.isnan(v) for (v,) in before.summaries.values())
    ((_, batch),) = router.tick(0.2)[0]  # the queue delay ran out
    assert table.metrics([], 0.2)[0].pending == 0  # running, no longer pending
    router.batch_done(inst, m.BatchDone(batch.batch_id, 2, 10_000, 300_000, 20_000), 0.5)
    (after,) = table.metrics([0.5, 0.99], 0.5)
    assert after.stats.inference_stats.success.count == 2
    assert after.summaries["compute_infer"] == [300, 300]  # µs, each request's batch
    assert after.summaries["queue"][0] >= 0
    assert table.metrics([], 0.5)[0].summaries == {}  # no quantiles asked: none computed
    (later,) = table.metrics([0.5], 0.5 + 61)  # a minute on: nothing left in the window
    assert all(math.isnan(v) for (v,) in later.summaries.values())
    assert later.stats.inference_stats.success.count == 2  # the counters stay


def _batching_ready(
    instances: int, batching: str = "", share_min_compute_us: str | None = None
) -> tuple[Router, ModelVersion, list[Instance]]:
    """A version of ``instances`` ready instances, max_batch_size 64 and
    ``dynamic_batching { <batching> }``, with shoal_share_min_compute_us if given."""
    table, router, insts = _table(instances)
    mv = table.version("simple", 1)
    assert mv is not None
    text = f"max_batch_size: 64 dynamic_batching {{ {batching} }}"
    if share_min_compute_us is not None:
        text += (
            ' parameters { key: "shoal_share_min_compute_us" value { string_value: '
            f'"{share_min_compute_us}" }} }}'
        )
    mv.set_config(_batching_config(text))
    for inst in insts:
        _ready(table, router, inst)
    return router, mv, insts


def test_a_burst_is_shared_among_the_idle_instances_in_order() -> None:
    router, mv, (_, b, _) = _batching_ready(3, "preserve_ordering: 1", "0")
    for i in range(1, 6):  # one frontend message: all queued, then dispatched
        assert router.submit(mv, _item(i), 0.0, dispatch=False) == []
    sent = router.dispatch(mv, 0.0)
    assert [(inst.ident, [it.request.req_id for it in batch.items]) for inst, batch in sent] == [
        (b"w0", [1, 2]),  # cut nearest 5/3 and 10/3
        (b"w1", [3]),
        (b"w2", [4, 5]),
    ]
    # answered in arrival order: the sequence runs on across the shares
    assert [it.seq for _, batch in sent for it in batch.items] == [1, 2, 3, 4, 5]
    assert not mv.idle
    assert router.submit(mv, _item(6), 0.0) == []  # every instance busy: it waits
    ((inst, batch),) = _done(router, b)
    assert inst is b and [it.request.req_id for it in batch.items] == [6]


def test_a_busy_instance_takes_no_share() -> None:
    router, mv, (a, b) = _batching_ready(2, share_min_compute_us="0")
    router.submit(mv, _item(1), 0.0)  # a lone request: the first idle instance runs it
    assert a.in_flight is not None and b.in_flight is None
    for i in range(2, 6):
        router.submit(mv, _item(i), 0.0, dispatch=False)
    ((inst, batch),) = router.dispatch(mv, 0.0)
    assert inst is b and [it.request.req_id for it in batch.items] == [2, 3, 4, 5]


def test_the_executions_a_version_reports_decide_whether_a_burst_is_shared() -> None:
    router, mv, (a, _) = _batching_ready(2)  # parts worth 1 ms

    def burst(first: int) -> list[list[int]]:
        for i in range(first, first + 4):
            router.submit(mv, _item(i), 0.0, dispatch=False)
        sent = router.dispatch(mv, 0.0)
        return [[it.request.req_id for it in batch.items] for _, batch in sent]

    assert burst(1) == [[1, 2, 3, 4]]  # nothing known of its compute: Triton's one batch
    assert a.in_flight is not None
    # 4 samples in 4 ms (input, infer and output): 1 ms a sample
    done = m.BatchDone(a.in_flight.batch_id, 4, 500_000, 3_000_000, 500_000)
    assert router.batch_done(a, done, 1.0) == []
    assert burst(5) == [[5, 6], [7, 8]]  # two parts of 2 ms


def test_the_samples_executed_not_the_requests_feed_the_estimate() -> None:
    router, mv, (a, _) = _batching_ready(2, share_min_compute_us="1500")

    def pairs(first: int, n: int) -> list[list[int]]:
        for i in range(first, first + n):
            req = m.InferRequest(i, "simple", 1, [], [], batch_size=2)
            router.submit(mv, m.WorkItem(b"f0", req), 0.0, dispatch=False)
        return [[it.request.req_id for it in batch.items] for _, batch in router.dispatch(mv, 0.0)]

    assert pairs(1, 4) == [[1, 2, 3, 4]]
    assert a.in_flight is not None
    router.batch_done(a, m.BatchDone(a.in_flight.batch_id, 8, 0, 4_000_000, 0), 1.0)
    # 500 µs a sample: a part of 1.5 ms needs 3 samples, so 4 samples stay one batch
    # (counted by requests, 1 ms each, it would be cut in two)
    assert pairs(5, 2) == [[5, 6]]


def test_a_failed_execution_does_not_feed_the_estimate() -> None:
    router, mv, (a, _) = _batching_ready(2)
    for i in range(1, 5):
        router.submit(mv, _item(i), 0.0, dispatch=False)
    router.dispatch(mv, 0.0)
    assert a.in_flight is not None
    slow = m.BatchDone(a.in_flight.batch_id, 4, 0, 40_000_000, 0, failed=[0])
    router.batch_done(a, slow, 1.0)  # 10 ms a sample, but a request failed: not counted
    for i in range(5, 9):
        router.submit(mv, _item(i), 1.0, dispatch=False)
    ((_, batch),) = router.dispatch(mv, 1.0)
    assert len(batch.items) == 4


def test_a_retired_instance_takes_no_batch_while_its_death_is_on_the_way() -> None:
    """The broker killed it (its memory, a hang): idle or busy, no batch goes to it
    until its death is seen; its sibling takes them, and its running batch is failed
    only then."""
    table, router, (a, b) = _table()
    _ready(table, router, a)
    _ready(table, router, b)
    mv = table.version("simple", 1)
    assert mv is not None
    router.retire(a)  # idle when killed, first in line
    ((inst, _),) = router.submit(mv, _item(1), 0.0)
    assert inst is b
    assert router.submit(mv, _item(2), 0.0) == []  # queued for b, not sent to a
    assert router.instance_ready(a, 0.0) == [] and b"w0" not in mv.idle
    assert mv.state == "READY"  # b serves
    ((inst, batch),) = _done(router, b)
    assert inst is b and batch.items[0].request.req_id == 2
    failed, _ = router.instance_lost(a, 1.0)
    assert failed == []


def test_a_retired_busy_instance_does_not_come_back_with_its_report() -> None:
    _, router, a, mv = _lone_ready()
    router.submit(mv, _item(1), 0.0)
    router.retire(a)
    assert mv.state == "UNAVAILABLE"  # its only instance: requests are refused at once
    assert _done(router, a) == [] and not mv.idle  # a report that raced the kill
    router.submit(mv, _item(2), 0.0)
    failed, dispatches = router.instance_lost(a, 1.0)
    assert [it.request.req_id for it in failed] == [2] and dispatches == []


def test_a_decoupled_models_open_requests_outlive_their_batch_until_they_end() -> None:
    """A batch reported done with open requests (a decoupled model still answers them):
    the instance takes the next batch at once; the open ones are not unconfirmed answers
    but its streams, which the model's end (StreamsEnded) or the instance's death closes,
    counted once, as successes when their batch returned."""
    table, router, a, mv = _lone_ready()
    router.submit(mv, _item(1), 0.0)
    assert a.in_flight is not None
    router.batch_done(a, m.BatchDone(a.in_flight.batch_id, 1, open=[0]), 1.0)
    assert list(a.streams) == [(b"f0", 1)]
    assert router.running(b"f0", 1) is a  # a cancel goes to the instance that answers it
    router.submit(mv, _item(2), 1.0)  # the instance is free for the next batch
    assert a.in_flight is not None and a.in_flight.items[0].request.req_id == 2
    router.batch_done(a, m.BatchDone(a.in_flight.batch_id, 1, open=[0]), 1.5)
    assert router.unconfirmed(a, 1.6) == {}  # nothing answered whole: both still open
    ended = router.streams_ended(a, [(b"f0", 1), (b"f9", 5)])  # an unknown key: ignored
    assert [it.request.req_id for it in ended] == [1]
    assert router.running(b"f0", 1) is None
    failed, _ = router.instance_lost(a, 2.0)
    assert [it.request.req_id for it in failed] == [2]
    assert not a.streams
    (stats,) = table.stats("simple", -1)
    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (2, 0)


def test_a_running_request_is_found_for_its_cancel() -> None:
    _, router, a, mv = _lone_ready()
    router.submit(mv, _item(1), 0.0)
    router.submit(mv, _item(2), 0.0)
    assert router.running(b"f0", 1) is a
    assert router.running(b"f0", 2) is None  # queued: the router drops it itself
    assert router.running(b"f1", 1) is None  # another frontend's namesake
