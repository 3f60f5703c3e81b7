"""The broker watches each peer's pid (a pidfd): a peer it cannot watch yet, for lack of
descriptors, is retried on every tick, never taken for dead nor forgotten."""

from __future__ import annotations

import errno
import os

import pytest

from shoal.broker import proc as broker_proc
from shoal.broker.proc import BrokerProc


def test_a_peer_that_cannot_be_watched_yet_is_retried(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost: list[bytes] = []
    monkeypatch.setattr(broker, "_lost", lambda role, ident: lost.append(ident))

    def out_of_descriptors(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(broker_proc.os, "pidfd_open", out_of_descriptors)
    broker._watch(b"frontend-1", os.getpid(), "frontend")
    assert broker._unwatched == {b"frontend-1": (os.getpid(), "frontend")}
    assert broker.pidfds == {} and lost == []
    broker._tick()  # still out of descriptors: still waiting, still alive
    assert b"frontend-1" in broker._unwatched and lost == []
    monkeypatch.undo()
    monkeypatch.setattr(broker, "_lost", lambda role, ident: lost.append(ident))
    broker._tick()
    assert broker._unwatched == {}
    assert list(broker.pidfds.values()) == [("frontend", b"frontend-1")]
    assert lost == []


def test_a_peer_already_gone_is_lost_at_once(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost: list[bytes] = []
    monkeypatch.setattr(broker, "_lost", lambda role, ident: lost.append(ident))

    def gone(pid: int) -> int:
        raise ProcessLookupError(errno.ESRCH, "No such process")

    monkeypatch.setattr(broker_proc.os, "pidfd_open", gone)
    broker._watch(b"worker-1", 999_999_999, "worker")
    assert lost == [b"worker-1"] and broker._unwatched == {}
