"""The broker's answers to the frontends' queries (shoal/broker/queries.py), over a model
table filled by hand: no sockets, no workers, memory read from a dictionary."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from shoal.broker.client_shm_requests import ClientRegions
from shoal.broker.control import ModelControl
from shoal.broker.endings import Endings
from shoal.broker.memory import MIB
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.queries import Queries
from shoal.broker.router import Router
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError

MEMORY = {1000: 64 * MIB}


def _queries(tmp_path: Path, namespacing: bool = False) -> Queries:
    table = ModelTable()
    router = Router(table)
    control = ModelControl(table, tmp_path, tmp_path, explicit=False)
    endings = Endings(table, router, 300.0, 100, kill=lambda i: None, ask_to_stop=lambda i: None)
    return Queries(table, control, router, endings, ClientRegions(), namespacing, MEMORY.get)


def _ready(q: Queries, name: str = "simple", version: int = 1) -> ModelVersion:
    """A version with one READY instance (pid 1000), as its worker's WorkerReady leaves it."""
    q.table.add_model(name, {version: 1}, "onnxruntime_onnx")
    mv = q.table.version(name, version)
    assert mv is not None
    mv.set_config(mc.ModelConfig(name=name).SerializeToString())
    inst = Instance(f"w-{name}-{version}".encode(), name, version, 0, 1000, state="READY")
    mv.add_instance(inst)
    q.table.by_ident[inst.ident] = inst
    mv.refresh_state()
    return mv


def _error(q: Queries, name: str, version: int) -> tuple[Code, str]:
    with pytest.raises(ServingError) as err:
        q.lookup(name, version)
    return err.value.code, err.value.message


def test_lookup_finds_the_ready_version_or_says_why_not_in_triton_s_words(tmp_path: Path) -> None:
    q = _queries(tmp_path)
    mv = _ready(q)
    assert q.lookup("simple", 1) is mv and q.lookup("simple", -1) is mv
    assert _error(q, "absent", -1) == (
        Code.NOT_FOUND,
        "Request for unknown model: 'absent' is not found",
    )
    assert _error(q, "simple", 2) == (
        Code.NOT_FOUND, "Request for unknown model: 'simple' version 2 is not found"
    )  # fmt: skip
    q.table.add_model("loading", {1: 1}, "onnxruntime_onnx")
    assert _error(q, "loading", 1) == (
        Code.UNAVAILABLE, "Request for unknown model: 'loading' version 1 is not at ready state"
    )  # fmt: skip
    q.control.unloaded["gone"] = {1: "unloaded"}
    assert _error(q, "gone", -1) == (
        Code.NOT_FOUND, "Request for unknown model: 'gone' has no available versions"
    )  # fmt: skip


def test_an_ambiguous_name_is_refused_when_names_are_qualified(tmp_path: Path) -> None:
    q = _queries(tmp_path, namespacing=True)
    _ready(q, "m@1")
    _ready(q, "m@2")
    assert _error(q, "m", -1) == (
        Code.INVALID_ARG,
        "There are 2 identifiers of model 'm' in global map, model namespace must be provided "
        "to resolve ambiguity.",
    )


def test_a_request_for_a_version_of_passive_instances_only_is_refused(tmp_path: Path) -> None:
    q = _queries(tmp_path)
    mv = _ready(q)
    mv.passive = frozenset({0})
    req = m.InferRequest(1, "simple", -1, [], [])
    with pytest.raises(ServingError) as err:
        q.admissible(req)
    assert err.value.code == Code.UNAVAILABLE and "only passive instances" in err.value.message
    assert req.version == 1  # resolved once: its answer finds the same version


def test_model_info_and_statistics(tmp_path: Path) -> None:
    q = _queries(tmp_path)
    _ready(q)
    info = q.model_info(m.ModelQuery(7, "simple", -1))
    assert (info.query_id, info.error, info.version, info.versions) == (7, None, 1, [1])
    missing = q.model_info(m.ModelQuery(8, "absent", -1))
    assert missing.error is not None and missing.error.code == int(Code.NOT_FOUND)
    stats = q.stats(m.StatsQuery(9, "simple", 1))
    assert stats.error is None and [s.name for s in stats.model_stats] == ["simple"]
    wrong = q.stats(m.StatsQuery(10, "simple", 4))
    assert wrong.error == m.ErrorInfo(
        int(Code.INVALID_ARG), "requested model version is not available for model 'simple'"
    )


def test_the_server_is_ready_once_every_model_is_unless_readiness_is_lenient(
    tmp_path: Path,
) -> None:
    q = _queries(tmp_path)
    _ready(q)
    q.table.add_model("loading", {1: 1}, "onnxruntime_onnx")
    assert not q.server_state(m.ServerQuery(1)).ready
    assert q.server_state(m.ServerQuery(2), strict_readiness=False).ready
    # (lenient readiness, as Triton's: not before the start-up loads are over)
    assert not q.server_state(m.ServerQuery(2), strict_readiness=False, started=False).ready
    state = q.server_state(m.ServerQuery(3, "simple"))
    (simple,) = [s for s in state.models if s.name == "simple"]
    assert simple.memory_limit_mb == 100
    assert [i.memory_mb for i in simple.instances] == [64]


def test_strict_readiness_names_the_instances_whose_model_checks_its_own(
    tmp_path: Path,
) -> None:
    """As Triton's server readiness asks each READY model's runtime check (a Python
    model's ``is_ready``): the frontend is told which instances to ask, under strict
    readiness only, and only once every model is loaded."""
    q = _queries(tmp_path)
    _ready(q)
    gated = _ready(q, "gated")
    (inst,) = gated.live()
    assert q.server_state(m.ServerQuery(1)).ready_checks == []
    inst.checks_ready = True
    assert q.server_state(m.ServerQuery(2)).ready_checks == [inst.pid]
    assert q.server_state(m.ServerQuery(3), strict_readiness=False).ready_checks == []
    q.table.add_model("loading", {1: 1}, "onnxruntime_onnx")
    state = q.server_state(m.ServerQuery(4))
    assert not state.ready and state.ready_checks == []


def test_metrics_read_each_instance_s_memory(tmp_path: Path) -> None:
    q = _queries(tmp_path)
    _ready(q)
    (vm,) = q.metrics([0.5], now=1.0)
    assert vm.memory == {0: 64 * MIB} and vm.memory_limit == 100 * MIB


def _weighted(q: Queries, weights: str) -> None:
    """Versions 1 and 2 of ``ab``, READY, whose config splits traffic by ``weights``."""
    for version in (1, 2):
        mv = _ready(q, "ab", version)
        cfg = mc.ModelConfig(name="ab")
        cfg.parameters["shoal_version_weights"].string_value = weights
        mv.config = b""  # (set_config keeps the first config it is given)
        mv.set_config(cfg.SerializeToString())


def _admitted(q: Queries, **fields: object) -> int:
    req = m.InferRequest(1, "ab", -1, [], [], **fields)  # type: ignore[arg-type]
    return q.admissible(req)[0].version


def test_a_request_naming_no_version_is_routed_by_the_weights(tmp_path: Path) -> None:
    q = _queries(tmp_path)
    _weighted(q, "1:1,2:3")
    assert q.lookup("ab", -1).version == 2  # metadata: the latest, and no turn taken
    assert [_admitted(q) for _ in range(8)] == [2, 1, 2, 2, 2, 1, 2, 2]
    keyed = _admitted(q, route_key="user-7")
    assert all(_admitted(q, route_key="user-7") == keyed for _ in range(5))
    # a sequence's requests go where its id hashes, every one of them
    by_id = {sid: _admitted(q, sequence_id=sid, sequence_start=True) for sid in range(1, 9)}
    assert set(by_id.values()) == {1, 2}
    assert all(_admitted(q, sequence_id=sid) == v for sid, v in by_id.items())
