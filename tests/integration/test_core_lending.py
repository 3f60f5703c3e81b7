"""Cores go where the work is: a busy instance of a large model runs on the cores of an
idle instance (shoal/broker/cores.py), and gives them back the moment that instance gets work.

A real server on a repository of two models, each instance pinned to a core of its own;
the pins are read from the kernel (every thread of the worker), not from shoal."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import served
from tools import modelgen

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="lending needs two cores or more"
)

HEAVY_CONFIG = """name: "heavy"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lending")
    # 1024 -> 4096 -> 1024: 32 MiB of weights, past the size that gets borrowing threads
    modelgen.write_model(root, "heavy", modelgen.mlp_model(1024, 4096, 1024), HEAVY_CONFIG)
    modelgen.write_model(root, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    return root


def thread_pins(pid: int) -> set[tuple[int, ...]]:
    """The distinct CPU sets of the process's threads."""
    pins = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            pins.add(tuple(sorted(os.sched_getaffinity(int(tid)))))
        except OSError:  # a thread that just ended
            continue
    return pins


def wait_for(pid: int, cores: tuple[int, ...], timeout: float = 10.0) -> set[tuple[int, ...]]:
    deadline = time.monotonic() + timeout
    while (pins := thread_pins(pid)) != {cores} and time.monotonic() < deadline:
        time.sleep(0.02)
    return pins


class Load:
    """Requests to ``heavy``, one after another on one connection, until stopped."""

    def __init__(self, url: str) -> None:
        self.client = httpclient.InferenceServerClient(url)
        self.stop = threading.Event()
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        x = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
        x.set_data_from_numpy(np.ones((1, 1024), np.float32))
        while not self.stop.is_set():
            try:
                self.client.infer("heavy", [x])
            except Exception as exc:
                self.errors.append(exc)
                return

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        self.client.close()


def test_a_busy_large_model_borrows_the_idle_instances_core_and_gives_it_back(repo: Path) -> None:
    with served(repo) as srv:
        heavy, simple = srv.worker_pid("heavy"), srv.worker_pid("simple")
        home = thread_pins(heavy)
        (simple_home,) = thread_pins(simple)
        assert len(home) == 1 and len(next(iter(home))) == 1  # a core of its own at rest
        (own,) = home
        both = tuple(sorted({*own, *simple_home}))
        # "2 threads": one for its own core, one for the core it may borrow
        assert "loaded 'heavy' version 1 instance 0 (2 threads)" in srv.log()
        with Load(srv.url) as load:
            assert wait_for(heavy, both) == {both}  # every thread of it, on both cores
            # simple gets a request: its core comes back before its batch runs
            client = httpclient.InferenceServerClient(srv.url)
            a = httpclient.InferInput("INPUT0", [1, 16], "INT32")
            b = httpclient.InferInput("INPUT1", [1, 16], "INT32")
            a.set_data_from_numpy(np.ones((1, 16), np.int32))
            b.set_data_from_numpy(np.ones((1, 16), np.int32))
            assert client.infer("simple", [a, b]).as_numpy("OUTPUT0").sum() == 32
            assert thread_pins(heavy) == {own}  # (simple stays busy for half a second)
            assert thread_pins(simple) == {simple_home}
            client.close()
            assert wait_for(heavy, both) == {both}  # lent again once simple is idle
        assert not load.errors
        assert wait_for(heavy, own) == {own}  # heavy idle too: back home


def test_without_lending_each_instance_keeps_to_its_own_core(repo: Path) -> None:
    with served(repo, "--cpu-lending=false") as srv:
        heavy = srv.worker_pid("heavy")
        (own,) = thread_pins(heavy)
        assert "loaded 'heavy' version 1 instance 0 (1 threads)" in srv.log()
        with Load(srv.url) as load:
            time.sleep(1.5)  # three times what an idle instance waits before lending
            assert thread_pins(heavy) == {own}
        assert not load.errors
