"""Every role heals under ``shoal serve``: each is SIGKILLed in turn (the broker, a
frontend, a worker of model A, then shoal serve itself, whose children must all go with
it) while clients keep two models busy over HTTP and gRPC.

What each kill may cost is bounded: a worker's death fails only its own model's
requests; the broker's and a frontend's fail those in flight at once (503 / UNAVAILABLE
naming the cause, or the connection the dead frontend held), and service is back within
5 s (the issue's bound: the only timed assertion). The launcher restarts whatever died,
the survivors keep running (the workers keep their models loaded), and nothing is left
behind: no process, no /dev/shm segment. The fault matrix (run with ``-s``) shows what
clients saw and how long each recovery took."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.serverctl import ShoalServer, processes_with, shm_segments_of
from tools import modelgen

#: The issue's bound: after the broker or a frontend dies, service is back this soon.
SERVICE_BACK_S = 5.0
MODEL_A, MODEL_B = "simple", "mlp"  # A's worker is killed; B must never notice
UNAVAILABLE = ("503", "StatusCode.UNAVAILABLE")  # as tritonclient reports them


@dataclass
class Outcome:
    model: str
    protocol: str
    start: float  # monotonic
    end: float
    error: str = ""  # "": answered; else "<status or exception type>: <message>"

    @property
    def ok(self) -> bool:
        return not self.error


def _inputs(module: Any, model: str) -> list[Any]:
    if model == MODEL_A:
        ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in ins:
            i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        return ins
    inp = module.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))
    return [inp]


class Load:
    """One client thread per (model, protocol), each sending requests one after another
    until stopped, every outcome recorded."""

    def __init__(self, srv: ShoalServer) -> None:
        self.srv = srv
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(model, protocol), daemon=True)
            for model in (MODEL_A, MODEL_B)
            for protocol in ("http", "grpc")
        ]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads), "a request never returned"

    def _client(self, protocol: str) -> Any:
        url, module = self.srv.client(protocol)
        if protocol == "http":
            return module.InferenceServerClient(url, network_timeout=30)
        return module.InferenceServerClient(url)

    def _run(self, model: str, protocol: str) -> None:
        module = httpclient if protocol == "http" else grpcclient
        client = self._client(protocol)
        while not self.stopping.is_set():
            start = time.monotonic()
            error = ""
            try:
                kwargs = {"client_timeout": 30} if protocol == "grpc" else {}
                client.infer(model, _inputs(module, model), **kwargs)
            except InferenceServerException as e:
                error = f"{e.status()}: {e.message()}"
            except Exception as e:  # the connection a dead frontend held, say
                error = f"{type(e).__name__}: {e}"
                with contextlib.suppress(Exception):
                    client.close()
                client = self._client(protocol)
            with self.lock:
                self.outcomes.append(Outcome(model, protocol, start, time.monotonic(), error))
            time.sleep(0.02 if not error else 0.05)

    def since(self, t: float) -> list[Outcome]:
        with self.lock:
            return [o for o in self.outcomes if o.end >= t]

    def answered_after(self, t: float, model: str) -> bool:
        return any(o.ok and o.start >= t and o.model == model for o in self.since(t))


def _recovery(outcomes: list[Outcome], model: str, killed_at: float) -> float:
    """Seconds from the kill until this model answered again for good (0: it never
    failed): the first answer started after its last failure."""
    mine = [o for o in outcomes if o.model == model]
    failed = [o for o in mine if not o.ok]
    if not failed:
        return 0.0
    last = max(o.end for o in failed)
    back = [o.end for o in mine if o.ok and o.start >= last]
    return (min(back) if back else float("inf")) - killed_at


def _seen(outcomes: list[Outcome], model: str) -> str:
    mine = [o for o in outcomes if o.model == model]
    failed = [o for o in mine if not o.ok]
    if not failed:
        return f"all {len(mine)} answered"
    kinds = sorted({o.error.split(": ", 1)[0] for o in failed})
    slowest = max(o.end - o.start for o in failed)
    return f"{len(failed)} of {len(mine)} failed ({', '.join(kinds)}; slowest {slowest:.2f}s)"


@pytest.fixture
def two_models(tmp_path: Path) -> Iterator[ShoalServer]:
    modelgen.write_shipped_repository(tmp_path, (MODEL_A, MODEL_B))
    srv = ShoalServer(tmp_path, "--frontend-processes=2")
    yield srv
    srv.seen_pids |= set(srv.pids())
    if srv.proc.poll() is None:
        srv.stop()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _whole(srv: ShoalServer, roles: dict[str, int]) -> bool:
    """Every role has its count of processes again and the server is ready."""
    counts = {role: len(srv.pids(role)) for role in roles}
    return counts == roles and srv.http_status("/v2/health/ready") == 200


def _kill_under_load(
    srv: ShoalServer, load: Load, role: str, victim: Callable[[], int]
) -> tuple[float, list[Outcome], float, int]:
    """SIGKILL one process while the load runs; wait until it is replaced and every
    model answers again. Returns the kill's time, the outcomes from it on, the time
    until the server was whole again, and the pid killed."""
    expected = {"broker": 1, "frontend": 2, "workers": 2}
    before = time.monotonic()
    time.sleep(1.0)  # the load runs before the kill, and all is well
    assert all(o.ok for o in load.since(before)), [o for o in load.since(before) if not o.ok]
    pid = victim()
    srv.seen_pids.add(pid)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    deadline = killed_at + 60
    whole_at = 0.0
    while time.monotonic() < deadline:
        if not whole_at and pid not in srv.pids() and _whole(srv, expected):
            whole_at = time.monotonic()
        if whole_at and all(load.answered_after(whole_at, m) for m in (MODEL_A, MODEL_B)):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"{role} killed: the server did not heal in 60s:\n{srv.log()}")
    srv.seen_pids |= set(srv.pids())
    time.sleep(1.0)  # and keeps serving
    return killed_at, load.since(killed_at), whole_at - killed_at, pid


def test_each_role_killed_under_load_heals(two_models: ShoalServer) -> None:
    srv = two_models
    matrix: list[tuple[str, ...]] = []

    def row(role: str, seen: list[Outcome], killed_at: float, whole: float) -> list[float]:
        back = [_recovery(seen, m, killed_at) for m in (MODEL_A, MODEL_B)]
        matrix.append((role, _seen(seen, MODEL_A), _seen(seen, MODEL_B),
                       *(f"{b:.2f}s" for b in back), f"{whole:.2f}s"))  # fmt: skip
        return back

    workers_before = {m: srv.worker_pid(m) for m in (MODEL_A, MODEL_B)}
    with Load(srv) as load:
        # -- the broker: everything in flight fails at once, naming the broker ----------
        killed_at, seen, whole, _ = _kill_under_load(
            srv, load, "broker", lambda: srv.pids("broker")[0]
        )
        # the survivors rejoined: no worker restarted, no model loaded again
        assert {m: srv.worker_pid(m) for m in (MODEL_A, MODEL_B)} == workers_before
        for o in (o for o in seen if not o.ok):
            assert o.error.split(": ")[0] in UNAVAILABLE, o
            if o.start < killed_at:  # in flight: failed at once, naming the cause
                assert "the server's broker process exited" in o.error, o
        back = row("broker", seen, killed_at, whole)
        assert max(back) <= SERVICE_BACK_S, (back, srv.log())

        # -- a frontend: the connections it held fail; the other frontend serves on -----
        killed_at, seen, whole, frontend = _kill_under_load(
            srv, load, "frontend", lambda: srv.pids("frontend")[0]
        )
        back = row("one of 2 frontends", seen, killed_at, whole)
        assert max(back) <= SERVICE_BACK_S, (back, srv.log())
        assert not shm_segments_of({frontend})  # its slab went with it

        # -- model A's worker: A's requests fail (503, naming it), B's never ------------
        killed_at, seen, whole, _ = _kill_under_load(
            srv, load, "worker", lambda: srv.worker_pid(MODEL_A)
        )
        assert all(o.ok for o in seen if o.model == MODEL_B), [o for o in seen if not o.ok]
        for o in (o for o in seen if not o.ok):
            assert o.error.split(": ")[0] in UNAVAILABLE, o
            assert f"'{MODEL_A}" in o.error, o
        row(f"worker of {MODEL_A}", seen, killed_at, whole)

        # -- shoal serve itself: every child goes with it, no port stays taken ----------
        srv.seen_pids |= set(srv.pids())
        killed_at = time.monotonic()
        os.kill(srv.proc.pid, signal.SIGKILL)
        deadline = killed_at + 15
        while processes_with(srv.runtime_dir):
            assert time.monotonic() < deadline, processes_with(srv.runtime_dir)
            time.sleep(0.05)
        gone = time.monotonic() - killed_at
        seen = load.since(killed_at)
    for host, port in (("127.0.0.1", srv.http_port), ("0.0.0.0", srv.grpc_port)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))  # nothing listens there any more
    matrix.append(("shoal serve", _seen(seen, MODEL_A), _seen(seen, MODEL_B), "-", "-",
                   f"all children gone in {gone:.2f}s"))  # fmt: skip
    print("\nfault matrix (SIGKILL under load: 2 models x HTTP + gRPC, 2 frontends)")
    print(" | ".join(("role killed", f"A ({MODEL_A}) saw", f"B ({MODEL_B}) saw", "A back",
                      "B back", "all processes back, server ready")))  # fmt: skip
    for line in matrix:
        print(" | ".join(line))
    srv.stop()  # already gone: checks nothing is left (no process, no /dev/shm segment)


def test_what_a_restarted_broker_keeps_and_what_it_loses(tmp_path: Path) -> None:
    """The frontends keep the broker's table of client shared-memory registrations and
    hand it to the next broker: a region registered before the broker died serves after
    it, without the client registering it again. A sequence begun before is lost, with
    Triton's error for a sequence that was never started; statistics start from zero. A
    restarted broker also removes the result socket of a frontend gone while no broker
    ran."""
    modelgen.write_shipped_repository(tmp_path, (MODEL_A, "simple_sequence"))
    srv = ShoalServer(tmp_path, "--allow-client-shm=true")
    tag = secrets.token_hex(4)
    key = f"/test_heal_{tag}"
    handle = shm.create_shared_memory_region(f"in_{tag}", key, 64)
    try:
        client = httpclient.InferenceServerClient(srv.url)
        client.register_system_shared_memory(f"in_{tag}", key, 64)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        shm.set_shared_memory_region(handle, [a])

        def infer() -> np.ndarray:
            ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            ins[0].set_shared_memory(f"in_{tag}", 64)
            ins[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
            return client.infer(MODEL_A, ins).as_numpy("OUTPUT0")

        np.testing.assert_array_equal(infer(), a + 1)
        step = httpclient.InferInput("INPUT", [1, 1], "INT32")
        step.set_data_from_numpy(np.full((1, 1), 5, dtype=np.int32))
        client.infer("simple_sequence", [step], sequence_id=42, sequence_start=True)
        stale = Path(srv.runtime_dir) / f"results-f-7-{_dead_pid()}.sock"
        stale.touch()
        (broker,) = srv.pids("broker")
        srv.seen_pids.add(broker)
        os.kill(broker, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while broker in srv.pids() or srv.http_status("/v2/health/ready") != 200:
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
        np.testing.assert_array_equal(infer(), a + 1)
        status = client.get_system_shared_memory_status()
        assert [r["name"] for r in status] == [f"in_{tag}"]
        assert "1 client shared-memory registration(s) restored" in srv.log()
        assert not stale.exists()
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple_sequence", [step], sequence_id=42)
        assert (e.value.status(), e.value.message()) == (
            "400",
            "inference request for sequence 42 to model "
            "'simple_sequence' must specify the START flag on the first request of the "
            "sequence",
        )
        client.infer("simple_sequence", [step], sequence_id=42, sequence_start=True)
        stats = client.get_inference_statistics(MODEL_A)["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 1  # the one since
        client.unregister_system_shared_memory(f"in_{tag}")
    finally:
        shm.destroy_shared_memory_region(handle)
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_a_restarted_broker_serves_the_start_up_models_of_explicit_model_control(
    tmp_path: Path,
) -> None:
    """What the model control API loaded was the lost broker's: the next one serves the
    start-up models, as at start, the workers of the API's loads stop, and a model loaded
    again (its load numbered afresh) serves."""
    modelgen.write_shipped_repository(tmp_path, (MODEL_A, MODEL_B))
    srv = ShoalServer(tmp_path, "--model-control-mode=explicit", f"--load-model={MODEL_A}")
    try:
        client = httpclient.InferenceServerClient(srv.url)
        client.load_model(MODEL_B)
        assert client.is_model_ready(MODEL_B)
        loaded = srv.worker_pid(MODEL_B)
        (broker,) = srv.pids("broker")
        srv.seen_pids |= {broker, loaded}
        os.kill(broker, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while broker in srv.pids() or srv.http_status("/v2/health/ready") != 200:
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
        assert client.is_model_ready(MODEL_A)
        assert not client.is_model_ready(MODEL_B)
        deadline = time.monotonic() + 15
        while loaded in srv.pids():
            assert time.monotonic() < deadline, f"the lost load's worker runs on\n{srv.log()}"
            time.sleep(0.05)
        ended = rf"I shoal\.serve: worker {MODEL_B}/1 \S+ stopped: its load ended with the broker"
        assert re.search(ended, srv.log()), srv.log()
        client.load_model(MODEL_B)
        out = client.infer(MODEL_B, _inputs(httpclient, MODEL_B)).as_numpy("OUTPUT0")
        assert out.shape == (1, 256)
        srv.seen_pids |= set(srv.pids())
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid
