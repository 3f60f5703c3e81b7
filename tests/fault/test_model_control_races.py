"""Explicit model control while the broker dies: a load or an unload under way, its
worker still starting up or already retiring, when the broker is SIGKILLed.

The next broker serves the start-up models (--load-model), as a fresh server would:
what the API loaded, reloaded or unloaded since is undone (docs/fault-tolerance.md).
Whatever the moment of the kill, the end is consistent: each model READY with its one
worker, or not loaded with none; no orphan worker, no /dev/shm segment left; the clients
whose load or unload was under way get an error that names the cause.

The model here waits in ``initialize`` or ``finalize`` while a gate file exists, so that
the broker dies at a known step of the worker's start or end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, processes_with
from tools import modelgen

GATED = """
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


def _gate(step):
    gates = Path(os.environ["SHOAL_TEST_GATES"])
    (gates / f"{step}-{os.getpid()}").touch()  # the test sees it waiting here
    deadline = time.monotonic() + 120
    while (gates / step).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


class TritonPythonModel:
    def initialize(self, args):
        _gate("initialize")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out

    def finalize(self):
        _gate("finalize")
"""
GATED_CONFIG = """
name: "gated"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""
BROKER_EXITED = "the server's broker process exited"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    modelgen.write_shipped_repository(repo, ("simple",))
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED)
    (repo / "gated" / "config.pbtxt").write_text(GATED_CONFIG)
    return repo


@pytest.fixture
def gates(tmp_path: Path) -> Path:
    gates = tmp_path / "gates"
    gates.mkdir()
    return gates


@contextlib.contextmanager
def _server(repo: Path, gates: Path, *load: str) -> Iterator[ShoalServer]:
    # the API is served once the launcher is there, start-up loads under way or not (the
    # server is not ready before they are over, as Triton's: a gated one holds it)
    srv = ShoalServer(
        repo,
        "--model-control-mode=explicit",
        "--strict-readiness=false",
        *(f"--load-model={name}" for name in load),
        env={"SHOAL_TEST_GATES": str(gates)},
        wait_ready=False,
    )
    try:
        srv.wait_answering()
        deadline = time.monotonic() + 60
        while "connected: models load and unload while serving" not in srv.log() or not all(
            _workers_of(srv, name) for name in load
        ):
            assert srv.proc.poll() is None and time.monotonic() < deadline, srv.log()
            time.sleep(0.02)
        yield srv
    finally:
        for gate in gates.iterdir():  # nothing waits in a model any more
            gate.unlink()
        srv.seen_pids |= set(srv.pids())
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


class Call(threading.Thread):
    """A model control call that blocks until it settles, in its own thread (with its own
    tritonclient HTTP client): its error, once it returned ("" if it succeeded)."""

    def __init__(
        self, srv: ShoalServer, action: Callable[[httpclient.InferenceServerClient], None]
    ):
        super().__init__(daemon=True)
        self.srv, self.action = srv, action
        self.error: str | None = None

    def run(self) -> None:
        client = httpclient.InferenceServerClient(self.srv.url, network_timeout=120)
        try:
            self.action(client)
            self.error = ""
        except InferenceServerException as e:
            self.error = f"{e.status()}: {e.message()}"

    def outcome(self) -> str:
        self.join(60)
        assert not self.is_alive(), "a model control call never returned"
        assert self.error is not None
        return self.error


def _waiting_in(gates: Path, step: str, pid: int, srv: ShoalServer) -> None:
    deadline = time.monotonic() + 60
    while not (gates / f"{step}-{pid}").exists():
        assert time.monotonic() < deadline, f"worker {pid} never reached {step}\n{srv.log()}"
        time.sleep(0.02)


def _state(srv: ShoalServer, model: str) -> str:
    client = httpclient.InferenceServerClient(srv.url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    return str(index.get(model, {}).get("state", ""))


def _kill_broker(srv: ShoalServer) -> int:
    (broker,) = srv.pids("broker")
    srv.seen_pids |= {broker, *srv.pids()}
    os.kill(broker, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while broker in srv.pids() or len(srv.pids("broker")) != 1:
        assert time.monotonic() < deadline, f"no broker again\n{srv.log()}"
        time.sleep(0.02)
    return broker


def _settled(srv: ShoalServer, model: str, want: str) -> None:
    """Until ``model``'s state in the index is ``want`` (READY, or "" for not loaded)."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(InferenceServerException, OSError):
            if srv.http_status("/v2/health/ready") == 200 and _state(srv, model) == want:
                return
        assert time.monotonic() < deadline, f"{model} never {want or 'unloaded'}\n{srv.log()}"
        time.sleep(0.05)


def _workers_of(srv: ShoalServer, model: str) -> list[int]:
    return sorted(
        pid
        for pid, cmd in processes_with(srv.runtime_dir).items()
        if "-m shoal.workers " in cmd and f"--model {model} " in cmd
    )


def _serves(srv: ShoalServer, model: str) -> None:
    client = httpclient.InferenceServerClient(srv.url)
    if model == "gated":
        inp = httpclient.InferInput("INPUT0", [4], "INT32")
        inp.set_data_from_numpy(np.arange(4, dtype=np.int32))
        out = client.infer(model, [inp]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.arange(4))
        return
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    np.testing.assert_array_equal(client.infer(model, ins).as_numpy("OUTPUT0"), np.full((1, 16), 2))


def test_a_start_up_model_unloaded_while_its_worker_loads_when_the_broker_dies(
    repo: Path, gates: Path
) -> None:
    """Its worker, still in initialize, is told to retire; the broker dies before the
    worker reads it. The next broker serves the start-up models: the model is READY,
    with one worker, and the unload's client was told the broker exited."""
    (gates / "initialize").touch()
    with _server(repo, gates, "gated", "simple") as srv:
        (worker,) = _workers_of(srv, "gated")
        _waiting_in(gates, "initialize", worker, srv)
        unload = Call(srv, lambda c: c.unload_model("gated"))
        unload.start()
        _settled_to(srv, "gated", "UNLOADING")  # the broker told its worker to retire
        _kill_broker(srv)
        (gates / "initialize").unlink()  # it loads, and reads what the dead broker said
        assert unload.outcome() == f"503: {BROKER_EXITED}"
        _settled(srv, "gated", "READY")
        _settled(srv, "simple", "READY")  # (rejoined the next broker)
        # the worker read what the dead broker said once it had loaded, and stayed
        assert _workers_of(srv, "gated") == [worker]
        assert "not stopping: the broker that retired this instance exited" in srv.log()
        _serves(srv, "gated")
        _serves(srv, "simple")


def test_a_start_up_models_worker_retiring_when_the_broker_dies_is_started_again(
    repo: Path, gates: Path
) -> None:
    """The model is unloaded and its worker is on its way out (in finalize) when the
    broker dies; it exits after the next broker started. That broker serves the start-up
    models: the worker is started again, and the model is READY."""
    (gates / "finalize").touch()
    with _server(repo, gates, "gated", "simple") as srv:
        srv.wait_settled(("gated",))
        (worker,) = _workers_of(srv, "gated")
        unload = Call(srv, lambda c: c.unload_model("gated"))
        unload.start()
        _waiting_in(gates, "finalize", worker, srv)
        _kill_broker(srv)  # the launcher has started the next one: the worker still runs
        assert worker in _workers_of(srv, "gated")
        (gates / "finalize").unlink()  # it exits, retired by the broker that died
        assert unload.outcome() == f"503: {BROKER_EXITED}"
        _settled(srv, "gated", "READY")
        _settled(srv, "simple", "READY")
        assert worker not in _workers_of(srv, "gated")
        assert len(_workers_of(srv, "gated")) == 1
        again = "worker gated/1 gated_0 stopped: retired while a broker was lost; starting it again"
        assert again in srv.log(), srv.log()
        _serves(srv, "gated")
        _serves(srv, "simple")


def test_a_load_through_the_api_cancelled_while_its_worker_starts_when_the_broker_dies(
    repo: Path, gates: Path
) -> None:
    """A load whose worker is still in initialize, cancelled by an unload, the broker
    dying meanwhile: the load was the lost broker's, so the model is not loaded and its
    worker is gone; each call got an error naming why; it loads again afterwards."""
    (gates / "initialize").touch()
    with _server(repo, gates, "simple") as srv:
        load = Call(srv, lambda c: c.load_model("gated"))
        load.start()
        deadline = time.monotonic() + 60
        while not _workers_of(srv, "gated"):
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.02)
        (worker,) = _workers_of(srv, "gated")
        srv.seen_pids.add(worker)
        _waiting_in(gates, "initialize", worker, srv)
        unload = Call(srv, lambda c: c.unload_model("gated"))
        unload.start()
        assert load.outcome() == "503: failed to load 'gated': an unload of it came first"
        _kill_broker(srv)
        (gates / "initialize").unlink()
        assert unload.outcome() == f"503: {BROKER_EXITED}"
        _settled(srv, "gated", "")
        _settled(srv, "simple", "READY")
        deadline = time.monotonic() + 30
        while _workers_of(srv, "gated"):
            assert time.monotonic() < deadline, f"the lost load's worker runs on\n{srv.log()}"
            time.sleep(0.05)
        _serves(srv, "simple")
        httpclient.InferenceServerClient(srv.url).load_model("gated")
        _serves(srv, "gated")
        assert len(_workers_of(srv, "gated")) == 1


def _settled_to(srv: ShoalServer, model: str, want: str) -> None:
    deadline = time.monotonic() + 30
    while _state(srv, model) != want:
        assert time.monotonic() < deadline, f"{model} never {want}\n{srv.log()}"
        time.sleep(0.02)
