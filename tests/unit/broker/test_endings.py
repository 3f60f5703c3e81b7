"""The instances the broker ends itself (shoal.broker.endings), with a fake clock, a fake
memory reader and the kill and stop requests recorded: no processes, no signals."""

from __future__ import annotations

from shoal.broker.endings import STOP_GRACE_S, Endings
from shoal.broker.memory import CHECK_EVERY_S, MIB
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.router import Router
from shoal.ipc import messages as m


class Host:
    """The shell's side: who was killed or asked to stop, and each pid's memory."""

    def __init__(self) -> None:
        self.killed: list[int] = []
        self.asked: list[int] = []
        self.memory: dict[int, int] = {}
        self.reads: list[int] = []

    def read(self, pid: int) -> int | None:
        self.reads.append(pid)
        return self.memory.get(pid)


def _setup(
    limit_mb: int = 200, supported: bool = True
) -> tuple[ModelVersion, Router, list[Instance], Host, Endings]:
    table = ModelTable()
    table.add_model("simple", {1: 2}, "onnxruntime_onnx", frozenset())
    mv = table.version("simple", 1)
    assert mv is not None
    router = Router(table)
    insts = []
    for i in range(2):
        inst = Instance(f"w{i}".encode(), "simple", 1, i, 1000 + i, state="READY")
        mv.instances[inst.ident] = inst
        table.by_ident[inst.ident] = inst
        insts.append(inst)
        router.instance_ready(inst, 0.0)
    mv.refresh_state()
    host = Host()
    endings = Endings(
        table, router, 300.0, limit_mb,
        kill=lambda i: host.killed.append(i.index),
        ask_to_stop=lambda i: host.asked.append(i.index),
        read=host.read, supported=supported,
    )  # fmt: skip
    return mv, router, insts, host, endings


def _item(req_id: int) -> m.WorkItem:
    return m.WorkItem(b"f0", m.InferRequest(req_id, "simple", 1, [], []))


def test_a_hung_instance_is_killed_once_and_its_death_says_why() -> None:
    mv, router, (a, _), host, endings = _setup(limit_mb=0)
    ((inst, _),) = router.submit(mv, _item(1), 0.0)
    assert inst is a
    endings.tick(300.0)
    assert host.killed == []
    endings.tick(301.0)
    endings.tick(302.0)
    assert host.killed == [0]  # once
    assert endings.pop(a.ident) == (
        "execution_timeout",
        "was killed (it had run one batch for 301 s, longer than "
        "--model-execution-timeout-secs (300))",
    )
    assert endings.pop(a.ident) == ("crash", "exited")  # an exit the broker did not cause


def test_over_its_limit_an_instance_is_stopped_after_its_batch_then_killed_if_it_stays() -> None:
    mv, router, (a, b), host, endings = _setup()
    host.memory = {1000: 300 * MIB, 1001: 50 * MIB}
    endings.tick(0.0)
    assert (host.asked, host.killed) == ([0], [])
    assert b"w0" not in mv.idle and a.state == "DEAD"  # retired: its sibling serves
    ((inst, _),) = router.submit(mv, _item(1), 0.0)
    assert inst is b
    endings.tick(CHECK_EVERY_S)  # read again, still within bounds: not asked twice
    assert (host.asked, host.killed) == ([0], [])
    endings.tick(STOP_GRACE_S)
    assert host.killed == [0]
    assert endings.pop(a.ident) == (
        "memory_limit",
        "was killed (it held 300 MiB of memory, over its limit of 200 MiB; it had not "
        "stopped 10 s later)",
    )


def test_a_stop_that_ends_in_time_is_named_as_a_stop() -> None:
    _, _, (a, _), host, endings = _setup()
    host.memory = {1000: 300 * MIB}
    endings.tick(0.0)
    assert endings.pop(a.ident) == (
        "memory_limit",
        "was stopped (it held 300 MiB of memory, over its limit of 200 MiB)",
    )
    endings.tick(STOP_GRACE_S)  # it died in time: no kill after the grace
    assert host.killed == []


def test_twice_its_limit_is_a_runaway_killed_at_once_even_while_stopping() -> None:
    _, _, (a, _), host, endings = _setup()
    host.memory = {1000: 300 * MIB, 1001: 401 * MIB}
    endings.tick(0.0)
    assert (host.asked, host.killed) == ([0], [1])
    host.memory[1000] = 401 * MIB
    endings.tick(CHECK_EVERY_S)
    assert host.killed == [1, 0]
    assert endings.pop(a.ident)[1].startswith("was killed (it held 401 MiB")


def test_memory_is_read_only_where_it_can_be_trusted() -> None:
    _, _, _, host, endings = _setup()
    host.memory = {1000: 900 * MIB, 1001: 900 * MIB}
    endings.tick(0.0, unwatched={b"w0"})  # its pid number may be another process's
    assert 1000 not in host.reads and host.killed == [1]
    _, _, _, host, endings = _setup(supported=False)
    host.memory = {1000: 900 * MIB}
    endings.tick(0.0)
    assert host.reads == [] and host.killed == host.asked == []
    _, _, _, host, endings = _setup(limit_mb=0)
    host.memory = {1000: 900 * MIB}
    endings.tick(0.0)
    assert host.reads == []  # no limit: nothing to read


def test_a_lost_instance_s_batch_fails_and_its_queue_goes_to_its_sibling() -> None:
    mv, router, (a, b), _, endings = _setup(limit_mb=0)
    router.submit(mv, _item(1), 0.0)  # a runs it
    router.submit(mv, _item(2), 0.0)  # b runs it
    assert a.in_flight is not None and b.in_flight is not None
    del endings.table.by_ident[a.ident]  # (the shell takes it out of the table first)
    loss = endings.lost(a, stopping=False, now=1.0)
    ((item, err),) = loss.answers
    assert item.request.req_id == 1 and err is loss.error
    assert err.message == (
        "Failed to process the request(s) for model instance '', message: the instance's "
        "worker process (pid 1000) exited"
    )
    assert loss.dispatches == [] and a.ident not in mv.instances
    assert mv.exits == {"crash": 1} and mv.state == "READY"  # b still serves


def test_requests_no_instance_left_can_run_are_answered_as_orphans() -> None:
    mv, router, (a, b), _, endings = _setup(limit_mb=0)
    for inst in (a, b):
        router.submit(mv, _item(inst.index), 0.0)
    router.submit(mv, _item(9), 0.0)  # queued: both are busy
    for inst in (b, a):  # b first: a is then the last
        del endings.table.by_ident[inst.ident]
        loss = endings.lost(inst, stopping=True, now=1.0)
    assert [(i.request.req_id, "no instance left" in e.message) for i, e in loss.answers] == [
        (0, False), (9, True)
    ]  # fmt: skip
    assert mv.exits == {} and mv.state == "UNAVAILABLE"  # (a stop is not counted)


def test_a_killed_instance_s_requests_say_why() -> None:
    mv, router, (a, _), _, endings = _setup(limit_mb=0)
    router.submit(mv, _item(1), 0.0)
    endings.kill(a, "execution_timeout", "it hung")
    del endings.table.by_ident[a.ident]
    loss = endings.lost(a, stopping=False, now=1.0)
    assert loss.error.message.endswith("(pid 1000) was killed (it hung)")
    assert mv.exits == {"execution_timeout": 1}
