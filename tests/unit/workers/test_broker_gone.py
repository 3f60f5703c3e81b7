"""A worker whose broker is gone by the time it watches it rejoins the next one as such."""

from __future__ import annotations

import subprocess
from pathlib import Path

import zmq

from shoal.workers.loading import WorkerSettings
from shoal.workers.proc import WorkerProc


def test_a_broker_gone_before_it_is_watched_makes_the_next_hello_a_rejoin(tmp_path: Path) -> None:
    """The race a fault test met: the broker welcomed the worker, then was killed and
    reaped while the worker loaded its model. Without ``rejoin`` the next broker would
    wait for every instance of the version, those that died meanwhile included."""
    worker = WorkerProc(WorkerSettings(tmp_path, "simple", 1, 0, tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    try:
        assert not worker.rejoin
        worker._watch_broker(gone.pid, zmq.Poller())
        assert worker.broker_pidfd is None and worker.rejoin
    finally:
        worker.close()
