"""Broken configs and busy ports stop or limit a start with the reason named; a stop
drains what is in flight and logs nothing an operator must read."""

from __future__ import annotations

import os
import re
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
from tritonclient.utils import InferenceServerException

from tests.fault.conftest import simple_inputs, write_broken
from tests.serverctl import ShoalServer, free_port, processes_with


def test_broken_config_stops_startup_with_the_model_named(tmp_path: Path) -> None:
    write_broken(tmp_path)
    srv = ShoalServer(tmp_path, wait_ready=False)
    rc = srv.proc.wait(60)
    srv.stop()
    assert rc != 0
    assert "broken" in srv.log()
    assert "'max_batch_size' must be non-negative value" in srv.log()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_broken_config_without_exit_on_error_serves_the_rest(tmp_path: Path) -> None:
    write_broken(tmp_path)
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
    # Both frontends serving (ready means one answers; the stop passes on at once): the
    # subject is an orderly stop, not a frontend stopped halfway through its start.
    deadline = time.monotonic() + 60
    while not all(re.search(rf"\[{pid}\] I shoal\.frontend: metrics on ", srv.log())
                  for pid in frontends):  # fmt: skip
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)
    client = httpclient.InferenceServerClient(srv.url)
    client.infer("simple", simple_inputs())
    client.close()
    assert srv.stop() == 0
    log = srv.log()
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)
    assert not [line for line in log.splitlines() if re.search(r"\] [WE] ", line)], log
    for pid in frontends:
        assert re.search(rf"I shoal\.broker: frontend b'f-\d+-{pid}' stopped", log), log
