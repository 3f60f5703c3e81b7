"""The wait of a process loop that is not asyncio's (the broker's, a worker's): ZeroMQ
sockets and plain file descriptors (pidfds, eventfds, timerfds), with the interface of
``zmq.Poller`` (``register``, ``unregister``, ``poll`` -> ``[(socket or fd, POLLIN)]``).

Why not ``zmq.Poller``: each of its calls asks every ZeroMQ socket for ZMQ_EVENTS before
and after its own ``poll(2)``, and a first ``poll(2)`` with no timeout besides; each ask is
a ``poll(2)`` and a ``getpid(2)`` inside libzmq. A turn of the broker's loop cost ten
``poll(2)`` calls that way (strace, one request at a time). Here one ``epoll_wait`` sleeps
on every descriptor, each socket's ZMQ_FD among them, and only the sockets are asked,
once, before it sleeps: ZMQ_FD says only that the socket has commands to process, and a
message may be waiting already (its command processed by an earlier send or receive), so
the ask is what makes the sleep safe.

A socket whose ZMQ_FD fired is reported without asking: the caller's drain asks anyway
(``sockets.readable``) and may find nothing (a spurious turn, as with ``zmq.Poller``
after a command alone). One thread: the loop's.
"""

from __future__ import annotations

import select

import zmq

from shoal.ipc.sockets import readable

POLLIN = int(zmq.POLLIN)


class EventWait:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sockets: dict[int, zmq.Socket] = {}  # ZMQ_FD -> its socket
        self._fds: dict[int, zmq.Socket | int] = {}  # every descriptor -> what it reports

    def register(self, what: zmq.Socket | int, flags: int = POLLIN) -> None:
        """Wait for a whole message on a ZeroMQ socket, or for a descriptor to be readable
        (only POLLIN is waited for, whatever ``flags`` say)."""
        fd = what.FD if isinstance(what, zmq.Socket) else what
        if isinstance(what, zmq.Socket):
            self._sockets[fd] = what
        if fd not in self._fds:
            self._epoll.register(fd, select.EPOLLIN)
        self._fds[fd] = what

    def unregister(self, what: zmq.Socket | int) -> None:
        fd = what.FD if isinstance(what, zmq.Socket) else what
        self._sockets.pop(fd, None)
        if self._fds.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def poll(self, timeout_ms: int) -> list[tuple[zmq.Socket | int, int]]:
        """What is ready now, or once something is (at most ``timeout_ms``)."""
        ready: list[tuple[zmq.Socket | int, int]] = [
            (s, POLLIN) for s in self._sockets.values() if readable(s)
        ]
        fired = self._epoll.poll(0 if ready else timeout_ms / 1000)
        for fd, _ in fired:
            what = self._fds.get(fd)
            if what is not None and not (isinstance(what, zmq.Socket) and (what, POLLIN) in ready):
                ready.append((what, POLLIN))
        return ready

    def close(self) -> None:
        self._epoll.close()
