"""Roles run as separate programs (as under supervisord): a broker that dies and is
started again is rejoined by the frontend and the worker without restarting them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverctl import RUN_PREFIX, SHM_DIR, free_port, processes_with
from tools import modelgen


class Roles:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.runtime = tempfile.mkdtemp(prefix=RUN_PREFIX)
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, role: str, instance: int = 0, model: str = "simple") -> None:
        common = [f"--runtime-dir={self.runtime}"]
        argv = {
            "broker": ["-m", "shoal.broker", f"--model-repository={self.repo}", *common],
            "frontend": [
                "-m",
                "shoal.frontend",
                *common,
                f"--http-port={self.port}",
                "--http-address=127.0.0.1",
                "--allow-grpc=false",
                "--allow-metrics=false",
            ],
            "worker": [
                "-m",
                "shoal.workers",
                f"--model-repository={self.repo}",
                *common,
                f"--model={model}",
                "--version=1",
                f"--instance={instance}",
            ],
        }[role]
        name = f"{role}{instance or ''}"  # worker, worker1, ...
        if role == "worker" and model != "simple":
            name = f"{name}-{model}"
        self.procs[name] = subprocess.Popen([sys.executable, *argv], stdin=subprocess.DEVNULL)

    def ready(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=2
                ) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def roles(tmp_path: Path) -> Iterator[Roles]:
    modelgen.write_model(tmp_path, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    r = Roles(tmp_path)
    yield r
    r.stop()
    pids = {p.pid for p in r.procs.values()}
    assert not processes_with(r.runtime)
    assert not [
        p
        for p in SHM_DIR.iterdir()
        if p.name.startswith("shoal-") and int(p.name.split("-")[1]) in pids
    ]
    shutil.rmtree(r.runtime, ignore_errors=True)


def _infer(port: int) -> np.ndarray:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return client.infer("simple", ins).as_numpy("OUTPUT0")


def test_frontend_and_worker_rejoin_a_restarted_broker(roles: Roles) -> None:
    for role in ("frontend", "worker", "broker"):  # any start order works
        roles.start(role)
    assert roles.ready(), "server did not become ready"
    np.testing.assert_array_equal(_infer(roles.port), np.full((1, 16), 2))

    roles.procs["broker"].kill()
    roles.procs["broker"].wait()
    assert roles.procs["frontend"].poll() is None
    assert roles.procs["worker"].poll() is None

    roles.start("broker")
    assert roles.ready(), "the restarted broker was not rejoined"
    np.testing.assert_array_equal(_infer(roles.port), np.full((1, 16), 2))


def test_a_restarted_broker_serves_with_the_instances_that_came_back(roles: Roles) -> None:
    """An instance that died while no broker ran (and stays dead: its load fails after
    a crash, say) must not keep its version LOADING under the next broker for ever."""
    two = modelgen.SIMPLE_CONFIG + "instance_group [ { count: 2, kind: KIND_CPU } ]\n"
    modelgen.write_model(roles.repo, "simple", modelgen.simple_model(), two)
    for role, instance in (("broker", 0), ("worker", 0), ("worker", 1), ("frontend", 0)):
        roles.start(role, instance)
    assert roles.ready(), "server did not become ready"
    for name in ("broker", "worker1"):
        roles.procs[name].kill()
        roles.procs[name].wait()
    roles.start("broker")
    assert roles.ready(), "the version stayed unready without its lost instance"
    np.testing.assert_array_equal(_infer(roles.port), np.full((1, 16), 2))


def test_a_killed_frontend_s_slab_is_removed_without_a_launcher(roles: Roles) -> None:
    """Under supervisord no launcher sweeps /dev/shm: the broker removes the slab of a
    frontend it sees die, and a frontend starting removes any a dead owner left."""
    for role in ("broker", "worker", "frontend"):
        roles.start(role)
    assert roles.ready(), "server did not become ready"
    killed = roles.procs["frontend"]
    assert any(p.name.startswith(f"shoal-{killed.pid}-") for p in SHM_DIR.iterdir())
    results = Path(roles.runtime) / f"results-f-0-{killed.pid}.sock"
    assert results.exists()
    killed.kill()
    killed.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slab = any(p.name.startswith(f"shoal-{killed.pid}-") for p in SHM_DIR.iterdir())
        if not slab and not results.exists():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the killed frontend's slab or result socket is still there")
    roles.start("frontend")
    assert roles.ready(), "the restarted frontend did not serve"
    np.testing.assert_array_equal(_infer(roles.port), np.full((1, 16), 2))


def _instance(port: int, model: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/shoal/models/{model}") as r:
        (instance,) = json.loads(r.read())["versions"][0]["instances"]
    return dict(instance)


def test_workers_started_alone_take_the_cores_shoal_serve_would_give_them(
    roles: Roles,
) -> None:
    """Under supervisord nobody passes --cores: each worker plans the repository as the
    launcher does and pins itself to its own share of the cores."""
    config = modelgen.SIMPLE_CONFIG.replace('name: "simple"', 'name: "simple_b"')
    assert config != modelgen.SIMPLE_CONFIG
    modelgen.write_model(roles.repo, "simple_b", modelgen.simple_model(), config)
    for role, model in (
        ("broker", ""),
        ("frontend", ""),
        ("worker", "simple"),
        ("worker", "simple_b"),
    ):
        roles.start(role, model=model or "simple")
    assert roles.ready(), "server did not become ready"
    cpus = sorted(os.sched_getaffinity(0))
    share = max(len(cpus) // 2, 1)
    expected = (
        {"simple": cpus[:share], "simple_b": cpus[share : 2 * share]}
        if len(cpus) >= 2
        else {"simple": cpus, "simple_b": cpus}
    )
    for model, cores in expected.items():
        instance = _instance(roles.port, model)
        assert instance["cores"] == cores, model
        assert sorted(os.sched_getaffinity(int(instance["pid"]))) == cores  # type: ignore[call-overload]
        assert instance["gpu"] is None
    np.testing.assert_array_equal(_infer(roles.port), np.full((1, 16), 2))
