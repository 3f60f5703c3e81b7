"""A worker lets go of an exited frontend's result link even when no broker told it
(the frontend exited while no broker ran)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from shoal.ipc import sockets
from shoal.ipc.result_link import ResultSender, listen
from shoal.workers.loading import WorkerSettings
from shoal.workers.proc import WorkerProc


def test_the_result_link_of_an_exited_frontend_is_closed(tmp_path: Path) -> None:
    worker = WorkerProc(WorkerSettings(tmp_path, "simple", 1, 0, tmp_path))
    exited = subprocess.Popen(["true"])
    exited.wait()  # reaped: its pid names no process
    gone, alive = f"f-0-{exited.pid}".encode(), f"f-1-{os.getpid()}".encode()
    listeners = [listen(sockets.result_path(tmp_path, ident)) for ident in (gone, alive)]
    links = {ident: ResultSender(sockets.result_path(tmp_path, ident)) for ident in (gone, alive)}
    worker.result_socks.update(links)
    try:
        worker._forget_exited_frontends()
        assert list(worker.result_socks) == [alive]
        assert links[gone].closed and not links[alive].closed
        # and what would have gone to it is dropped, not sent on a new link
        worker._answer_frontend(gone, [b"x"])
        assert list(worker.result_socks) == [alive]
    finally:
        worker.close()
        for listener in listeners:
            listener.close()
