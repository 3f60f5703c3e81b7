"""A worker, frontend or broker killed, stopped or stuck: every request gets an answer,
the rest keeps serving, and no process or /dev/shm segment is left behind."""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.fault.conftest import metric, mlp_input, simple_inputs, write_broken
from tests.serverctl import SHM_DIR, ShoalServer


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
    write_broken(tmp_path)
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
