"""A frontend process: the HTTP and gRPC servers on one uvloop event loop.

Several frontend processes can share the same ports (SO_REUSEPORT). Each owns one
shared-memory slab pool for the tensors of its requests. Shutdown order: stop
accepting -> let in-flight requests finish until the exit timeout -> close the broker
connection -> unlink the slabs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aiohttp import web

from shoal.configs.flags.frontend import GrpcTls
from shoal.dataplane.broker_client import BrokerClient
from shoal.dataplane.plane import DataPlane
from shoal.dataplane.response_cache import ResponseCache
from shoal.frontend import http_framing, restricted
from shoal.frontend.grpc_server import build_server as build_grpc_server
from shoal.frontend.http_body import BodyDeadline
from shoal.frontend.http_connections import (
    METRICS_CONNECTIONS,
    RESERVE_CONNECTIONS,
    Budget,
    ConnectionCounts,
    ConnectionGate,
    ConnectionLimits,
    GatedSite,
    connection_budget,
    too_many_connections,
)
from shoal.frontend.http_server import build_app, build_reserve_app
from shoal.frontend.metrics import MetricsServer, MetricsSettings
from shoal.frontend.trace_sink import TraceSink
from shoal.ipc.lifecycle import EXIT_FATAL, exit_by, settle_gc
from shoal.ipc.shm import ShmFull, SlabPool, sweep_stale

log = logging.getLogger("shoal.frontend")

# Past its exit timeout, how long a stopping frontend may still take (closing its broker
# connection, unlinking its slabs) before it is made to exit.
_EXIT_MARGIN_S = 10.0


@dataclass(frozen=True)
class Connections:
    """The bounds on connections and slow clients (configs.flags.frontend.add_connection_flags);
    ``None``: the default caps, or what ``open_files`` leaves."""

    open_files: int = 1024
    http_max: int | None = None
    grpc_max: int | None = None
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    body: BodyDeadline = field(default_factory=BodyDeadline)
    openai_port: int | None = None  # the HTTP service's second port (--openai-port)


@dataclass
class FrontendSettings:
    runtime_dir: Path
    index: int = 0
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    server_id: str = "triton"
    http_max_input_size: int = 64 * 1024 * 1024
    shm_pool_bytes: int = 64 * 1024 * 1024
    exit_timeout_secs: float = 30.0
    reuse_http_port: bool = False
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    reuse_grpc_port: bool = False
    allow_client_shm: bool = False
    response_cache_bytes: int = 0  # 0: no response cache
    allow_metrics: bool = True
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    http_restricted: restricted.Rules = field(default_factory=dict)
    grpc_restricted: restricted.Rules = field(default_factory=dict)
    grpc_options: list[tuple[str, int]] = field(default_factory=list)  # keepalive...
    grpc_tls: GrpcTls | None = None
    connections: Connections = field(default_factory=Connections)


@dataclass
class _Http:
    """The HTTP listener: its application's runner, the reserve's, and their gate."""

    runner: web.AppRunner
    reserve: web.AppRunner
    gate: ConnectionGate

    async def close(self) -> None:
        await self.runner.cleanup()  # stops accepting, then drains
        await self.reserve.cleanup()


async def _start_http(s: FrontendSettings, dataplane: DataPlane, max_connections: int) -> _Http:
    c = s.connections
    app = build_app(dataplane, s.http_max_input_size, s.http_restricted, c.body)
    runner = web.AppRunner(
        app,
        access_log=None,
        # A client that closes its connection cancels its handler, as a gRPC deadline
        # does: the broker is told, and drops the request if it is still queued.
        handler_cancellation=True,
        # aiohttp waits this long for a handler, then as long again after failing its
        # body, before cancelling it: together, the exit timeout.
        shutdown_timeout=s.exit_timeout_secs / 2,
        keepalive_timeout=c.keepalive_timeout_s,
        # The rest of a body left unread after an answer is read away no longer than a
        # body may stall (a slow loris refused for its body goes at once).
        lingering_time=min(10.0, c.body.idle_s),
    )
    refusal = too_many_connections(max_connections)
    reserve = web.AppRunner(
        build_reserve_app(dataplane, refusal, s.http_restricted),
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        keepalive_timeout=c.header_timeout_s,
    )
    await runner.setup()
    http_framing.accept_chunked_with_length(runner)
    await reserve.setup()
    assert runner.server is not None and reserve.server is not None
    limits = ConnectionLimits(
        max_connections, c.header_timeout_s, c.keepalive_timeout_s, RESERVE_CONNECTIONS
    )
    http = _Http(runner, reserve, ConnectionGate("HTTP", runner.server, limits, reserve.server))
    # The same application and gate on the second port: one service, one connection cap.
    ports = [s.http_port] + ([c.openai_port] if c.openai_port else [])
    try:
        for port in ports:
            site = GatedSite(runner, http.gate, s.http_address, port, reuse_port=s.reuse_http_port)
            await site.start()
    except OSError:
        await http.close()
        raise
    log.info("HTTP on %s:%s", s.http_address, ",".join(map(str, ports)))
    return http


async def _start_grpc(
    s: FrontendSettings, dataplane: DataPlane, max_connections: int
) -> grpc.aio.Server:
    address = f"{s.grpc_address}:{s.grpc_port}"
    options = [*s.grpc_options, ("grpc.max_allowed_incoming_connections", max_connections)]
    server = build_grpc_server(
        dataplane, address, s.reuse_grpc_port, s.grpc_restricted, options, s.grpc_tls
    )
    await server.start()
    log.info("gRPC on %s%s", address, " (TLS)" if s.grpc_tls is not None else "")
    return server


def _budget(s: FrontendSettings) -> Budget:
    """The connection caps, logged: what a stuck or flooded listener can hold."""
    c = s.connections
    budget = connection_budget(c.open_files, c.http_max, c.grpc_max, s.allow_http, s.allow_grpc)
    for line in budget.lowered:
        log.warning("%s", line)
    log.info(
        "connections: HTTP at most %d, gRPC at most %d (open-file limit %d)",
        budget.http,
        budget.grpc,
        c.open_files,
    )
    return budget


def _metrics_server(
    s: FrontendSettings, dataplane: DataPlane, gates: list[ConnectionGate]
) -> MetricsServer:
    c = s.connections
    limits = ConnectionLimits(METRICS_CONNECTIONS, c.header_timeout_s, c.keepalive_timeout_s)

    def counts() -> list[ConnectionCounts]:
        return [gate.counts() for gate in gates]

    hops = dataplane.broker.hop_histogram
    return MetricsServer(
        s.metrics, dataplane.metrics, dataplane.cache, limits, counts, s.runtime_dir, hops
    )


def _listen_error(service: str, address: str, exc: Exception) -> str:
    """Why a service cannot listen, in tritonserver's words where it has them: its
    servers say "Unavailable - Socket '<address>' already in use" (gRPC's for any
    failure to bind, which gRPC does not explain)."""
    grpc_bind = service == "GRPC" and str(exc).startswith("cannot listen on")
    if grpc_bind or getattr(exc, "errno", None) == errno.EADDRINUSE:
        return f"Unavailable - Socket '{address}' already in use"
    return f"Unavailable - cannot listen on {address}: {exc}"


async def _drain(
    timeout_s: float, http: _Http | None, grpc_server: grpc.aio.Server | None, broker: BrokerClient
) -> None:
    """Both listeners stop accepting at once, then each drains until the deadline, or
    until nothing is left to wait for: without a broker (lost during the drain, or gone
    before it) every waiting request has been failed and no later one can run, so the
    handlers still running are cancelled at once."""
    drains = []
    if grpc_server is not None:
        drains.append(grpc_server.stop(timeout_s))
    if http is not None:
        drains.append(http.close())
    drained = asyncio.ensure_future(asyncio.gather(*drains))
    orphaned = asyncio.get_running_loop().create_future()

    def no_broker() -> None:
        if not orphaned.done():
            orphaned.set_result(None)

    broker.on_broker_lost.append(no_broker)
    if not broker.connected:
        no_broker()
    await asyncio.wait((drained, orphaned), return_when=asyncio.FIRST_COMPLETED)
    if drained.done():
        drained.result()
        return
    log.info("stopping: no broker is left to answer; ending the drain")
    if grpc_server is not None:
        await grpc_server.stop(None)  # cancels the calls the first stop still waits on
    drained.cancel()  # aiohttp's shutdown cancels its handlers and returns
    with contextlib.suppress(asyncio.CancelledError):
        await drained


async def serve(s: FrontendSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # What an earlier frontend killed without a chance to unlink left behind (the
    # launcher sweeps too; under supervisord this is where it happens).
    if stale := sweep_stale():
        log.info("removed %d stale shared-memory segment(s)", len(stale))
    try:
        pool = SlabPool("front", s.shm_pool_bytes)
    except ShmFull as exc:
        log.error("%s", exc)
        return EXIT_FATAL
    summaries = s.allow_metrics and s.metrics.config.summary_latencies
    broker = BrokerClient(s.runtime_dir, s.index, summaries)
    broker.start()
    cache = ResponseCache(s.response_cache_bytes) if s.response_cache_bytes > 0 else None
    traces = TraceSink(s.index)
    broker.on_trace_table.append(traces.follow)
    dataplane = DataPlane(broker, pool, s.server_id, s.allow_client_shm, cache, traces.put)
    http: _Http | None = None
    grpc_server: grpc.aio.Server | None = None
    metrics: MetricsServer | None = None
    budget = _budget(s)
    try:
        service, address = "", ""
        try:
            if s.allow_http:
                ports = f"{s.http_port}" + (f",{p}" if (p := s.connections.openai_port) else "")
                service, address = "HTTP", f"{s.http_address}:{ports}"
                http = await _start_http(s, dataplane, budget.http)
            if s.allow_grpc:
                service, address = "GRPC", f"{s.grpc_address}:{s.grpc_port}"
                grpc_server = await _start_grpc(s, dataplane, budget.grpc)
            if s.allow_metrics:
                service, address = "Metrics", f"{s.metrics.address}:{s.metrics.port}"
                gates = [http.gate] if http is not None else []
                metrics = _metrics_server(s, dataplane, gates)
                await metrics.start()
        except (OSError, RuntimeError) as exc:
            why = _listen_error(service, address, exc)
            log.error("failed to start %s service: %s", service, why)
            return EXIT_FATAL
        settle_gc()
        await stop.wait()
        broker.leaving()
        log.info("stopping: draining in-flight requests (up to %.0fs)", s.exit_timeout_secs)
        exit_by(s.exit_timeout_secs + _EXIT_MARGIN_S, f"frontend {s.index}")
    finally:
        await _drain(s.exit_timeout_secs, http, grpc_server, broker)
        if metrics is not None:
            await metrics.close()
        await broker.close()
        dataplane.pool.close()
        traces.close()  # (Triton writes its trace file at exit)
    return 0
