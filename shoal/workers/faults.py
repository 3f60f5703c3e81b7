"""Fault injection for the fault tests: what ``SHOAL_TEST_FAULT``'s action makes a worker do
(see shoal/workers/__main__.py). Never set outside tests."""

from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np
import zmq

from shoal.ipc import messages as m
from shoal.ipc import sockets

log = logging.getLogger("shoal.worker")

_LEAKED: list[np.ndarray] = []


def leak(slow: bool) -> None:
    """Hold on to 256 MiB more (written, so resident), as a model that leaks; ``slow``:
    then take 20 s, as one that leaks inside a long batch."""
    log.warning("fault injection: holding on to 256 MiB more%s", ", then taking 20 s" * slow)
    _LEAKED.append(np.ones(256 << 20, dtype=np.uint8))
    if slow:
        time.sleep(20)


def die_after_report(sock: zmq.Socket[bytes], done: m.BatchDone) -> None:
    """The report reaches the broker (through ``sock``), the answers never leave, then
    SIGKILL, as when a kill lands before the I/O thread wrote them."""
    log.warning("fault injection: reporting batch %d done, then dying", done.batch_id)
    sockets.send_frames(sock, m.encode(done))
    time.sleep(0.2)  # the report leaves
    os.kill(os.getpid(), signal.SIGKILL)
