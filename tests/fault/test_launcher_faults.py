"""The launcher killed outright takes every child with it, and the segments a killed
server leaves are swept by the next one."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.fault.conftest import mlp_input
from tests.serverctl import SHM_DIR, ShoalServer, processes_with
from tools import modelgen


def _kill_launcher_and_expect_no_child(srv: ShoalServer) -> None:
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    deadline = time.monotonic() + 15
    while processes_with(srv.runtime_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(srv.runtime_dir)


def test_launcher_killed_takes_every_child_with_it(small_repo: Path) -> None:
    srv = ShoalServer(small_repo)
    children = srv.pids()
    assert len(children) == 4  # broker, frontend, two workers
    _kill_launcher_and_expect_no_child(srv)
    # The frontend got SIGTERM from the kernel and unlinked its own slab.
    assert not srv.leftovers()
    srv._log.close()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_launcher_killed_takes_even_a_worker_stuck_in_native_code(tmp_path: Path) -> None:
    """A worker spinning inside TorchScript never runs a Python signal handler, so the
    SIGTERM its parent's death used to send left it running, an orphan, with the broker
    (whose execution timeout would have killed it) gone too."""
    from tools import torchgen

    modelgen.write_model(
        tmp_path, "spin", torchgen.spin_model(),
        'platform: "pytorch_libtorch"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU } ]\n",
        filename="model.pt",
    )  # fmt: skip
    srv = ShoalServer(tmp_path)
    worker = srv.worker_pid("spin")
    idle = _cpu_ticks(worker)  # what loading took: spinning is 0.2 s of CPU beyond it
    outcome: list[BaseException] = []

    def hung() -> None:  # in a thread: the request goes out at once
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.ones(1, dtype=np.float32))
        try:
            client.infer("spin", [inp])
        except BaseException as exc:  # asserted below
            outcome.append(exc)
        finally:
            client.close()

    caller = threading.Thread(target=hung)
    caller.start()
    deadline = time.monotonic() + 10
    while _cpu_ticks(worker) < idle + 20 and time.monotonic() < deadline:
        time.sleep(0.1)  # until the worker is spinning inside forward
    assert _cpu_ticks(worker) >= idle + 20, "the spin model never started"
    _kill_launcher_and_expect_no_child(srv)
    caller.join(30)
    assert len(outcome) == 1, outcome  # the request failed: its frontend went
    assert not srv.leftovers()
    srv._log.close()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def test_stale_segments_of_dead_owners_are_swept_at_startup(small_repo: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = SHM_DIR / f"shoal-{dead.pid}-front-{secrets.token_hex(8)}"
    stale.write_bytes(b"\0" * 4096)
    srv = ShoalServer(small_repo)
    try:
        assert not stale.exists()
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@pytest.mark.serial  # a server started beside it would sweep the segments it checks
def test_segments_of_a_server_killed_outright_are_swept_by_the_next(small_repo: Path) -> None:
    first = ShoalServer(small_repo)
    client = httpclient.InferenceServerClient(first.url)
    client.infer("mlp", mlp_input())
    victims = [first.proc.pid, *first.pids()]
    owned = [
        p.name
        for p in SHM_DIR.iterdir()
        if p.name.startswith("shoal-") and int(p.name.split("-")[1]) in victims
    ]
    assert owned  # the frontend's slab
    for pid in victims:  # as an OOM kill of the whole tree would: nobody cleans up
        os.kill(pid, signal.SIGKILL)
    first.proc.wait()
    deadline = time.monotonic() + 10
    while processes_with(first.runtime_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all((SHM_DIR / n).exists() for n in owned)  # leaked, for now
    first._log.close()
    second = ShoalServer(small_repo)
    try:
        assert not any((SHM_DIR / n).exists() for n in owned)
    finally:
        second.stop()
        shutil.rmtree(second.runtime_dir, ignore_errors=True)
        shutil.rmtree(first.runtime_dir, ignore_errors=True)


def test_a_stopped_broker_does_not_outlive_a_killed_launcher(small_repo: Path) -> None:
    """The launcher SIGKILLed while its broker is stopped (SIGSTOP, a debugger): the
    broker goes with it, and so do the other roles. Here the kernel's orphaned process
    group rule (SIGHUP, then SIGCONT, to a stopped group) would end it too, as the broker
    leads its own group; the broker's parent-death signal is SIGKILL so that this holds
    whatever the groups (a SIGTERM would wait, pending, for a SIGCONT)."""
    srv = ShoalServer(small_repo)
    try:
        (broker,) = srv.pids("broker")
        srv.seen_pids |= set(srv.pids())
        os.kill(broker, signal.SIGSTOP)
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(10)
        deadline = time.monotonic() + 15
        while processes_with(srv.runtime_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(srv.runtime_dir) == {}
    finally:
        for pid in processes_with(srv.runtime_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        srv.stop()  # already gone: checks nothing is left (a frontend's slab, swept)
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_launcher_killed_takes_the_workers_of_loaded_models_with_it(small_repo: Path) -> None:
    """Explicit model control: workers the launcher started for the load API (and a reload
    whose copies change over) die with it too, and leave no shared memory."""
    srv = ShoalServer(small_repo, "--model-control-mode=explicit", "--load-model=simple")
    client = httpclient.InferenceServerClient(srv.url)
    client.load_model("mlp")
    client.load_model("simple", config='{"max_batch_size": 4}')
    assert any("--generation" in cmd for cmd in processes_with(srv.runtime_dir).values())
    srv.seen_pids |= set(srv.pids())
    _kill_launcher_and_expect_no_child(srv)
    assert not srv.leftovers()
    srv._log.close()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)
