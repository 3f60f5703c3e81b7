"""Triton's repository extension as the data plane serves it
(shoal/dataplane/repository_extension.py), over a stand-in broker client that answers each
query from the test: no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from shoal.dataplane.repository_extension import RepositoryExtension
from shoal.ipc import messages as m
from shoal.ipc.errors import MODEL_CONTROL_DISABLED, Code, ServingError


class Broker:
    """What the extension asks of the broker client: numbered queries, their replies."""

    def __init__(self, *replies: msgspec.Struct | ServingError, model_control: bool = True) -> None:
        self.replies = list(replies)
        self.asked: list[msgspec.Struct] = []
        self.model_control = model_control
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def query(self, msg: msgspec.Struct, kind: type, timeout: float = 0) -> Any:
        self.asked.append(msg)
        reply = self.replies.pop(0)
        if isinstance(reply, ServingError):
            raise reply
        assert isinstance(reply, kind)
        return reply


_STATES = [
    m.ModelState("broken", -1, "", "config.pbtxt: no such field"),
    m.ModelState("simple", 1, "READY"),
    m.ModelState("simple", 2, "UNAVAILABLE", "its load failed"),
    m.ModelState("acc", 1, "READY", sequences=m.SequenceSummary("direct", 1, 1, 0)),
]


def test_the_index_lists_each_version_and_a_broken_model_by_name() -> None:
    ext = RepositoryExtension(Broker(m.ServerState(1, True, True, _STATES)))  # type: ignore[arg-type]
    assert asyncio.run(ext.index(ready_only=False)) == [
        {"name": "broken", "reason": "config.pbtxt: no such field"},
        {"name": "simple", "version": "1", "state": "READY"},
        {"name": "simple", "version": "2", "state": "UNAVAILABLE", "reason": "its load failed"},
        {"name": "acc", "version": "1", "state": "READY"},
    ]
    ext = RepositoryExtension(Broker(m.ServerState(1, True, True, _STATES)))  # type: ignore[arg-type]
    assert asyncio.run(ext.index(ready_only=True)) == [
        {"name": "simple", "version": "1", "state": "READY"},
        {"name": "acc", "version": "1", "state": "READY"},
    ]


def test_without_a_broker_the_index_is_unavailable() -> None:
    ext = RepositoryExtension(Broker(ServingError(Code.UNAVAILABLE, "no broker")))  # type: ignore[arg-type]
    with pytest.raises(ServingError) as err:
        asyncio.run(ext.index(ready_only=False))
    assert err.value.message == "Server is not ready: no broker connection"


def test_a_model_s_instances_and_an_unknown_model() -> None:
    states = [m.ServerState(i, True, True, _STATES) for i in (1, 2, 3)]
    broker = Broker(*states)
    ext = RepositoryExtension(broker)  # type: ignore[arg-type]
    doc = asyncio.run(ext.model_instances("simple"))
    assert [v["version"] for v in doc["versions"]] == [1, 2]
    assert "sequence_batcher" not in doc["versions"][0]
    assert isinstance(broker.asked[0], m.ServerQuery) and broker.asked[0].memory_of == "simple"
    (acc,) = asyncio.run(ext.model_instances("acc"))["versions"]
    assert acc["sequence_batcher"] == {
        "strategy": "direct", "slots_per_instance": 1, "in_slots": 1, "backlog": 0
    }  # fmt: skip
    with pytest.raises(ServingError) as err:
        asyncio.run(ext.model_instances("absent"))
    assert err.value.code == Code.NOT_FOUND


def test_load_and_unload_outside_explicit_mode_and_their_answers() -> None:
    off = RepositoryExtension(Broker(model_control=False))  # type: ignore[arg-type]
    refusal = off.refuse_model_control()
    assert refusal is not None and refusal.message == MODEL_CONTROL_DISABLED
    failed = m.ControlReply(1, m.ErrorInfo(int(Code.INVALID_ARG), "load failed for model 'x'"))
    broker = Broker(m.ControlReply(1), failed)
    ext = RepositoryExtension(broker)  # type: ignore[arg-type]
    assert ext.refuse_model_control() is None
    asyncio.run(ext.model_control("unload", "simple", unload_dependents=True))
    assert isinstance(broker.asked[0], m.ModelControl) and broker.asked[0].unload_dependents
    with pytest.raises(ServingError) as err:
        asyncio.run(ext.model_control("load", "x"))
    assert (err.value.code, err.value.message) == (Code.INVALID_ARG, "load failed for model 'x'")
