"""HTTP clients that hang up: a request queued behind a stuck instance leaves the queue
(as one whose gRPC deadline passed does), and a stop while such requests are still
pending logs no error. The instance is held with SIGSTOP: nothing here races a clock."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.serverctl import ShoalServer


def _mlp_input(rows: int = 1) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("INPUT0", [rows, 256], "FP32")
    inp.set_data_from_numpy(np.ones((rows, 256), dtype=np.float32))
    return [inp]


def _send_infer(srv: ShoalServer, rows: int) -> socket.socket:
    """An mlp infer sent on a bare socket whose answer is never read: closing the
    socket is the client giving up. 32 rows are 32 KiB each way, held in the
    frontend's shared-memory slots."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [rows, 256], "datatype": "FP32",
                     "data": [1.0] * (rows * 256)}]}
    ).encode()  # fmt: skip
    head = (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: {srv.url}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", srv.http_port))
    sock.sendall(head.encode() + body)
    return sock


def _waiting(srv: ShoalServer) -> int:
    """Requests the frontend has sent and not seen answered (abandoned ones included)."""
    with urllib.request.urlopen(f"http://{srv.url}/v2/shoal/frontend", timeout=5) as r:
        return int(json.loads(r.read())["requests_waiting"])


def _failed(srv: ShoalServer) -> int:
    with urllib.request.urlopen(f"http://{srv.url}/v2/models/mlp/stats", timeout=5) as r:
        return int(json.loads(r.read())["model_stats"][0]["inference_stats"]["fail"]["count"])


def _state(srv: ShoalServer) -> dict[str, int]:
    return {"requests_waiting": _waiting(srv), "fail": _failed(srv)}


def _wait_for(srv: ShoalServer, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, _state(srv)
        time.sleep(0.05)


def test_a_queued_request_whose_http_client_hangs_up_leaves_the_queue(
    fresh_server: ShoalServer,
) -> None:
    """aiohttp cancels the handler of a closed connection only with handler_cancellation:
    without it the request stayed queued behind the stuck instance, holding its slots,
    until the instance ran it for nobody."""
    server = fresh_server
    http = httpclient.InferenceServerClient(server.url, network_timeout=30)
    http.infer("mlp", _mlp_input())  # loaded, and its config cached by the frontend
    worker = server.worker_pid("mlp")
    os.kill(worker, signal.SIGSTOP)
    try:
        running = http.async_infer("mlp", _mlp_input())  # taken by the stopped instance
        _wait_for(server, lambda: _waiting(server) == 1)
        gives_up = _send_infer(server, rows=32)
        _wait_for(server, lambda: _waiting(server) == 2)  # sent to the broker, queued
        gives_up.close()
        _wait_for(server, lambda: _waiting(server) == 1 and _failed(server) == 1)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert running.get_result().as_numpy("OUTPUT0").shape == (1, 256)
    _wait_for(server, lambda: _waiting(server) == 0)
    assert _failed(server) == 1  # the one that gave up, counted once; it never ran
    out = http.infer("mlp", _mlp_input(rows=32)).as_numpy("OUTPUT0")
    assert out.shape == (32, 256)


def test_a_stop_with_requests_pending_logs_no_error(small_repo: Path) -> None:
    """At the drain deadline a pending request's handler is cancelled; one whose client
    had hung up was cancelled only by the event loop's last sweep, after the broker
    connection closed, and its Cancel hit the closed socket: a ZMQError traceback."""
    srv = ShoalServer(small_repo, "--exit-timeout-secs=1")
    worker = 0
    try:
        http = httpclient.InferenceServerClient(srv.url, network_timeout=30)
        http.infer("mlp", _mlp_input())
        worker = srv.worker_pid("mlp")
        os.kill(worker, signal.SIGSTOP)
        running = _send_infer(srv, rows=1)
        _wait_for(srv, lambda: _waiting(srv) == 1)
        running.close()  # while the stopped instance holds it: its answer is still due
        queued = _send_infer(srv, rows=32)  # still connected when the drain ends
        _wait_for(srv, lambda: _waiting(srv) == 2)
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while srv.pids("frontend"):  # drained for 1s, then gone
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
        queued.close()
    finally:
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGCONT)
        rc = srv.stop()
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)
    log = srv.log()
    assert rc == 0, log
    assert "Traceback" not in log, log
    assert "unhandled error" not in log, log
