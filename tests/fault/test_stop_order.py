"""The order of a stop under ``shoal serve`` (what a Kubernetes pod's termination relies
on): SIGTERM makes readiness fail first, then the requests in flight are answered, and
only then does the server exit."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer
from tools import modelgen


def _inputs(module: object) -> list[object]:
    ins = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return ins


def _grpc_ready(srv: ShoalServer) -> bool:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        return bool(client.is_server_ready(client_timeout=2))
    except Exception:  # refused, unavailable: not ready
        return False
    finally:
        client.close()


def test_sigterm_fails_readiness_first_then_drains_in_flight_requests_then_exits(
    tmp_path: Path,
) -> None:
    modelgen.write_model(tmp_path, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    srv = ShoalServer(tmp_path, "--exit-timeout-secs=30")
    assert srv.http_status("/v2/health/ready") == 200 and _grpc_ready(srv)
    worker = srv.worker_pid("simple")
    os.kill(worker, signal.SIGSTOP)  # the requests stay in flight until it resumes
    answered: dict[str, float] = {}
    results: dict[str, object] = {}

    def over_http() -> None:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=60)
        try:
            results["http"] = client.infer("simple", _inputs(httpclient)).as_numpy("OUTPUT0")
        except Exception as exc:  # recorded and asserted below
            results["http"] = exc
        finally:
            answered["http"] = time.monotonic()
            client.close()  # in this thread: gevent's hub cannot close it from another

    def over_grpc() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        try:
            result = client.infer("simple", _inputs(grpcclient), client_timeout=60)
            results["grpc"] = result.as_numpy("OUTPUT0")
        except Exception as exc:  # recorded and asserted below
            results["grpc"] = exc
        finally:
            answered["grpc"] = time.monotonic()
            client.close()

    threads = [threading.Thread(target=over_http), threading.Thread(target=over_grpc)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both requests have reached the held worker
    assert not answered
    srv.proc.send_signal(signal.SIGTERM)

    # 1. readiness fails (a probe's new connection), while the requests are still held
    deadline = time.monotonic() + 10
    while srv.http_status("/v2/health/ready") == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    unready = time.monotonic()
    assert srv.http_status("/v2/health/ready") != 200, "readiness did not fail on SIGTERM"
    assert not _grpc_ready(srv)
    time.sleep(1.0)  # the server waits for them: nothing answered, nothing exited
    assert not answered, results
    assert srv.proc.poll() is None, "the server exited with requests in flight"

    # 2. the requests are answered; 3. only then does the server exit
    os.kill(worker, signal.SIGCONT)
    exited = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if exited is None and srv.proc.poll() is not None:
            exited = time.monotonic()
        if exited is not None and len(answered) == 2:
            break
        time.sleep(0.005)
    for t in threads:
        t.join(10)
    for protocol in ("http", "grpc"):
        np.testing.assert_array_equal(results[protocol], np.full((1, 16), 2), err_msg=protocol)
    assert exited is not None, "the server did not exit after draining"
    assert unready < min(answered.values()) <= max(answered.values()) < exited
    assert srv.stop() == 0  # (it has exited: this checks it left nothing behind)
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)
