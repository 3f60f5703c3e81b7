"""The loops' wait (shoal/ipc/event_wait.py) over real ZeroMQ sockets and descriptors in
one process: what is ready is reported, a message whose command was processed already is
not slept through, and an idle wait returns at its timeout."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from shoal.ipc import sockets
from shoal.ipc.event_wait import POLLIN, EventWait


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx: zmq.Context = zmq.Context()
    addr = f"ipc://{tmp_path}/w.sock"
    router = sockets.router(ctx, addr)
    dealer = sockets.dealer(ctx, addr, b"d")
    yield router, dealer
    router.close(0)
    dealer.close(0)
    ctx.term()


def _wait_for(waiter: EventWait, what: object, deadline_s: float = 5.0) -> dict[object, int]:
    """Polls until ``what`` is reported (a socket's first message may take a spurious
    turn or two: its connection's commands come first)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        events = dict(waiter.poll(int((end - time.monotonic()) * 1000) + 1))
        if what in events:
            return events
    raise AssertionError(f"{what!r} was never reported")


def test_a_message_and_a_descriptor_are_reported(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    router, dealer = pair
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    waiter = EventWait()
    try:
        waiter.register(router, zmq.POLLIN)
        waiter.register(fd, zmq.POLLIN)
        assert waiter.poll(0) == []
        dealer.send_multipart([b"k", b"hello"])
        assert _wait_for(waiter, router)[router] == POLLIN
        assert sockets.recv_frames(router, sockets.NOBLOCK) == [b"d", b"k", b"hello"]
        os.eventfd_write(fd, 1)
        assert _wait_for(waiter, fd)[fd] == POLLIN
        os.eventfd_read(fd)
        waiter.unregister(fd)
        os.eventfd_write(fd, 1)  # no longer watched
        assert fd not in dict(waiter.poll(0))
    finally:
        waiter.close()
        os.close(fd)


def test_a_message_already_taken_in_is_not_slept_through(
    pair: tuple[zmq.Socket, zmq.Socket],
) -> None:
    """ZMQ_FD fires once for commands: once something else (here ZMQ_EVENTS) has processed
    them, the descriptor is quiet while a message waits. The wait must still see it."""
    router, dealer = pair
    waiter = EventWait()
    try:
        waiter.register(router)
        dealer.send_multipart([b"k", b"one"])
        end = time.monotonic() + 5
        while not sockets.readable(router):  # the command is processed here, not by the wait
            assert time.monotonic() < end
        # (slept through, it would come back empty at its timeout: nothing fires again)
        assert dict(waiter.poll(2000)).get(router) == POLLIN
    finally:
        waiter.close()


def test_an_idle_wait_ends_at_its_timeout(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    router, dealer = pair
    waiter = EventWait()
    try:
        waiter.register(router)
        # the connection's commands first (they fire the socket's descriptor: a spurious
        # turn), through one message handled: what follows is an idle socket
        dealer.send_multipart([b"k", b"settle"])
        _wait_for(waiter, router)
        assert sockets.recv_frames(router)[1:] == [b"k", b"settle"]
        assert not sockets.readable(router)
        t0 = time.monotonic()
        assert waiter.poll(50) == []
        assert time.monotonic() - t0 >= 0.04
    finally:
        waiter.close()
