"""The runtime directory: private, and never left behind by a launcher that was killed."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from shoal.ipc.sockets import (
    ensure_runtime_dir,
    running_frontends,
    sweep_runtime_dirs,
    sweep_stale_results,
)


def test_a_killed_launcher_s_runtime_dir_goes_at_the_next_start() -> None:
    """A dir goes when nobody holds its lock, whatever pid its name carries (a pid
    namespace sharing /tmp sees other pids, or none); one without a lock file is not
    one of ours."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tmp = Path(tempfile.gettempdir())
    stale = tmp / f"shoal-run-{os.getpid()}-k1lled"  # a live pid, but no one holds it
    held = tmp / f"shoal-run-{gone.pid}-elsewhere"  # a pid not seen here, but held
    foreign = tmp / f"shoal-run-{gone.pid}-nolock"
    for d in (stale, held, foreign):
        d.mkdir()
        (d / "workers.sock").touch()
    for d in (stale, held):
        (d / ".lock").touch()
    holder = os.open(held / ".lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    fresh = None
    try:
        fresh = ensure_runtime_dir(None)  # what a launcher without --runtime-dir does
        assert fresh.name.startswith(f"shoal-run-{os.getpid()}-")
        assert oct(fresh.stat().st_mode & 0o777) == "0o700"
        assert not stale.exists()
        assert held.exists() and foreign.exists()
        assert sweep_runtime_dirs() == []  # the fresh one is held by this process
        assert fresh.exists()
    finally:
        os.close(holder)
        for d in (stale, held, foreign, fresh):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)


def test_result_sockets_of_frontends_that_are_gone_are_swept(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"results-f-0-{gone.pid}.sock"
    alive = tmp_path / f"results-f-1-{os.getpid()}.sock"
    other = tmp_path / "workers.sock"
    for path in (dead, alive, other):
        path.touch()
    assert sweep_stale_results(tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and other.exists()


def test_the_running_frontends_of_a_runtime_dir_are_found_by_their_result_sockets(
    tmp_path: Path,
) -> None:
    """A broker that starts judges the frontends already running (one stuck before it
    started would never greet it); a process that took a dead frontend's pid is none."""
    runtime = tmp_path / "run"
    runtime.mkdir()
    code = "import sys, time; time.sleep(60)"
    frontend = subprocess.Popen(
        [sys.executable, "-c", code, "shoal.frontend", "--runtime-dir", str(runtime)]
    )
    elsewhere = subprocess.Popen(
        [sys.executable, "-c", code, "shoal.frontend", f"--runtime-dir={tmp_path}"]
    )
    try:
        for pid in (frontend.pid, elsewhere.pid, os.getpid()):
            (runtime / f"results-f-0-{pid}.sock").touch()
        assert running_frontends(runtime) == [(f"f-0-{frontend.pid}".encode(), frontend.pid)]
    finally:
        for p in (frontend, elsewhere):
            p.kill()
            p.wait()
    assert running_frontends(runtime) == []
