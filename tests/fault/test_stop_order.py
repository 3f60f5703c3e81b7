"""The order of a stop under ``shoal serve`` (what a Kubernetes pod's termination relies
on): SIGTERM makes readiness fail first, then the requests in flight are answered, and
only then does the server exit."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shoal.ipc.lifecycle import pid_alive
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


class InFlight:
    """One request over HTTP and one over gRPC to ``simple``, sent from threads; each
    records its result (or exception) and the time it was answered."""

    def __init__(self, srv: ShoalServer) -> None:
        self.srv = srv
        self.answered: dict[str, float] = {}
        self.results: dict[str, object] = {}
        self.threads = [
            threading.Thread(target=self._over_http),
            threading.Thread(target=self._over_grpc),
        ]
        for t in self.threads:
            t.start()

    def _over_http(self) -> None:
        client = httpclient.InferenceServerClient(self.srv.url, network_timeout=60)
        try:
            self.results["http"] = client.infer("simple", _inputs(httpclient)).as_numpy("OUTPUT0")
        except Exception as exc:  # recorded and asserted by the test
            self.results["http"] = exc
        finally:
            self.answered["http"] = time.monotonic()
            client.close()  # in this thread: gevent's hub cannot close it from another

    def _over_grpc(self) -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.srv.grpc_port}")
        try:
            result = client.infer("simple", _inputs(grpcclient), client_timeout=60)
            self.results["grpc"] = result.as_numpy("OUTPUT0")
        except Exception as exc:  # recorded and asserted by the test
            self.results["grpc"] = exc
        finally:
            self.answered["grpc"] = time.monotonic()
            client.close()

    def join(self) -> None:
        for t in self.threads:
            t.join(10)


def _held_server(tmp_path: Path) -> tuple[ShoalServer, int]:
    """A server whose only worker is stopped (SIGSTOP): requests stay in flight."""
    modelgen.write_model(tmp_path, "simple", modelgen.simple_model(), modelgen.SIMPLE_CONFIG)
    srv = ShoalServer(tmp_path, "--exit-timeout-secs=30")
    assert srv.http_status("/v2/health/ready") == 200 and _grpc_ready(srv)
    worker = srv.worker_pid("simple")
    os.kill(worker, signal.SIGSTOP)
    return srv, worker


def test_sigterm_fails_readiness_first_then_drains_in_flight_requests_then_exits(
    tmp_path: Path,
) -> None:
    srv, worker = _held_server(tmp_path)
    flight = InFlight(srv)
    answered, results = flight.answered, flight.results
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
    flight.join()
    for protocol in ("http", "grpc"):
        np.testing.assert_array_equal(results[protocol], np.full((1, 16), 2), err_msg=protocol)
    assert exited is not None, "the server did not exit after draining"
    assert unready < min(answered.values()) <= max(answered.values()) < exited
    assert srv.stop() == 0  # (it has exited: this checks it left nothing behind)
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)


def test_a_drain_ends_at_once_when_the_broker_is_lost(tmp_path: Path) -> None:
    """A frontend draining its requests after SIGTERM waits for their answers; once its
    broker is gone there is nothing left to wait for: the requests fail, naming the
    broker, and the frontend exits long before its exit timeout (30s), even with a client
    still sending a request body, which would hold an HTTP drain for its whole length."""
    srv, worker = _held_server(tmp_path)
    flight = InFlight(srv)
    slow = socket.create_connection(("127.0.0.1", srv.http_port))
    slow.sendall(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    time.sleep(1.0)  # both requests have reached the held worker
    broker, frontend = srv.pids("broker")[0], srv.pids("frontend")[0]
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the drain has begun: the requests are still held
    assert not flight.answered, flight.results
    os.kill(broker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(frontend) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(frontend), "the frontend still drained without a broker"
    slow.close()
    flight.join()
    assert set(flight.answered) == {"http", "grpc"}
    for protocol, result in flight.results.items():
        assert isinstance(result, Exception), (protocol, result)
        assert "broker" in str(result), (protocol, result)
    os.kill(worker, signal.SIGCONT)  # the launcher's stop ends it
    srv.proc.wait(30)
    srv.stop()  # checks it left nothing behind: no process, no /dev/shm segment
    shutil.rmtree(srv.runtime_dir, ignore_errors=True)
