"""A worker's hello as the model table takes it (shoal/broker/worker_hello.py): no sockets,
the pids it would watch recorded."""

from __future__ import annotations

import pytest

from shoal.broker.models import ModelTable
from shoal.broker.worker_hello import greet
from shoal.ipc import messages as m


@pytest.fixture
def table() -> ModelTable:
    t = ModelTable()
    t.add_model("simple", {1: 2}, "onnxruntime_onnx")
    return t


def _greet(
    table: ModelTable, hello: m.WorkerHello, managed: bool = False, ident: bytes = b"w0"
) -> tuple[object, list[tuple[bytes, int, str]]]:
    watched: list[tuple[bytes, int, str]] = []
    told = greet(table, managed, ident, hello, lambda i, pid, role: watched.append((i, pid, role)))
    return told, watched


def test_a_worker_of_an_expected_version_joins_it_loading(table: ModelTable) -> None:
    told, watched = _greet(table, m.WorkerHello("simple", 1, 1, 4242, gpu=0, name="simple_1"))
    assert told == "welcome" and watched == [(b"w0", 4242, "worker")]
    inst = table.by_ident[b"w0"]
    assert (inst.index, inst.pid, inst.gpu, inst.name, inst.state) == (
        1, 4242, 0, "simple_1", "LOADING"
    )  # fmt: skip
    mv = table.version("simple", 1)
    assert mv is not None and mv.instances == {b"w0": inst} and mv.state == "LOADING"
    told, watched = _greet(table, m.WorkerHello("simple", 1, 1, 4242))  # again: known
    assert told == "welcome" and watched == []


def test_a_rejoining_worker_makes_its_version_ready_once_it_is(table: ModelTable) -> None:
    _greet(table, m.WorkerHello("simple", 1, 0, 4242, rejoin=True))
    mv = table.version("simple", 1)
    assert mv is not None and mv.ever_ready
    table.by_ident[b"w0"].state = "READY"
    mv.refresh_state()
    assert mv.state == "READY"  # one of two instances: it served under the last broker


def test_workers_of_models_not_loaded_are_stopped_or_ignored(table: ModelTable) -> None:
    hello = m.WorkerHello("other", 1, 0, 4242)
    assert _greet(table, hello) == ("ignore", [])
    told, watched = _greet(table, hello, managed=True)
    assert told == m.Shutdown("its model is not loaded", retire=True) and watched == []
    table.add_ensemble("ens", [1], b"", [])
    told, _ = _greet(table, m.WorkerHello("ens", 1, 0, 4242))
    assert told == m.Shutdown("an ensemble has no instances")
    assert table.by_ident == {}
