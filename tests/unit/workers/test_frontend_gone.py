"""A worker lets go of an exited frontend's result socket even when no broker told it
(the frontend exited while no broker ran)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import zmq

from shoal.workers.loading import WorkerSettings
from shoal.workers.proc import WorkerProc


def test_the_result_socket_of_an_exited_frontend_is_closed(tmp_path: Path) -> None:
    worker = WorkerProc(WorkerSettings(tmp_path, "simple", 1, 0, tmp_path))
    exited = subprocess.Popen(["true"])
    exited.wait()  # reaped: its pid names no process
    gone, alive = f"f-0-{exited.pid}".encode(), f"f-1-{os.getpid()}".encode()
    socks = {ident: worker.ctx.socket(zmq.PUSH) for ident in (gone, alive)}
    worker.result_socks.update(socks)
    try:
        worker._forget_exited_frontends()
        assert list(worker.result_socks) == [alive]
        assert socks[gone].closed and not socks[alive].closed
    finally:
        worker.close()
