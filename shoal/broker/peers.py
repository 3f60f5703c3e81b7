"""The broker's watch over its peers' lives: one pidfd per frontend and worker, all in one
epoll set (itself one entry of the broker's poll set, so that a turn of the loop costs the
same with 2 peers or 200).

Peers are siblings (under supervisord), not children: liveness comes from the pid each
hello carries. A peer already gone when it is watched is lost at once; one that cannot be
watched yet (out of descriptors) is alive, and retried on every ``retry``. A pid number may
be reused: an instance is killed through its pidfd where there is one. ``pin_threads``
confines a worker's threads to the cores the broker's lender gives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
from collections.abc import Callable

from shoal.broker.models import Instance

log = logging.getLogger("shoal.broker")

Role = str  # "frontend" | "worker"


class PeerWatch:
    def __init__(self, lost: Callable[[Role, bytes], None]) -> None:
        """``lost(role, ident)``: a peer exited (or was gone when watched)."""
        self._lost = lost
        self.epoll = select.epoll()  # the peers' pidfds: readable once a peer exits
        self.pidfds: dict[int, tuple[Role, bytes]] = {}  # fd -> (role, ident)
        self.unwatched: dict[bytes, tuple[int, Role]] = {}  # pidfd_open failed: retry
        self.frontend_fds: dict[bytes, int] = {}

    def fileno(self) -> int:
        return self.epoll.fileno()

    def watch(self, ident: bytes, pid: int, role: Role) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            log.warning("%s pid %d is already gone", role, pid)
            self._lost(role, ident)
            return
        except OSError as exc:  # out of descriptors, say: the peer is alive; retried
            if ident not in self.unwatched:
                log.error("cannot watch %s pid %d yet (%s): retrying", role, pid, exc)
            self.unwatched[ident] = (pid, role)
            return
        self.pidfds[fd] = (role, ident)
        self.epoll.register(fd, select.EPOLLIN)
        if role == "frontend":
            old = self.frontend_fds.pop(ident, None)
            if old is not None:
                self._unwatch(old)
            self.frontend_fds[ident] = fd

    def retry(self) -> None:
        """Watch again the peers that could not be watched yet."""
        for ident, (pid, role) in list(self.unwatched.items()):
            del self.unwatched[ident]
            self.watch(ident, pid, role)  # back in unwatched if it fails again

    def reap(self) -> None:
        """Every peer whose exit the epoll set reports is lost."""
        for fd, _ in self.epoll.poll(0):
            if fd in self.pidfds:
                role, ident = self.pidfds[fd]
                self._unwatch(fd)
                self._lost(role, ident)

    def frontends(self) -> list[bytes]:
        """Every frontend known (watched or not yet)."""
        waiting = [i for i, (_, role) in self.unwatched.items() if role == "frontend"]
        return [*self.frontend_fds, *waiting]

    def knows(self, frontend: bytes) -> bool:
        return frontend in self.frontend_fds or frontend in self.unwatched

    def frontend_lost(self, frontend: bytes) -> None:
        self.frontend_fds.pop(frontend, None)

    def kill_frontend(self, frontend: bytes) -> None:
        """SIGKILL a frontend, through its pidfd where there is one; by its pid only while
        it could not be watched yet (a pid number may be reused)."""
        fd = self.frontend_fds.get(frontend)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            elif frontend in self.unwatched:
                os.kill(self.unwatched[frontend][0], signal.SIGKILL)

    def kill(self, inst: Instance) -> None:
        """SIGKILL, through its pidfd where there is one (a pid number may be reused);
        its death, seen through that pidfd, answers its requests."""
        fd = next((fd for fd, (_, ident) in self.pidfds.items() if ident == inst.ident), None)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(inst.pid, signal.SIGKILL)

    def _unwatch(self, fd: int) -> None:
        self.pidfds.pop(fd, None)
        self.epoll.unregister(fd)
        os.close(fd)

    def close(self) -> None:
        for fd in list(self.pidfds):
            self._unwatch(fd)
        self.epoll.close()


def pin_threads(pid: int, cores: tuple[int, ...]) -> None:
    """Confine every thread of process ``pid`` to ``cores`` now (a thread it starts later
    inherits its creator's); nothing if it exited meanwhile."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cores)
