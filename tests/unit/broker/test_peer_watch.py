"""The broker watches each peer's pid (a pidfd, shoal/broker/peers.py): a peer it cannot
watch yet, for lack of descriptors, is retried on every tick, never taken for dead nor
forgotten; one already gone is lost at once; an exit is seen through the epoll set."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from shoal.broker import peers as peers_mod
from shoal.broker.peers import PeerWatch
from shoal.broker.proc import BrokerProc
from shoal.ipc import messages as m


@pytest.fixture
def lost() -> list[tuple[str, bytes]]:
    return []


@pytest.fixture
def peers(lost: list[tuple[str, bytes]]) -> Iterator[PeerWatch]:
    watch = PeerWatch(lambda role, ident: lost.append((role, ident)))
    yield watch
    watch.close()


def test_a_peer_that_cannot_be_watched_yet_is_retried(
    peers: PeerWatch, lost: list[tuple[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def out_of_descriptors(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(peers_mod.os, "pidfd_open", out_of_descriptors)
    peers.watch(b"frontend-1", os.getpid(), "frontend")
    assert peers.unwatched == {b"frontend-1": (os.getpid(), "frontend")}
    assert peers.pidfds == {} and lost == []
    assert peers.knows(b"frontend-1") and peers.frontends() == [b"frontend-1"]
    peers.retry()  # still out of descriptors: still waiting, still alive
    assert b"frontend-1" in peers.unwatched and lost == []
    monkeypatch.undo()
    peers.retry()
    assert peers.unwatched == {}
    assert list(peers.pidfds.values()) == [("frontend", b"frontend-1")]
    assert peers.frontends() == [b"frontend-1"] and lost == []


def test_a_peer_already_gone_is_lost_at_once(
    peers: PeerWatch, lost: list[tuple[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def gone(pid: int) -> int:
        raise ProcessLookupError(errno.ESRCH, "No such process")

    monkeypatch.setattr(peers_mod.os, "pidfd_open", gone)
    peers.watch(b"worker-1", 999_999_999, "worker")
    assert lost == [("worker", b"worker-1")] and peers.unwatched == {}


def test_a_peer_s_exit_is_seen_once(peers: PeerWatch, lost: list[tuple[str, bytes]]) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    peers.watch(b"worker-2", child.pid, "worker")
    peers.reap()
    assert lost == []
    assert child.stdin is not None
    child.stdin.close()
    child.wait()
    peers.reap()
    peers.reap()
    assert lost == [("worker", b"worker-2")] and peers.pidfds == {}


def test_a_broadcast_reaches_every_frontend_watched_or_not_yet(
    broker: BrokerProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[bytes]] = []
    monkeypatch.setattr(broker.out, "send", lambda sock, frames: sent.append(frames))
    broker.peers.watch(b"frontend-2", os.getpid(), "frontend")
    broker.peers.unwatched[b"frontend-3"] = (os.getpid(), "frontend")
    broker.peers.unwatched[b"worker-3"] = (os.getpid(), "worker")
    broker.out.to_frontends([b"K", b"payload"])
    assert sent == [[b"frontend-2", b"K", b"payload"], [b"frontend-3", b"K", b"payload"]]


def test_a_message_to_a_peer_that_is_gone_is_dropped(broker: BrokerProc) -> None:
    broker.out.to_frontend(b"nobody", m.Shutdown("gone"))  # (EHOSTUNREACH: no raise)
