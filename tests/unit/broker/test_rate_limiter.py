"""Triton's rate limiter in the router (--rate-limit=execution_count), with a fake clock:
resources held for an execution, turns by priority across models, and batches that grow
while their instance waits for its turn."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.rate_limiter import RateLimiter
from shoal.broker.router import Dispatch, Router
from shoal.configs.flags.broker import parse_resource
from shoal.configs.rate_limits import check
from shoal.configs.spec_reader import read_spec
from shoal.ipc import messages as m


def _group(resources: str, priority: int = 0, count: int = 1) -> str:
    return (
        f"instance_group [{{ count: {count} kind: KIND_CPU "
        f"rate_limiter {{ resources [{resources}] priority: {priority} }} }}]"
    )


def _setup(
    models: dict[str, str], given: tuple[str, ...] = ()
) -> tuple[ModelTable, Router, dict[str, ModelVersion]]:
    """Each model's config text; every instance ready and idle."""
    configs = {name: text_format.Parse(text, mc.ModelConfig()) for name, text in models.items()}
    specs = [(n, [1], read_spec(c)) for n, c in configs.items()]
    limits = check(specs, [parse_resource(g) for g in given])
    assert limits.refused == {}
    table = ModelTable()
    router = Router(table, RateLimiter(limits))
    versions = {}
    for name, config in configs.items():
        count = sum(max(g.count, 1) for g in config.instance_group) or 1
        table.add_model(name, {1: count}, "onnxruntime_onnx")
        mv = table.version(name, 1)
        assert mv is not None
        mv.set_config(config.SerializeToString())
        for i in range(count):
            inst = Instance(f"{name}{i}".encode(), name, 1, i, 1000 + i, state="READY")
            mv.add_instance(inst)
            table.by_ident[inst.ident] = inst
        mv.refresh_state()
        for inst in mv.instances.values():
            router.instance_ready(inst, 0.0)
        versions[name] = mv
    return table, router, versions


_ids = iter(range(1, 1_000_000))


def _submit(router: Router, mv: ModelVersion, now: float = 0.0) -> list[Dispatch]:
    item = m.WorkItem(b"f0", m.InferRequest(next(_ids), mv.name, 1, [], [], batch_size=1))
    return router.submit(mv, item, now)


def _done(router: Router, inst: Instance, now: float = 0.0) -> list[Dispatch]:
    assert inst.in_flight is not None
    size = len(inst.in_flight.items)
    return router.batch_done(inst, m.BatchDone(inst.in_flight.batch_id, size), now)


def _names(dispatches: list[Dispatch]) -> list[str]:
    return [inst.model for inst, _ in dispatches]


EXCLUSIVE = {
    "a": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
    "b": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
}


def test_an_instance_runs_only_while_it_holds_its_resources() -> None:
    _, router, mv = _setup(EXCLUSIVE)
    (a0,) = mv["a"].instances.values()
    assert _names(_submit(router, mv["a"])) == ["a"]
    assert _submit(router, mv["b"]) == []  # b's instance is idle, but R is a's
    assert len(mv["b"].queue) == 1
    assert router.limiter is not None and router.limiter.in_use() == {(0, "R"): 1}
    assert _names(_done(router, a0)) == ["b"]  # a's release is b's turn


def test_without_resources_in_their_groups_models_are_not_held_back() -> None:
    _, router, mv = _setup({"a": "max_batch_size: 0", "b": "max_batch_size: 0"})
    assert _names(_submit(router, mv["a"])) == ["a"]
    assert _names(_submit(router, mv["b"])) == ["b"]


def test_given_copies_let_that_many_run_at_once() -> None:
    _, router, mv = _setup(EXCLUSIVE, given=("R:2",))
    assert _names(_submit(router, mv["a"]) + _submit(router, mv["b"])) == ["a", "b"]


def test_priority_2_gets_half_the_turns_of_priority_1_while_both_have_work() -> None:
    """Triton's L0_rate_limiter expects a ratio over 1.8 between the two models."""
    _, router, mv = _setup(
        {
            "a": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }', priority=1),
            "b": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }', priority=2),
        }
    )
    for _ in range(40):
        _submit(router, mv["a"])
        _submit(router, mv["b"])
    ran: list[str] = []
    running = next(i for v in mv.values() for i in v.instances.values() if i.in_flight)
    ran.append(running.model)
    for _ in range(29):
        ((running, _),) = _done(router, running)
        ran.append(running.model)
    assert (ran.count("a"), ran.count("b")) == (20, 10)
    # Ties (equal rank) go to the one that ran least recently: the turns interleave.
    assert "aaa" not in "".join(ran) and "bb" not in "".join(ran)


def test_the_first_in_line_is_never_overtaken_by_one_that_needs_less() -> None:
    """Triton allocates to the head of its queue only: an instance that needs much is
    not starved by others that need little."""
    _, router, mv = _setup(
        {
            "big": "max_batch_size: 0 " + _group('{ name: "R" count: 2 }'),
            "small": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
            "tiny": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
        }
    )
    (tiny0,) = mv["tiny"].instances.values()
    (small0,) = mv["small"].instances.values()
    (big0,) = mv["big"].instances.values()
    assert _names(_submit(router, mv["tiny"])) == ["tiny"]
    assert _done(router, tiny0) == []  # tiny has run once: it ranks behind the others
    assert _names(_submit(router, mv["small"])) == ["small"]  # holds 1 of the 2
    assert _submit(router, mv["big"]) == []  # needs 2
    assert _submit(router, mv["tiny"]) == []  # 1 is free, but big is first in line
    assert _names(_done(router, small0)) == ["big"]
    assert _names(_done(router, big0)) == ["tiny"]


def test_a_waiting_batch_grows_until_its_turn() -> None:
    """Two instances, resources for one: the idle one waits, and the requests that come
    meanwhile make one batch (Triton's L0_rate_limiter dynamic batching case)."""
    _, router, mv = _setup(
        {
            "m": "max_batch_size: 4 dynamic_batching { preferred_batch_size: [1, 2, 3, 4] } "
            + _group('{ name: "R" count: 1 }', count=2)
        }
    )
    ((first, batch),) = _submit(router, mv["m"])
    assert len(batch.items) == 1
    for _ in range(5):
        assert _submit(router, mv["m"]) == []
    assert router.next_wakeup() is None  # held back: only a release can let it go
    ((second, batch),) = _done(router, first)
    assert second is not first  # the one that waited (it ran least recently)
    assert len(batch.items) == 4


def test_a_held_back_queue_delay_does_not_wake_the_broker() -> None:
    _, router, mv = _setup(
        {
            "a": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
            "b": "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 1000 } "
            + _group('{ name: "R" count: 1 }'),
        }
    )
    (a0,) = mv["a"].instances.values()
    _submit(router, mv["a"])
    assert _submit(router, mv["b"], now=0.0) == []
    assert router.next_wakeup() == 0.001  # its delay: it may have its turn then
    assert router.tick(0.002) == ([], [])  # due, but R is taken
    assert router.next_wakeup() is None
    ((inst, batch),) = _done(router, a0, now=0.003)
    assert inst.model == "b" and len(batch.items) == 1


def test_a_dead_instance_gives_its_resources_back() -> None:
    _, router, mv = _setup(EXCLUSIVE)
    (a0,) = mv["a"].instances.values()
    _submit(router, mv["a"])
    _submit(router, mv["b"])
    router.retire(a0)  # killed: it holds R until its death is seen
    assert router.tick(0.1) == ([], [])
    failed, dispatches = router.instance_lost(a0, 0.2)
    assert len(failed) == 1
    assert _names(dispatches) == ["b"]


def test_who_needs_nothing_the_waiting_claim_is_not_held_back() -> None:
    """Better than Triton, whose limiter lets nobody pass the head of its queue."""
    _, router, mv = _setup(
        {
            **EXCLUSIVE,
            "other": "max_batch_size: 0 " + _group('{ name: "S" count: 1 }'),
            "none": "max_batch_size: 0",
        }
    )
    (a0,) = mv["a"].instances.values()
    assert _names(_submit(router, mv["a"])) == ["a"]
    assert _done(router, a0) == []
    assert _names(_submit(router, mv["a"])) == ["a"]
    assert _submit(router, mv["b"]) == []  # b waits for the R that a holds, and claims it
    assert _names(_submit(router, mv["other"])) == ["other"]
    assert _names(_submit(router, mv["none"])) == ["none"]


def test_a_passed_delay_timeout_does_not_keep_waking_the_broker() -> None:
    """A DELAY timeout that ran out while the batch is not due yet: the walk that finds
    it moves it, as take_batch's does, so the next wakeup is the queue delay, not the
    same past instant again (a busy loop)."""
    _, router, mv = _setup(
        {
            "m": "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 100000 "
            "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 "
            "} } " + _group('{ name: "R" count: 1 }')
        }
    )
    assert _submit(router, mv["m"]) == []
    assert router.next_wakeup() == 0.001
    assert router.tick(0.001) == ([], [])
    assert router.next_wakeup() == 0.1
    ((_, batch),) = router.tick(0.1)[0]
    assert len(batch.items) == 1


def test_a_claim_left_with_nothing_due_holds_nobody_back() -> None:
    """x claims R (it needs both copies, one is taken), then its sibling z, which needs
    nothing, takes the version's one batch: w, which needs one copy of R, goes in the
    same turn."""
    _, router, mv = _setup(
        {
            "h": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
            "v": "max_batch_size: 0 instance_group ["
            ' { count: 1 kind: KIND_CPU rate_limiter { resources [{ name: "R" count: 2 }] } },'
            " { count: 1 kind: KIND_CPU } ]",
            "w": "max_batch_size: 0 " + _group('{ name: "R" count: 1 }'),
        },
        given=("R:2",),
    )
    assert _names(_submit(router, mv["h"])) == ["h"]  # holds one copy
    for name in ("v", "w"):
        item = m.WorkItem(b"f0", m.InferRequest(next(_ids), name, 1, [], []))
        assert router.submit(mv[name], item, 0.0, dispatch=False) == []
    sent = router.dispatch(mv["v"], 0.0)
    assert sorted((inst.model, inst.index) for inst, _ in sent) == [("v", 1), ("w", 0)]


def test_an_unused_grant_leaves_the_instance_its_place() -> None:
    _, router, mv = _setup(EXCLUSIVE)
    (a0,) = mv["a"].instances.values()
    (b0,) = mv["b"].instances.values()
    limiter = router.limiter
    assert limiter is not None
    before = limiter.rank(a0)
    assert limiter.acquire(a0)
    limiter.release(a0, executed=False)
    assert limiter.rank(a0) == before and limiter.in_use() == {(0, "R"): 0}
    assert limiter.acquire(b0)
    limiter.release(b0)
    assert limiter.rank(b0)[0] == 1  # one execution, of priority 1


def test_a_sequence_model_takes_its_turns_with_its_sequences_batches() -> None:
    """Under the limiter a stateful model's batches still go per slot: a sequence's next
    request waits for the resource, then runs in its own slot's row."""
    seq = "max_batch_size: 2 sequence_batching { } " + _group('{ name: "R" count: 1 }')
    _, router, mv = _setup({"s": seq, "t": _group('{ name: "R" count: 1 }')})

    def request(corrid: int, start: bool) -> m.WorkItem:
        req = m.InferRequest(next(_ids), "s", 1, [], [], batch_size=1)
        req.sequence_id, req.sequence_start = corrid, start
        return m.WorkItem(b"f0", req)

    (t_inst, _), = _submit(router, mv["t"])  # fmt: skip  # t holds R
    assert router.submit(mv["s"], request(1, True), 0.0) == []
    assert router.submit(mv["s"], request(2, True), 0.0) == []
    (s_inst, batch), = _done(router, t_inst)  # fmt: skip  # R is free: s's turn
    assert s_inst.model == "s" and batch.rows == 2
    assert [it.slot for it in batch.items] == [0, 1]
