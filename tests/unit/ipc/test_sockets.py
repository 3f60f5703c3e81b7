"""The runtime directory: private, and never left behind by a launcher that was killed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ipc.sockets import ensure_runtime_dir, sweep_runtime_dirs


def test_a_killed_launcher_s_runtime_dir_goes_at_the_next_start() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tmp = Path(tempfile.gettempdir())
    stale = tmp / f"shoal-run-{gone.pid}-k1lled"
    live = tmp / f"shoal-run-{os.getpid()}-alive"
    other = tmp / f"shoal-runner-{gone.pid}-notours"
    for d in (stale, live, other):
        d.mkdir()
        (d / "workers.sock").touch()
    fresh = None
    try:
        fresh = ensure_runtime_dir(None)  # what a launcher without --runtime-dir does
        assert fresh.name.startswith(f"shoal-run-{os.getpid()}-")
        assert oct(fresh.stat().st_mode & 0o777) == "0o700"
        assert not stale.exists()
        assert live.exists() and other.exists()  # a live pid's, and a name not ours
        assert sweep_runtime_dirs() == []
    finally:
        for d in (stale, live, other, fresh):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
