"""The broker's pure core: model states and routing, without sockets or processes."""

from __future__ import annotations

from broker.models import Instance, ModelTable
from broker.router import Router
from ipc import messages as m


def _table(instances: int = 2) -> tuple[ModelTable, Router, list[Instance]]:
    table = ModelTable()
    table.add_model("simple", {1: instances}, "onnxruntime_onnx")
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


def _ready(table: ModelTable, router: Router, inst: Instance) -> list:
    inst.state = "READY"
    mv = table.version("simple", 1)
    assert mv is not None
    mv.refresh_state()
    return router.instance_ready(inst)


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
    d1 = router.submit(mv, _item(1))
    d2 = router.submit(mv, _item(2))
    d3 = router.submit(mv, _item(3))
    assert [inst.ident for inst, _ in d1 + d2] == [b"w0", b"w1"]
    assert d3 == []  # both busy: queued
    assert len(mv.queue) == 1
    ((inst, batch),) = router.batch_done(a)
    assert inst is a and batch.items[0].request.req_id == 3


def test_lost_instance_fails_its_batch_and_queue_when_none_left() -> None:
    table, router, (a,) = _table(1)
    _ready(table, router, a)
    mv = table.version("simple", 1)
    assert mv is not None
    router.submit(mv, _item(1))
    router.submit(mv, _item(2))
    failed, dispatches = router.instance_lost(a)
    assert [it.request.req_id for it in failed] == [1, 2]
    assert dispatches == []
    assert mv.state == "UNAVAILABLE"
    assert not table.all_ready()
    assert table.resolve("simple", -1) is None


def test_lost_instance_keeps_the_queue_for_the_survivor() -> None:
    table, router, (a, b) = _table()
    _ready(table, router, a)
    _ready(table, router, b)
    mv = table.version("simple", 1)
    assert mv is not None
    router.submit(mv, _item(1))
    router.submit(mv, _item(2))
    router.submit(mv, _item(3))
    failed, dispatches = router.instance_lost(a)
    assert [it.request.req_id for it in failed] == [1]
    assert dispatches == []  # b is still busy with 2
    assert mv.state == "READY"
    ((inst, batch),) = router.batch_done(b)
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
    router.instance_lost(a)
    assert mv.state == "UNAVAILABLE"
    again = Instance(b"w9", "simple", 1, 0, 2000)
    mv.instances[again.ident] = again
    mv.refresh_state()
    assert mv.state == "LOADING"  # restarting
    _ready(table, router, again)
    assert mv.state == "READY"
    assert table.resolve("simple", -1) is mv
