"""Admission of the connections of one HTTP listener: a cap, deadlines, and a reserve.

A socket is a file descriptor, and a process that runs out of them fails silently: the
event loop (libuv) then accepts each new connection and closes it at once, and nothing
is logged. So every listener of a frontend holds at most ``max_connections``, set (by
``connection_budget``) below what the open-file limit leaves, and at that cap:

1. the connections idle the longest (between requests, or still waiting for their first
   request's headers) are closed to make room, a batch at a time: nginx's answer to the
   same problem, and what keeps a flood of idle sockets from locking anyone out;
2. when none is idle (every connection is inside a request), the new connection goes to
   the *reserve*: up to ``reserve`` more connections answered by a second, small
   application that serves the health endpoints as usual and refuses every other
   request with a 503 that says why (so Kubernetes probes and load balancers still see
   the truth);
3. beyond the reserve, the connection gets a bare 503 and is closed.

Each of these is counted (``ConnectionCounts``, shown on ``/metrics``) and logged at
most once per ``LOG_EVERY_S``. A connection whose first request's headers have not
arrived ``header_timeout_s`` after it was accepted is closed (slow loris); between
requests aiohttp's keep-alive timeout closes idle ones, and a header that trickles in on
a kept-alive connection keeps it idle in aiohttp's eyes, so that timeout bounds it too.

Nothing here runs per request: a connection is counted when it is accepted, the handler
subclass hooks its end, and the idle check reads aiohttp 3.14's own RequestHandler state,
only when the cap is reached (``_idle_since``; tests/unit/frontend/test_http_connections.py
pins it).
Thread safety: the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field
from typing import Final, cast

import msgspec
from aiohttp import web

log = logging.getLogger("shoal.frontend.http")

#: Descriptors a frontend keeps for everything but its HTTP and gRPC connections: its
#: broker sockets, shared memory, log, metrics listener, a reserve's connections, the
#: sockets of an eviction batch not yet closed, NVML.
FD_RESERVE: Final = 192
#: Connections beyond the cap answered by the reserve application (health, or a 503).
RESERVE_CONNECTIONS: Final = 16
#: Connections the metrics listener holds (Prometheus keeps one per scraper).
METRICS_CONNECTIONS: Final = 16
DEFAULT_HTTP_CONNECTIONS: Final = 10_000
DEFAULT_GRPC_CONNECTIONS: Final = 1_000
LOG_EVERY_S: Final = 10.0
_MAX_EVICTION_BATCH: Final = 64


@dataclass(frozen=True)
class ConnectionLimits:
    """What one listener admits; ``keepalive_timeout_s`` goes to aiohttp's runner."""

    max_connections: int
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    reserve: int = 0  # connections the reserve application may hold beyond the cap


@dataclass
class ConnectionCounts:
    """One listener's connections now, and what its limits did since it started."""

    listener: str
    limit: int
    open: int = 0
    idle_closed: int = 0  # closed to make room at the cap
    reserve_answered: int = 0  # beyond the cap, served by the reserve application
    refused: int = 0  # beyond the cap and the reserve: a bare 503
    header_timeouts: int = 0  # first request's headers not there in time


@dataclass(frozen=True)
class Budget:
    """Connection caps of one frontend process, and what to log about them."""

    http: int
    grpc: int
    lowered: list[str] = field(default_factory=list)  # warnings: flags the limit lowered


def connection_budget(
    open_files: int, http: int | None, grpc: int | None, allow_http: bool, allow_grpc: bool
) -> Budget:
    """The HTTP and gRPC connection caps for a process allowed ``open_files``
    descriptors: the flags' values (``None``: the defaults), shrunk in proportion when
    together they would leave fewer than FD_RESERVE descriptors, besides the metrics
    listener's connections. A protocol not served gets 0 and leaves its share to the
    other."""
    wanted_http = (http or DEFAULT_HTTP_CONNECTIONS) if allow_http else 0
    wanted_grpc = (grpc or DEFAULT_GRPC_CONNECTIONS) if allow_grpc else 0
    room = max(open_files - FD_RESERVE - METRICS_CONNECTIONS, 2)
    total = wanted_http + wanted_grpc
    if total <= room:
        return Budget(wanted_http, wanted_grpc)
    got_http = wanted_http * room // total if allow_http else 0
    got_http = max(got_http, 1) if allow_http else 0
    got_grpc = max(room - got_http, 1) if allow_grpc else 0
    lowered = [
        f"{flag}={given} is more than the open-file limit ({open_files}) leaves room for: "
        f"using {got}"
        for flag, given, got in (
            ("--http-max-connections", http, got_http),
            ("--grpc-max-connections", grpc, got_grpc),
        )
        if given is not None and given > got
    ]
    return Budget(got_http, got_grpc, lowered)


def _refusal(message: str) -> bytes:
    body = msgspec.json.encode({"error": message})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    )
    return head.encode() + body


def too_many_connections(limit: int) -> str:
    return (
        f"too many connections: this frontend process holds its most ({limit}, "
        "--http-max-connections) and all of them are busy; try again later"
    )


class _Refused(asyncio.Protocol):
    """A connection beyond the cap and the reserve: a 503, then closed."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses: no isinstance)
        cast(asyncio.WriteTransport, transport).write(self._answer)
        transport.close()


class _Handler(web.RequestHandler):
    """aiohttp's connection handler, telling its gate when its connection ends."""

    __slots__ = ("_gate", "header_deadline")

    def __init__(self, gate: ConnectionGate, server: web.Server, **kwargs: object) -> None:
        super().__init__(server, **kwargs)  # type: ignore[arg-type]
        self._gate = gate
        self.header_deadline: asyncio.TimerHandle | None = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._gate._lost(self)
        super().connection_lost(exc)


def _idle_since(handler: web.RequestHandler) -> float | None:
    """When ``handler`` last went idle (the loop's clock, plus the keep-alive timeout),
    or None if it is not idle: inside a request, closing, or not started yet. Reads
    aiohttp 3.14's RequestHandler: ``_waiter`` is pending only while it waits for the
    next request's headers, and ``_next_keepalive_close_time`` is set when it starts
    and after each response."""
    waiter = handler._waiter
    if waiter is None or waiter.done() or handler._force_close or handler._close:
        return None
    return handler._next_keepalive_close_time


class ConnectionGate:
    """The protocol factory of one listening socket (see the module's docstring).

    ``server``: the listener's aiohttp server; ``reserve``: the reserve application's
    (None: no reserve). Both must have been set up by their runners. A connection counts
    from the moment it is accepted (the event loop tells its handler later) until its
    connection_lost; one this gate closed counts no more at once, though its descriptor
    goes a turn of the loop later (FD_RESERVE leaves room for that)."""

    def __init__(
        self,
        listener: str,
        server: web.Server,
        limits: ConnectionLimits,
        reserve: web.Server | None = None,
    ) -> None:
        self.limits = limits
        self._server = server
        self._reserve = reserve
        self._loop = asyncio.get_running_loop()
        self._open: dict[_Handler, None] = {}  # under the cap
        self._reserved: set[_Handler] = set()
        self._closing: set[_Handler] = set()  # of _open, closed here, not yet lost
        self._answer = _refusal(too_many_connections(limits.max_connections))
        self._batch = min(max(limits.max_connections // 32, 1), _MAX_EVICTION_BATCH)
        self._counts = ConnectionCounts(listener, limits.max_connections)
        self._since_log = ConnectionCounts(listener, limits.max_connections)
        self._log_due = 0.0
        self._log_timer: asyncio.TimerHandle | None = None

    def counts(self) -> ConnectionCounts:
        """A copy of the counts, with the connections open now."""
        c = self._counts
        open_now = len(self._open) + len(self._reserved)
        return ConnectionCounts(**{**c.__dict__, "open": open_now})

    def __call__(self) -> asyncio.BaseProtocol:
        at_cap = len(self._open) - len(self._closing) >= self.limits.max_connections
        if at_cap and not self._evict_idle():
            return self._beyond_the_cap()
        handler = self._handler(self._server)
        self._open[handler] = None
        return handler

    def _beyond_the_cap(self) -> asyncio.BaseProtocol:
        if self._reserve is not None and len(self._reserved) < self.limits.reserve:
            self._note("reserve_answered", 1)
            handler = self._handler(self._reserve)
            self._reserved.add(handler)
            return handler
        self._note("refused", 1)
        return _Refused(self._answer)

    def _handler(self, server: web.Server) -> _Handler:
        # As web.Server.__call__ makes its handlers, with the runner's settings.
        handler = _Handler(self, server, loop=self._loop, **server._kwargs)
        prepare = getattr(server, "prepare_handler", None)  # (a server with its own parser)
        if prepare is not None:
            prepare(handler)
        deadline = self._loop.time() + self.limits.header_timeout_s
        handler.header_deadline = self._loop.call_at(deadline, self._header_deadline, handler)
        return handler

    def _lost(self, handler: _Handler) -> None:
        self._open.pop(handler, None)
        self._reserved.discard(handler)
        self._closing.discard(handler)
        if handler.header_deadline is not None:
            # (a flood of short connections must not keep each handler until its timer)
            handler.header_deadline.cancel()
            handler.header_deadline = None

    def _header_deadline(self, handler: _Handler) -> None:
        handler.header_deadline = None
        if handler not in self._open and handler not in self._reserved:
            return  # gone already
        if handler.transport is None:  # accepted, then never connected: no loss to come
            self._lost(handler)
        elif handler._request_count == 0:
            self._counts.header_timeouts += 1
            self._close(handler)

    def _close(self, handler: _Handler) -> None:
        if handler in self._open:
            self._closing.add(handler)
        handler.force_close()

    def _evict_idle(self) -> bool:
        """Close the connections idle the longest, a batch of them (one scan of every
        connection pays for a batch of accepts); False if none is idle."""
        idle = [(since, h) for h in self._open if (since := _idle_since(h)) is not None]
        if not idle:
            return False
        oldest = heapq.nsmallest(self._batch, idle, key=lambda pair: pair[0])
        for _, handler in oldest:
            self._close(handler)
        self._note("idle_closed", len(oldest))
        return True

    def _note(self, what: str, n: int) -> None:
        """Count an action at the cap; log what the cap did at most every LOG_EVERY_S."""
        for counts in (self._counts, self._since_log):
            setattr(counts, what, getattr(counts, what) + n)
        if self._loop.time() >= self._log_due:
            self._log()
        elif self._log_timer is None:
            self._log_timer = self._loop.call_at(self._log_due, self._log)

    def _log(self) -> None:
        self._log_timer = None
        c = self._since_log
        self._since_log = ConnectionCounts(c.listener, c.limit)
        self._log_due = self._loop.time() + LOG_EVERY_S
        log.warning(
            "%s connections at the limit of %d: %d idle closed to make room, %d answered by "
            "the reserve, %d refused (since the last such line, at most %.0f s ago)",
            c.listener,
            c.limit,
            c.idle_closed,
            c.reserve_answered,
            c.refused,
            LOG_EVERY_S,
        )


class GatedSite(web.BaseSite):
    """A TCP listener whose connections pass through ``gate``."""

    __slots__ = ("_gate", "_host", "_port", "_reuse_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        gate: ConnectionGate,
        host: str,
        port: int,
        *,
        reuse_port: bool = False,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._gate = gate
        self._host = host
        self._port = port
        self._reuse_port = reuse_port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._server = await asyncio.get_running_loop().create_server(
            self._gate, self._host, self._port, backlog=self._backlog, reuse_port=self._reuse_port
        )
