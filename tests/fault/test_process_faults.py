"""Kill and break things: every request gets an answer, the rest keeps serving, and no
process or /dev/shm segment is left behind."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import identity_config
from tests.serverctl import SHM_DIR, ShoalServer, free_port, processes_with
from tools import modelgen


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("fault-repo")
    modelgen.write_shipped_repository(repo)
    return repo


@pytest.fixture
def fresh_server(small_repo: Path) -> Iterator[ShoalServer]:
    srv = ShoalServer(small_repo)
    yield srv
    if srv.proc.poll() is None:
        srv.stop()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def simple_inputs() -> list[httpclient.InferInput]:
    ins = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return ins


def mlp_input() -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))
    return [inp]


def metric(srv: ShoalServer, sample: str) -> float:
    """One sample of the server's metrics page, by its name and labels as printed."""
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {sample}")


def test_worker_killed_mid_request_fails_that_request_only(fresh_server: ShoalServer) -> None:
    """The request it ran fails naming the instance; the one queued behind it (simple's
    only instance is gone) fails saying no instance ran it; other models keep serving."""
    pid = fresh_server.worker_pid("simple")
    os.kill(pid, signal.SIGSTOP)  # the first request will be in flight on a stuck worker
    outcomes: list[dict[str, object]] = [{}, {}]

    def call(outcome: dict[str, object]) -> None:
        client = httpclient.InferenceServerClient(fresh_server.url, network_timeout=30)
        t0 = time.monotonic()
        try:
            client.infer("simple", simple_inputs())
            outcome["error"] = None
        except InferenceServerException as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - t0

    threads = [threading.Thread(target=call, args=(o,)) for o in outcomes]
    threads[0].start()
    time.sleep(0.5)
    threads[1].start()  # queued: the instance runs one batch at a time
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive(), "a request hung after its worker died"
    ran, queued = (o["error"] for o in outcomes)
    assert isinstance(ran, InferenceServerException)
    assert ran.status() == "503"
    assert ran.message() == (
        "Failed to process the request(s) for model instance 'simple_0', "
        f"message: the instance's worker process (pid {pid}) exited"
    )
    assert isinstance(queued, InferenceServerException)
    assert queued.status() == "503"
    assert queued.message() == (
        "Failed to process the request(s) for model 'simple' version 1, message: "
        f"instance 'simple_0' (pid {pid}) exited and no instance left can run them"
    )
    assert all(float(str(o["seconds"])) < 5 for o in outcomes)

    other = httpclient.InferenceServerClient(fresh_server.url)
    assert other.infer("mlp", mlp_input()).as_numpy("OUTPUT0").shape == (1, 256)
    assert not other.is_model_ready("simple")
    assert other.is_model_ready("mlp")
    assert not other.is_server_ready()  # strict readiness: a model has no live instance
    assert other.is_server_live()
    # The launcher restarts the instance; the model comes back by itself.
    deadline = time.monotonic() + 30
    while not other.is_model_ready("simple") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert other.is_server_ready()
    np.testing.assert_array_equal(
        other.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
    )
    assert fresh_server.worker_pid("simple") != pid
    labels = 'model="simple",reason="crash",version="1"'
    assert metric(fresh_server, f"shoal_instance_exit_count{{{labels}}}") == 1
    mlp = 'model="mlp",reason="crash",version="1"'
    assert metric(fresh_server, f"shoal_instance_exit_count{{{mlp}}}") == 0


def test_a_stuck_model_holds_back_its_own_stream_and_no_other(
    fresh_server: ShoalServer,
) -> None:
    """One stream, a request to a model whose worker is stopped, then requests to
    another model: as Triton's stream handler does for models that are not decoupled,
    their answers wait for the stuck one (a stream answers in request order), while
    another stream and a unary call to the same model are answered at once. Once the
    worker runs again, the first stream gets every answer, in order."""
    import queue

    def simple_inputs(i: int) -> list[grpcclient.InferInput]:
        ins = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for t in ins:
            t.set_data_from_numpy(np.full((1, 16), i, dtype=np.int32))
        return ins

    url = f"127.0.0.1:{fresh_server.grpc_port}"
    client, other = grpcclient.InferenceServerClient(url), grpcclient.InferenceServerClient(url)
    answers: queue.Queue[object] = queue.Queue()
    others: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    other.start_stream(callback=lambda result, error: others.put(error or result))
    pid = fresh_server.worker_pid("mlp")
    os.kill(pid, signal.SIGSTOP)
    try:
        stuck = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
        stuck.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))
        client.async_stream_infer("mlp", [stuck], request_id="stuck")
        for i in range(3):
            client.async_stream_infer("simple", simple_inputs(i), request_id=f"simple{i}")
        other.async_stream_infer("simple", simple_inputs(7), request_id="other")
        answer = others.get(timeout=20)
        assert not isinstance(answer, Exception), answer
        assert answer.get_response().id == "other"
        unary = grpcclient.InferenceServerClient(url).infer("simple", simple_inputs(8))
        assert (unary.as_numpy("OUTPUT0") == 16).all()
        assert answers.empty()  # mlp's worker is still stopped: its stream waits
        os.kill(pid, signal.SIGCONT)
        got = [answers.get(timeout=20) for _ in range(4)]
        for result in got:
            assert not isinstance(result, Exception), result
        assert [r.get_response().id for r in got] == ["stuck", "simple0", "simple1", "simple2"]
        assert got[0].as_numpy("OUTPUT0").shape == (1, 256)
    finally:
        os.kill(pid, signal.SIGCONT)
        client.stop_stream()
        other.stop_stream()


def test_answers_lost_with_a_worker_killed_after_its_report_fail_not_hang(
    small_repo: Path,
) -> None:
    """The window between a worker's report and its answers leaving it: the broker has
    let the batch go, the answers died with the process, and the request must still get
    an error (SHOAL_TEST_FAULT reproduces the window: report, no answers, SIGKILL).
    The error names the instance as Triton does, <group>_<k>: mlp's instance_group has
    no name, so the group is mlp_0 and its instance mlp_0_0."""
    srv = ShoalServer(small_repo, env={"SHOAL_TEST_FAULT": "die-after-report:mlp"})
    try:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        pid = srv.worker_pid("mlp")
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("mlp", mlp_input())
        assert time.monotonic() - t0 < 5, "the request waited for an answer that had died"
        assert e.value.status() == "503"
        assert "Failed to process the request(s) for model instance 'mlp_0_0'" in (
            e.value.message()
        )
        assert f"(pid {pid}) exited" in e.value.message()
        assert "1 answer(s) died with their worker" in srv.log()
        # The other model never noticed.
        np.testing.assert_array_equal(
            client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
        )
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"pid {pid} still running"
        time.sleep(0.05)


def _wait_for_a_new_frontend(srv: ShoalServer, old: int) -> None:
    """Until a frontend other than ``old`` serves (the launcher restarted it)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = srv.pids("frontend")
        if now and now != [old] and srv.http_status("/v2/health/ready") == 200:
            return
        time.sleep(0.2)
    pytest.fail(f"frontend not restarted:\n{srv.log()}")


def test_frontend_killed_is_restarted_and_its_slab_swept(fresh_server: ShoalServer) -> None:
    (old,) = fresh_server.pids("frontend")
    assert any(p.name.startswith(f"shoal-{old}-") for p in SHM_DIR.iterdir())
    os.kill(old, signal.SIGKILL)
    _wait_for_a_new_frontend(fresh_server, old)
    assert not any(p.name.startswith(f"shoal-{old}-") for p in SHM_DIR.iterdir())
    assert f"W shoal.broker: frontend b'f-0-{old}' exited" in fresh_server.log()
    assert "E shoal.serve: frontend#0 was killed by SIGKILL; restarting" in fresh_server.log()
    fresh_server.seen_pids |= set(fresh_server.pids())
    client = httpclient.InferenceServerClient(fresh_server.url)
    np.testing.assert_array_equal(
        client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
    )


def test_a_frontend_stopped_alone_is_restarted_with_a_warning(
    fresh_server: ShoalServer,
) -> None:
    """An operator's SIGTERM to one frontend: it drains and exits 0, and the launcher
    brings it back. A clean exit is no crash, so nothing is logged as an error."""
    (old,) = fresh_server.pids("frontend")
    os.kill(old, signal.SIGTERM)
    _wait_for_a_new_frontend(fresh_server, old)
    fresh_server.seen_pids |= set(fresh_server.pids())
    log = fresh_server.log()
    assert "W shoal.serve: frontend#0 exited with code 0; restarting" in log
    assert " E shoal." not in log and not log.startswith("E ")
    client = httpclient.InferenceServerClient(fresh_server.url)
    np.testing.assert_array_equal(
        client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
    )


def test_a_broker_that_cannot_serve_stops_the_server(tmp_path: Path) -> None:
    """A broker that exits saying it cannot serve (EXIT_FATAL: here --exit-on-error with
    a model that fails to load) is not restarted: a restart would fail the same way."""
    _write_broken(tmp_path)
    srv = ShoalServer(tmp_path, wait_ready=False)
    assert srv.proc.wait(60) == 1
    srv.stop()
    log = srv.log()
    assert "E shoal.serve: broker cannot serve; stopping the server" in log
    assert "restarting" not in log
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_a_broker_in_a_crash_loop_stops_the_server(fresh_server: ShoalServer) -> None:
    """Killed again each time soon after it starts, the broker is restarted with a
    growing backoff, five times; the sixth quick exit in a row stops the server."""
    killed: set[int] = set()
    deadline = time.monotonic() + 60
    while fresh_server.proc.poll() is None and time.monotonic() < deadline:
        for pid in fresh_server.pids("broker"):
            if pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.02)
    assert fresh_server.proc.wait(5) == 1
    fresh_server.stop()  # already stopped: this checks that nothing is left
    log = fresh_server.log()
    assert len(killed) == 6
    for delay in ("0.1", "0.5", "1.0", "2.0", "5.0"):
        assert f"E shoal.serve: broker was killed by SIGKILL; restarting in {delay}s" in log
    assert (
        "E shoal.serve: broker was killed by SIGKILL, its exit 6 in a row within 30s of "
        "its start: a crash loop; stopping the server"
    ) in log


def test_a_worker_exit_seen_while_the_broker_stops_is_no_error(
    fresh_server: ShoalServer,
) -> None:
    """shoal serve stops the broker and the workers together, so a stopping broker may
    still see a worker go: that is the stop, logged at INFO, not an ERROR that would page
    an operator. The broker is held (SIGSTOP) while its SIGTERM, aimed at its main thread,
    and the worker's exit wait for it; let go, it handles the signal first (in its poll,
    or at once if it was mid-turn), then the exit: in the same turn, or in the look at
    its peers it takes after its loop."""
    (broker,) = fresh_server.pids("broker")
    worker = fresh_server.worker_pid("simple")
    gone = os.pidfd_open(worker)
    os.kill(broker, signal.SIGSTOP)
    try:
        assert ctypes.CDLL(None, use_errno=True).tgkill(broker, broker, signal.SIGTERM) == 0
        os.kill(worker, signal.SIGKILL)
        assert select.select([gone], [], [], 10)[0]
    finally:
        os.close(gone)
        os.kill(broker, signal.SIGCONT)
    _wait_gone(broker)  # (the launcher starts another: an operator's stop of the broker
    fresh_server.stop()  # alone is a restart, as for any child)
    log = fresh_server.log()
    assert f"simple/1 (pid {worker}) exited" not in log
    assert f"I shoal.broker: instance 0 of simple/1 (pid {worker}) stopped" in log


def test_a_stopped_broker_fails_waiting_requests_and_is_rejoined_when_it_resumes(
    fresh_server: ShoalServer,
) -> None:
    """A broker that stops answering (SIGSTOP here; stuck, in life) is not watched by a
    pidfd: it has not exited. The frontend gives it up after 10 s of silence, so no
    request waits forever, and greets it again when it answers."""
    (broker,) = fresh_server.pids("broker")
    client = httpclient.InferenceServerClient(fresh_server.url, network_timeout=60)
    client.infer("simple", simple_inputs())  # the model is known: the next one goes out
    os.kill(broker, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", simple_inputs())
        waited = time.monotonic() - t0
        assert e.value.status() == "503"
        assert "the server's broker did not answer for" in e.value.message()
        assert waited < 20
        with pytest.raises(InferenceServerException) as e:  # refused at once meanwhile
            client.infer("simple", simple_inputs())
        assert e.value.status() == "503"
    finally:
        os.kill(broker, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while fresh_server.http_status("/v2/health/ready") != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    np.testing.assert_array_equal(
        client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
    )


def test_a_stuck_broker_is_killed_and_restarted(small_repo: Path) -> None:
    """A broker that stops answering without exiting (SIGSTOP here; a deadlock, in life)
    is killed by the launcher once it has been silent --broker-silence-timeout-secs (30 s
    by default; 3 here), then restarted as any dead broker; the frontend and the workers
    rejoin the new one."""
    fresh_server = ShoalServer(small_repo, "--broker-silence-timeout-secs=3")
    try:
        _stuck_broker_comes_back(fresh_server)
    finally:
        fresh_server.stop()
        shutil.rmtree(fresh_server.runtime_dir, ignore_errors=True)


def _stuck_broker_comes_back(fresh_server: ShoalServer) -> None:
    (broker,) = fresh_server.pids("broker")
    workers = sorted(fresh_server.pids("workers"))
    fresh_server.seen_pids.add(broker)
    os.kill(broker, signal.SIGSTOP)
    _wait_gone(broker, timeout=60)
    deadline = time.monotonic() + 30
    while fresh_server.http_status("/v2/health/ready") != 200:
        assert time.monotonic() < deadline, fresh_server.log()
        time.sleep(0.1)
    assert sorted(fresh_server.pids("workers")) == workers  # rejoined, not restarted
    log = fresh_server.log()
    assert f"E shoal.serve: broker (pid {broker}) did not answer for 3s: stuck; killing it" in log
    assert "E shoal.serve: broker was killed by SIGKILL; restarting in 0.1s" in log
    client = httpclient.InferenceServerClient(fresh_server.url)
    np.testing.assert_array_equal(
        client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
    )


def _frontend_status(srv: ShoalServer) -> dict[str, int]:
    with urllib.request.urlopen(f"http://{srv.url}/v2/shoal/frontend", timeout=5) as r:
        return dict(json.loads(r.read()))


def test_requests_given_up_by_their_clients_leave_the_queue_of_a_stuck_model(
    fresh_server: ShoalServer,
) -> None:
    """Behind a stuck instance, requests whose gRPC deadline passed would hold their
    shared memory until the instance ran them (or was killed): the frontend tells the
    broker, which drops them from the queue and answers them CANCELLED at once."""
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{fresh_server.grpc_port}")
    big = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
    big.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))  # 1 KiB: inline
    grpc_client.infer("mlp", [big])
    worker = fresh_server.worker_pid("mlp")
    os.kill(worker, signal.SIGSTOP)
    try:
        for _ in range(20):
            with pytest.raises(InferenceServerException, match="Deadline"):
                grpc_client.infer("mlp", [big], client_timeout=0.2)
        deadline = time.monotonic() + 5
        while _frontend_status(fresh_server)["requests_waiting"] > 1:
            assert time.monotonic() < deadline, _frontend_status(fresh_server)
            time.sleep(0.1)
        # Only the first is left: it was running when the instance stopped.
        assert _frontend_status(fresh_server)["requests_waiting"] == 1
        stats = grpc_client.get_inference_statistics("mlp").model_stats[0]
        assert stats.inference_stats.fail.count == 19
        http = httpclient.InferenceServerClient(fresh_server.url)
        assert http.infer("simple", simple_inputs()).as_numpy("OUTPUT0").shape == (1, 16)
    finally:
        os.kill(worker, signal.SIGCONT)
    deadline = time.monotonic() + 5
    while _frontend_status(fresh_server)["requests_waiting"]:
        assert time.monotonic() < deadline, "the running request never finished"
        time.sleep(0.1)
    assert grpc_client.infer("mlp", [big]).as_numpy("OUTPUT0").shape == (1, 256)


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


def _write_broken(repo: Path) -> None:
    modelgen.write_shipped_repository(repo)
    modelgen.write_model(
        repo,
        "broken",
        modelgen.simple_model(),
        'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -3\n',
    )


def test_broken_config_stops_startup_with_the_model_named(tmp_path: Path) -> None:
    _write_broken(tmp_path)
    srv = ShoalServer(tmp_path, wait_ready=False)
    rc = srv.proc.wait(60)
    srv.stop()
    assert rc != 0
    assert "broken" in srv.log()
    assert "'max_batch_size' must be non-negative value" in srv.log()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_broken_config_without_exit_on_error_serves_the_rest(tmp_path: Path) -> None:
    _write_broken(tmp_path)
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "1").mkdir()
    (tmp_path / "corrupt" / "1" / "model.onnx").write_bytes(b"this is not onnx")
    (tmp_path / "corrupt" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    srv = ShoalServer(tmp_path, "--exit-on-error=false", "--strict-readiness=false")
    try:
        client = httpclient.InferenceServerClient(srv.url)
        deadline = time.monotonic() + 30  # not strict: ready before the models are
        while not client.is_model_ready("simple") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.infer("simple", simple_inputs()).as_numpy("OUTPUT0").shape == (1, 16)
        assert not client.is_model_ready("broken")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "failed to load 'corrupt'" not in srv.log():
            time.sleep(0.2)
        assert not client.is_model_ready("corrupt")
        with pytest.raises(InferenceServerException) as e:
            client.get_model_metadata("broken")
        assert "max_batch_size" in e.value.message()
        # Statistics know only versions that have been READY, as Triton's.
        every = client.get_inference_statistics()["model_stats"]
        names = {s["name"] for s in every}
        assert "simple" in names and not names & {"broken", "corrupt"}
        for model in ("broken", "corrupt"):
            with pytest.raises(InferenceServerException) as e:
                client.get_inference_statistics(model)
            assert (e.value.status(), e.value.message()) == (
                "400",
                f"requested model '{model}' is not available",
            )
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_port_in_use_fails_fast(small_repo: Path) -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        runtime = f"/tmp/shoal-test-port-{secrets.token_hex(4)}"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "shoal",
                "serve",
                f"--model-repository={small_repo}",
                f"--http-port={port}",
                "--http-address=127.0.0.1",
                f"--runtime-dir={runtime}",
            ],
            capture_output=True,
            timeout=60,
            text=True,
        )
    assert proc.returncode != 0
    assert (
        f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{port}' already in use"
        in proc.stderr
    )
    assert not processes_with(runtime)
    shutil.rmtree(runtime, ignore_errors=True)


def test_stop_drains_in_flight_requests_then_refuses_new_ones(small_repo: Path) -> None:
    srv = ShoalServer(small_repo)
    worker = srv.worker_pid("simple")
    os.kill(worker, signal.SIGSTOP)  # hold the request in flight across the stop
    outcome: dict[str, object] = {}

    def call() -> None:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        try:
            outcome["result"] = client.infer("simple", simple_inputs()).as_numpy("OUTPUT0")
        except Exception as exc:  # recorded and asserted below
            outcome["result"] = exc
        finally:
            client.close()  # in this thread: gevent's hub cannot close it from another

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert srv.http_status("/v2/health/live") == 0  # no longer accepting connections
    os.kill(worker, signal.SIGCONT)
    t.join(timeout=20)
    np.testing.assert_array_equal(outcome["result"], np.full((1, 16), 2))
    assert srv.stop() == 0
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_an_orderly_stop_logs_nothing_at_warning_or_above(small_repo: Path) -> None:
    """A frontend stopping on SIGTERM tells the broker first, so its exit is logged as
    a stop (INFO), not as a frontend lost; a start and a stop with nothing wrong page no
    operator."""
    srv = ShoalServer(small_repo, "--frontend-processes=2")
    frontends = srv.pids("frontend")
    client = httpclient.InferenceServerClient(srv.url)
    client.infer("simple", simple_inputs())
    client.close()
    assert srv.stop() == 0
    log = srv.log()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)
    assert not [line for line in log.splitlines() if re.search(r"\] [WE] ", line)], log
    for pid in frontends:
        assert re.search(rf"I shoal\.broker: frontend b'f-\d+-{pid}' stopped", log), log


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


def test_a_hung_instance_is_killed_its_request_answered_and_it_comes_back(
    small_repo: Path,
) -> None:
    srv = ShoalServer(small_repo, "--model-execution-timeout-secs=1")
    try:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        hung = srv.worker_pid("simple")
        os.kill(hung, signal.SIGSTOP)  # alive but never answering: a hang
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", simple_inputs())
        assert time.monotonic() - t0 < 10
        assert e.value.status() == "503"
        assert "had run one batch for" in srv.log()
        deadline = time.monotonic() + 30
        while not client.is_model_ready("simple") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert srv.worker_pid("simple") != hung
        reason = 'model="simple",reason="execution_timeout",version="1"'
        assert metric(srv, f"shoal_instance_exit_count{{{reason}}}") == 1
        np.testing.assert_array_equal(
            client.infer("simple", simple_inputs()).as_numpy("OUTPUT0"), np.full((1, 16), 2)
        )
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@pytest.mark.parametrize("limit_from", ["flag", "config"])
def test_an_instance_over_its_memory_limit_is_killed_and_the_rest_keeps_serving(
    small_repo: Path, tmp_path: Path, limit_from: str
) -> None:
    """A model that runs away with memory inside a batch (over twice its limit): its
    instance is killed at once, the request it ran gets 503 saying why (long before the
    batch would have ended), the other models keep serving, and it is restarted."""
    repo = tmp_path / "repo"
    for name in ("simple", "mlp"):
        shutil.copytree(small_repo / name, repo / name)
    args: tuple[str, ...] = ("--instance-memory-limit-mb=100",)
    if limit_from == "config":
        args = ()
        with open(repo / "simple" / "config.pbtxt", "a") as f:
            f.write('parameters { key: "shoal_instance_memory_limit_mb" '
                    'value { string_value: "100" } }\n')  # fmt: skip
    srv = ShoalServer(repo, *args, env={"SHOAL_TEST_FAULT": "leak-in-batch:simple"})
    try:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=60, concurrency=2)
        leaking = srv.worker_pid("simple")
        for model, limit in (("simple", 100), ("mlp", 100 if limit_from == "flag" else 0)):
            status, body = srv.http(f"/v2/shoal/models/{model}")
            assert status == 200, body
            (version,) = json.loads(body)["versions"]
            assert version["memory_limit_mb"] == limit
            (inst,) = version["instances"]
            assert 0 < inst["memory_mb"] < 100  # as the broker reads it: all is well
        labels = 'model="simple",version="1"'
        held = metric(srv, f'shoal_instance_memory_bytes{{instance="0",{labels}}}')
        assert 0 < held < 100 << 20
        assert metric(srv, f"shoal_instance_memory_limit_bytes{{{labels}}}") == 100 << 20
        t0 = time.monotonic()
        pending = client.async_infer("simple", simple_inputs())
        time.sleep(0.3)  # the batch is holding its memory now
        out = client.infer("mlp", mlp_input()).as_numpy("OUTPUT0")
        assert out is not None and out.shape == (1, 256)
        with pytest.raises(InferenceServerException) as e:
            pending.get_result()
        assert time.monotonic() - t0 < 10  # the batch alone would have taken 20 s
        assert e.value.status() == "503"
        assert re.search(
            rf"worker process \(pid {leaking}\) was killed \(it held \d+ MiB of memory, "
            r"over its limit of 100 MiB\)",
            str(e.value.message()),
        ), e.value.message()
        assert "is killed: it held" in srv.log()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if client.is_model_ready("simple") and srv.worker_pid("simple") != leaking:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"simple not restarted:\n{srv.log()}")
        srv.seen_pids |= set(srv.pids())
        exits = 'shoal_instance_exit_count{model="simple",reason="memory_limit",version="1"}'
        assert metric(srv, exits) == 1
        assert metric(srv, exits.replace("memory_limit", "crash")) == 0
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_an_instance_over_its_limit_is_stopped_after_its_batch_while_its_sibling_serves(
    small_repo: Path, tmp_path: Path
) -> None:
    """Instance 0 of simple leaks 256 MiB in each batch; instance 1 does not. Over its
    limit (500 MiB, after two batches) instance 0 gets no more batches and is stopped
    after the one it runs, so no request is lost: every request is answered, by instance
    1 (or by instance 0 restarted, until it leaks again). mlp's config of 0 frees it
    from the server's limit."""
    repo = tmp_path / "repo"
    for name in ("simple", "mlp"):
        shutil.copytree(small_repo / name, repo / name)
    with open(repo / "simple" / "config.pbtxt", "a") as f:
        f.write("instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    with open(repo / "mlp" / "config.pbtxt", "a") as f:
        f.write('parameters { key: "shoal_instance_memory_limit_mb" '
                'value { string_value: "0" } }\n')  # fmt: skip
    srv = ShoalServer(
        repo, "--instance-memory-limit-mb=500", env={"SHOAL_TEST_FAULT": "leak:simple#0"}
    )
    try:
        limits = {}
        for model in ("simple", "mlp"):
            _, body = srv.http(f"/v2/shoal/models/{model}")
            limits[model] = json.loads(body)["versions"][0]["memory_limit_mb"]
        assert limits == {"simple": 500, "mlp": 0}
        client = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        labels = 'model="simple",reason="memory_limit",version="1"'
        deadline = time.monotonic() + 30
        answered = 0
        while time.monotonic() < deadline and (answered < 20 or metric(
            srv, f"shoal_instance_exit_count{{{labels}}}") < 1):  # fmt: skip
            out = client.infer("simple", simple_inputs()).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((1, 16), 2))
            answered += 1
            time.sleep(0.2)  # instance 0 runs at most one batch more before the check
        assert metric(srv, f"shoal_instance_exit_count{{{labels}}}") >= 1, srv.log()
        assert "is stopped after its batch: it held" in srv.log()  # not killed: 2x is not reached
        srv.seen_pids |= set(srv.pids())
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_a_busy_worker_lets_go_of_slabs_its_frontend_unlinked(tmp_path: Path) -> None:
    """A burst of large requests grows the frontend's pool; once they are answered it
    unlinks the growth slabs, and the worker that mapped them must unmap them even while
    a steady trickle of requests never leaves it idle (else /dev/shm stays full of
    deleted, unlisted pages)."""
    model = modelgen.identity_model("FP32", [-1], batch=True)
    config = identity_config("identity_fp32", "FP32", "[ -1 ]", 8)
    modelgen.write_model(tmp_path, "identity_fp32", model, config)
    srv = ShoalServer(tmp_path)
    stop = threading.Event()
    worker = srv.worker_pid("identity_fp32")
    try:
        (frontend,) = srv.pids("frontend")
        os.kill(worker, signal.SIGSTOP)  # the burst queues: the pool must grow
        big = np.ones((1, 15 * 2**20), dtype=np.float32)  # 60 MiB a request

        def burst() -> None:
            c = httpclient.InferenceServerClient(srv.url, network_timeout=120)
            inp = httpclient.InferInput("INPUT0", list(big.shape), "FP32")
            inp.set_data_from_numpy(big)
            out = httpclient.InferRequestedOutput("OUTPUT0")
            assert c.infer("identity_fp32", [inp], outputs=[out]).as_numpy("OUTPUT0").shape == (
                big.shape
            )

        def front_slabs() -> int:
            return len(list(SHM_DIR.glob(f"shoal-{frontend}-front-*")))

        callers = [threading.Thread(target=burst) for _ in range(5)]
        for t in callers:
            t.start()
        deadline = time.monotonic() + 60
        while front_slabs() < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert front_slabs() == 5  # the first slab holds one; a growth slab for each other

        def trickle() -> None:
            c = httpclient.InferenceServerClient(srv.url)
            inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            while not stop.is_set():
                c.infer("identity_fp32", [inp])
                time.sleep(0.02)

        # Queued behind the burst already: from here on the worker is never idle.
        threading.Thread(target=trickle, daemon=True).start()
        os.kill(worker, signal.SIGCONT)
        for t in callers:
            t.join(timeout=120)
        assert front_slabs() < 5  # past its 256 MiB to keep, the pool shrank back

        def deleted_mappings() -> list[str]:
            with open(f"/proc/{worker}/maps") as f:
                return [ln for ln in f if f"shoal-{frontend}-front-" in ln and "(deleted)" in ln]

        deadline = time.monotonic() + 20
        while deleted_mappings() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not deleted_mappings()
        assert not stop.is_set()  # the trickle ran throughout
    finally:
        stop.set()
        os.kill(worker, signal.SIGCONT)
        srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


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
