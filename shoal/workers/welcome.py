"""A starting worker's waits for the broker's welcome (shoal/workers/proc.py): before it
loads its model, and after a failed load, so that the failure is read. Functions of the
worker's broker socket, called from its one thread."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import zmq

from shoal.ipc import logs
from shoal.ipc import messages as m

#: How long a failed worker stays for a broker to read its failure.
FAILED_REPORT_WAIT_S = 10.0
#: How long a starting worker waits for the broker's welcome before it loads its model:
#: the welcome carries the server's log settings, which the load's own lines should obey.
WELCOME_BEFORE_LOAD_S = 0.5


def before_load(sock: Any) -> tuple[int | None, m.Shutdown | None]:
    """The broker's pid from its welcome, if one comes within WELCOME_BEFORE_LOAD_S (its
    log settings applied; None if the broker is not there yet), and the Shutdown it sent
    meanwhile, if any. Nothing else the broker sends before WorkerReady needs this worker
    (no region is mapped yet)."""
    shutdown = None
    deadline = time.monotonic() + WELCOME_BEFORE_LOAD_S
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
            return None, shutdown
        frames = sock.recv_multipart(copy=True)
        try:
            msg = m.decode(frames[0], frames[1])
        except (ValueError, IndexError):
            continue
        if isinstance(msg, m.Welcome | m.LogSettings):
            settings = msg.log if isinstance(msg, m.Welcome) else msg
            if settings is not None:
                logs.apply(settings)
        if isinstance(msg, m.Welcome):
            return msg.broker_pid, shutdown
        if isinstance(msg, m.Shutdown):
            shutdown = msg
    return None, shutdown


def after_failure(sock: Any, stopping: Callable[[], bool]) -> None:
    """Stay until a broker has read this worker's hello, and so the failure queued behind
    it (at most FAILED_REPORT_WAIT_S, or until ``stopping()``).

    The socket drops unsent messages when it closes: a worker that fails before the
    broker binds (a loaded host, or supervisord starting it first) would otherwise leave
    its model LOADING for good, with the reason lost.
    """
    deadline = time.monotonic() + FAILED_REPORT_WAIT_S
    while not stopping() and time.monotonic() < deadline:
        if not sock.poll(100, zmq.POLLIN):
            continue
        frames = sock.recv_multipart(copy=True)
        with contextlib.suppress(ValueError, IndexError):
            if isinstance(m.decode(frames[0], frames[1]), m.Welcome):
                return
