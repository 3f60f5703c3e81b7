"""shoal.frontend.http_connections: the connection budget, and a gate in front of a small
aiohttp application on uvloop, driven over loopback sockets in the same process. These
tests also pin the aiohttp RequestHandler state the gate reads (``_idle_since``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop
from aiohttp import web

from shoal.frontend.http_connections import (
    DEFAULT_GRPC_CONNECTIONS,
    DEFAULT_HTTP_CONNECTIONS,
    FD_RESERVE,
    METRICS_CONNECTIONS,
    ConnectionGate,
    ConnectionLimits,
    GatedSite,
    _idle_since,
    connection_budget,
    too_many_connections,
)

_ROOM_AT_1024 = 1024 - FD_RESERVE - METRICS_CONNECTIONS


def test_the_budget_keeps_the_flags_where_the_limit_leaves_room() -> None:
    b = connection_budget(1_048_576, None, None, True, True)
    assert (b.http, b.grpc, b.lowered) == (DEFAULT_HTTP_CONNECTIONS, DEFAULT_GRPC_CONNECTIONS, [])
    assert connection_budget(1_048_576, 5, 7, True, True).http == 5


def test_the_budget_shrinks_both_in_proportion_under_a_low_limit() -> None:
    b = connection_budget(1024, None, None, True, True)
    assert b.http + b.grpc == _ROOM_AT_1024
    assert b.http == DEFAULT_HTTP_CONNECTIONS * _ROOM_AT_1024 // 11_000
    assert b.lowered == []  # defaults: nothing the operator asked for was lowered


def test_a_flag_the_limit_lowers_is_named() -> None:
    b = connection_budget(1024, 5000, None, True, False)
    assert (b.http, b.grpc) == (_ROOM_AT_1024, 0)
    assert b.lowered == [
        f"--http-max-connections=5000 is more than the open-file limit (1024) leaves room "
        f"for: using {_ROOM_AT_1024}"
    ]


def test_a_protocol_not_served_leaves_its_share() -> None:
    assert connection_budget(1024, None, None, False, True).grpc == _ROOM_AT_1024
    assert connection_budget(1024, None, None, True, False).http == _ROOM_AT_1024


# -- a gate in front of a real aiohttp server ----------------------------------------

Served = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _slow(request: web.Request) -> web.Response:
    await request.read()  # a body that is not coming keeps the request open
    return web.Response(text="read")


async def _fast(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@contextlib.asynccontextmanager
async def _gated(limits: ConnectionLimits) -> AsyncIterator[tuple[ConnectionGate, Served]]:
    app = web.Application()
    app.router.add_get("/", _fast)
    app.router.add_post("/slow", _slow)
    reserve_app = web.Application()
    reserve_app.router.add_get("/v2/health/live", _fast)
    runner = web.AppRunner(app, keepalive_timeout=limits.keepalive_timeout_s)
    reserve = web.AppRunner(reserve_app)
    await runner.setup()
    await reserve.setup()
    assert runner.server is not None and reserve.server is not None
    gate = ConnectionGate("HTTP", runner.server, limits, reserve.server)
    site = GatedSite(runner, gate, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    opened: list[asyncio.StreamWriter] = []

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened.append(writer)
        await asyncio.sleep(0.05)  # accepted, and its handler started
        return reader, writer

    try:
        yield gate, connect
    finally:
        for w in opened:
            w.close()
        await runner.cleanup()
        await reserve.cleanup()


async def _get(
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], path: str = "/"
) -> tuple[int, bytes]:
    reader, writer = conn
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return int(head.split()[1]), await reader.readexactly(length)


async def _closed(reader: asyncio.StreamReader, within: float = 5.0) -> bool:
    """Whether the server closed the connection (EOF or a reset) within ``within``."""
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def _busy(connect: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection inside a request: its headers sent, its body never."""
    conn = await connect()
    conn[1].write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
    await asyncio.sleep(0.05)
    return conn


def _run(test: Callable[[], Awaitable[None]]) -> None:
    uvloop.run(test())


def test_at_the_cap_the_longest_idle_connection_makes_room() -> None:
    async def test() -> None:
        async with _gated(ConnectionLimits(2, header_timeout_s=30)) as (gate, connect):
            first = await connect()
            second = await connect()
            assert await _get(second) == (200, b"ok")  # idle again, but since later
            third = await connect()
            assert await _get(third) == (200, b"ok")
            assert await _closed(first[0])
            assert await _get(second) == (200, b"ok")
            counts = gate.counts()
            assert (counts.idle_closed, counts.reserve_answered, counts.refused) == (1, 0, 0)
            assert counts.open == 2

    _run(test)


def test_with_every_connection_busy_the_reserve_answers_then_a_bare_503() -> None:
    async def test() -> None:
        limits = ConnectionLimits(2, header_timeout_s=30, reserve=1)
        async with _gated(limits) as (gate, connect):
            await _busy(connect)
            await _busy(connect)
            reserved = await connect()
            assert await _get(reserved, "/v2/health/live") == (200, b"ok")
            beyond = await connect()
            status, body = await _get(beyond)
            assert status == 503
            assert too_many_connections(2) in body.decode()
            assert await _closed(beyond[0])
            counts = gate.counts()
            assert (counts.idle_closed, counts.reserve_answered, counts.refused) == (0, 1, 1)

    _run(test)


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\nHost:"], ids=["nothing", "part"])
def test_a_first_request_whose_headers_do_not_arrive_in_time_is_closed(sent: bytes) -> None:
    async def test() -> None:
        async with _gated(ConnectionLimits(10, header_timeout_s=0.3)) as (gate, connect):
            reader, writer = await connect()
            writer.write(sent)
            served = await connect()
            assert await _get(served) == (200, b"ok")  # a request in time keeps its own
            assert await _closed(reader, within=3)
            assert not await _closed(served[0], within=0.5)
            assert gate.counts().header_timeouts == 1

    _run(test)


def test_the_handler_state_the_gate_reads() -> None:
    """aiohttp 3.14: idle while it waits for headers (since its start, then since its
    last answer), not idle inside a request."""

    async def test() -> None:
        async with _gated(ConnectionLimits(10, header_timeout_s=30)) as (gate, connect):
            conn = await connect()
            (handler,) = gate._open
            started = _idle_since(handler)
            assert started is not None
            await asyncio.sleep(0.05)
            assert await _get(conn) == (200, b"ok")
            await asyncio.sleep(0.05)
            later = _idle_since(handler)
            assert later is not None and later > started
            conn[1].write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            await asyncio.sleep(0.05)
            assert _idle_since(handler) is None
            assert handler._request_count == 2

    _run(test)


def test_connections_that_come_and_go_leave_nothing_behind() -> None:
    """Each lost connection leaves the gate's books and drops its header timer (which
    would otherwise hold its handler until it fired)."""

    async def test() -> None:
        async with _gated(ConnectionLimits(4, header_timeout_s=30)) as (gate, connect):
            handlers = []
            for _ in range(20):
                _, writer = await connect()
                handlers.append(next(iter(gate._open)))
                writer.close()
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            assert gate.counts().open == 0
            assert all(h.header_deadline is None for h in handlers)

    _run(test)
