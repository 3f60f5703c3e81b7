"""Connection floods: a frontend started under a low open-file limit (``prlimit
--nofile=1024``) flooded with 1,100 connections that send nothing still answers health and
inference on fresh connections; a frontend at its --http-max-connections with every
connection busy still answers health probes and refuses the rest with a 503 that says
why; gRPC's connection cap closes the connections beyond it."""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.frontend.http_connections import RESERVE_CONNECTIONS, too_many_connections
from tests.serverctl import ShoalServer, served
from tools import modelgen

SIMPLE_BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
            for n in ("INPUT0", "INPUT1")
        ]
    }
).encode()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("connection-limits")
    modelgen.write_shipped_repository(path, ("simple",))
    return path


def _fresh_request(srv: ShoalServer, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own (urllib opens one per request)."""
    return srv.http(path, body)


def _metric(srv: ShoalServer, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        page = r.read().decode()
    for line in page.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise LookupError(f"{name} {labels} not on the page")


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for s in held:
            s.close()


def test_1100_idle_connections_under_1024_open_files_lock_no_one_out(repo: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"this test process may open {hard} files; it needs 1,100 sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit")
    srv = ShoalServer(repo, open_files=1024)
    try:
        with _sockets() as idle:
            for _ in range(1100):
                idle.append(socket.create_connection(("127.0.0.1", srv.http_port), timeout=10))
            time.sleep(0.5)  # the frontend takes them in
            statuses = [_fresh_request(srv, "/v2/health/ready")[0] for _ in range(10)]
            assert statuses == [200] * 10
            status, answer = _fresh_request(srv, "/v2/models/simple/infer", SIMPLE_BODY)
            assert status == 200, answer
            assert json.loads(answer)["outputs"][0]["data"] == [2 * i for i in range(16)]
            evicted = _metric(
                srv, "shoal_http_connections_dropped_count", listener="HTTP", reason="idle_at_limit"
            )
            assert evicted > 0
            limit = _metric(srv, "shoal_http_connections_limit", listener="HTTP")
            assert 0 < limit < 1024
        assert "HTTP connections at the limit of" in srv.log()
        assert "open files: soft limit 1024 (hard limit 1024)" in srv.log()
    finally:
        assert srv.stop() == 0
        shutil.rmtree(srv.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def capped(repo: Path) -> Iterator[ShoalServer]:
    with served(repo, "--http-max-connections=4", "--grpc-max-connections=2") as srv:
        yield srv


def _busy(srv: ShoalServer) -> socket.socket:
    """A connection inside a request: an infer's headers, its body never sent."""
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
    sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    return sock


def _answer(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """``request``'s status and whole answer on ``sock``, which the server then closes."""
    sock.sendall(request)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    answer = b"".join(chunks)
    return int(answer.split(b" ", 2)[1]), answer


def test_at_the_cap_with_every_connection_busy_health_answers_and_the_rest_is_refused(
    capped: ShoalServer,
) -> None:
    with _sockets() as held:
        held += [_busy(capped) for _ in range(4)]
        time.sleep(0.3)  # all four inside their requests
        probe = socket.create_connection(("127.0.0.1", capped.http_port), timeout=10)
        held.append(probe)
        status, answer = _answer(probe, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200
        assert b"Connection: close" in answer
        other = socket.create_connection(("127.0.0.1", capped.http_port), timeout=10)
        held.append(other)
        status, answer = _answer(other, b"GET /v2/models/simple HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503
        assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"error": too_many_connections(4)}
        # Beyond the reserve too: a bare 503 at once, the request unread.
        held += [
            socket.create_connection(("127.0.0.1", capped.http_port), timeout=10)
            for _ in range(RESERVE_CONNECTIONS)
        ]
        time.sleep(0.3)
        beyond = socket.create_connection(("127.0.0.1", capped.http_port), timeout=10)
        held.append(beyond)
        data = beyond.recv(65536)
        assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), data
        assert too_many_connections(4).encode() in data
    refused = _metric(
        capped, "shoal_http_connections_dropped_count", listener="HTTP", reason="refused_at_limit"
    )
    assert refused >= 1
    assert _metric(capped, "shoal_http_connections_reserve_count", listener="HTTP") >= 2
    assert capped.http_status("/v2/health/ready") == 200  # all of them gone: room again


def test_grpc_connections_beyond_the_cap_are_closed(capped: ShoalServer) -> None:
    with _sockets() as held:
        held += [
            socket.create_connection(("127.0.0.1", capped.grpc_port), timeout=10) for _ in range(2)
        ]
        time.sleep(0.3)
        beyond = socket.create_connection(("127.0.0.1", capped.grpc_port), timeout=10)
        held.append(beyond)
        beyond.settimeout(5)
        got = b""
        with contextlib.suppress(ConnectionError):
            got = beyond.recv(65536)
        assert got == b""  # closed, where the two before it got the server's SETTINGS
        assert held[0].recv(9)[3] == 0x4
