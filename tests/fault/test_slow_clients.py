"""Slow clients against deadlines of a second (the flags make them short here): a first
request whose headers trickle in or never come, a kept-alive connection left idle, a body
sent a byte at a time; and over gRPC a connection that never says its preface. Each is
closed (or its request refused) after its deadline, and the server goes on serving.
Nothing here times the server: each check waits for an outcome with a generous bound."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.serverctl import ShoalServer, served
from tools import modelgen

DEADLINE_FLAGS = (
    "--http-header-timeout-secs=1",
    "--http-keepalive-timeout-secs=1",
    "--http-body-timeout-secs=1",
    "--http-body-min-rate=64",
    "--grpc-handshake-timeout=1000",
    "--grpc-max-concurrent-streams=7",
)
BOUND_S = 8.0  # far beyond every deadline: a connection still open then was not cut


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("slow-clients")
    modelgen.write_shipped_repository(repo, ("simple",))
    with served(repo, *DEADLINE_FLAGS) as srv:
        yield srv


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    sock.setblocking(False)
    return sock


def _closed_by_peer(sock: socket.socket, wait_s: float) -> bool | None:
    """True once the peer closed (EOF or reset), False on data, None if neither came
    within ``wait_s``."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    if not readable:
        return None
    try:
        return sock.recv(65536) == b""
    except ConnectionError:
        return True


def _trickle(sock: socket.socket, data: bytes, every_s: float = 0.25) -> tuple[float, bytes]:
    """Send ``data`` a byte every ``every_s`` until the peer answers or closes; returns
    how long that took and what it answered (b"" if it closed without a word)."""
    start = time.monotonic()
    answer = b""
    for byte in data:
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionError):
            break
        readable, _, _ = select.select([sock], [], [], every_s)
        if readable:
            with contextlib.suppress(ConnectionError):
                answer = sock.recv(65536)
            break
        assert time.monotonic() - start < BOUND_S, "still open: the deadline did not hold"
    return time.monotonic() - start, answer


def test_a_connection_that_sends_nothing_is_closed_after_the_header_deadline(
    server: ShoalServer,
) -> None:
    sock = _connect(server.http_port)
    try:
        assert _closed_by_peer(sock, BOUND_S) is True
    finally:
        sock.close()
    assert server.http_status("/v2/health/ready") == 200


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_deadline(server: ShoalServer) -> None:
    """A request line and 40 header bytes at 4 bytes a second would take 15 s."""
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    sock = _connect(server.http_port)
    try:
        took, answer = _trickle(sock, head)
        assert answer == b""  # closed, never answered
        assert took < len(head) * 0.25  # before the headers could all have come
    finally:
        sock.close()


def test_a_kept_alive_connection_left_idle_is_closed(server: ShoalServer) -> None:
    sock = _connect(server.http_port)
    try:
        sock.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _closed_by_peer(sock, BOUND_S) is False  # the answer; the connection stays
        assert _closed_by_peer(sock, BOUND_S) is True
    finally:
        sock.close()


def test_a_body_sent_a_byte_at_a_time_is_refused_and_its_connection_closed(
    server: ShoalServer,
) -> None:
    """4 bytes a second is below --http-body-min-rate=64 once the first second has gone:
    a 400 that says so, then the connection closes (whatever the client still sends)."""
    body = json.dumps({"inputs": [], "pad": "x" * 200}).encode()
    head = (
        "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = _connect(server.http_port)
    try:
        sock.send(head)
        _, answer = _trickle(sock, body)
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 400 Bad Request", answer
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert error.startswith("failed to read the request body: "), error
        assert error.endswith("slower than 64 bytes/s"), error
        _, after = _trickle(sock, b"x" * 40)  # lingering reads what still comes, a while
        assert after == b""
    finally:
        sock.close()
    assert server.http_status("/v2/health/ready") == 200


def test_a_grpc_connection_without_its_preface_is_closed(server: ShoalServer) -> None:
    sock = _connect(server.grpc_port)
    try:
        start = time.monotonic()
        closed = None
        while closed is not True and time.monotonic() - start < BOUND_S:
            closed = _closed_by_peer(sock, BOUND_S)  # (False: the server's SETTINGS)
        assert closed is True
    finally:
        sock.close()


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_MAX_CONCURRENT_STREAMS = 0x3


def test_grpc_advertises_its_cap_on_concurrent_streams(server: ShoalServer) -> None:
    """The server's first SETTINGS frame carries SETTINGS_MAX_CONCURRENT_STREAMS."""
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=BOUND_S)
    try:
        sock.sendall(_PREFACE)
        head = sock.recv(9, socket.MSG_WAITALL)
        length, kind = int.from_bytes(head[:3], "big"), head[3]
        assert kind == 0x4  # SETTINGS
        payload = sock.recv(length, socket.MSG_WAITALL)
    finally:
        sock.close()
    settings = {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
        for i in range(0, len(payload), 6)
    }
    assert settings[_MAX_CONCURRENT_STREAMS] == 7
