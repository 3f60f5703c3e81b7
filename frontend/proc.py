"""A frontend process: the HTTP and gRPC servers on one uvloop event loop.

Several frontend processes can share the same ports (SO_REUSEPORT). Each owns one
shared-memory slab pool for the tensors of its requests. Shutdown order: stop
accepting -> let in-flight requests finish until the exit timeout -> close the broker
connection -> unlink the slabs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aiohttp import web

from frontend import http_framing, restricted
from frontend.broker_client import BrokerClient
from frontend.dataplane import DataPlane
from frontend.grpc_server import build_server as build_grpc_server
from frontend.http_server import build_app
from frontend.metrics import MetricsServer, MetricsSettings
from frontend.response_cache import ResponseCache
from ipc.lifecycle import EXIT_FATAL, settle_gc
from ipc.shm import ShmFull, SlabPool, sweep_stale
from shoal.flags import GrpcTls

log = logging.getLogger("shoal.frontend")


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


async def _start_http(s: FrontendSettings, dataplane: DataPlane) -> web.AppRunner:
    app = build_app(dataplane, s.http_max_input_size, s.http_restricted)
    runner = web.AppRunner(
        app,
        access_log=None,
        # A client that closes its connection cancels its handler, as a gRPC deadline
        # does: the broker is told, and drops the request if it is still queued.
        handler_cancellation=True,
        # aiohttp waits this long for a handler, then as long again after failing its
        # body, before cancelling it: together, the exit timeout.
        shutdown_timeout=s.exit_timeout_secs / 2,
    )
    await runner.setup()
    http_framing.accept_chunked_with_length(runner)
    site = web.TCPSite(
        runner, s.http_address, s.http_port, reuse_port=s.reuse_http_port, backlog=1024
    )
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    log.info("HTTP on %s:%d", s.http_address, s.http_port)
    return runner


async def _start_grpc(s: FrontendSettings, dataplane: DataPlane) -> grpc.aio.Server:
    address = f"{s.grpc_address}:{s.grpc_port}"
    server = build_grpc_server(
        dataplane, address, s.reuse_grpc_port, s.grpc_restricted, s.grpc_options, s.grpc_tls
    )
    await server.start()
    log.info("gRPC on %s%s", address, " (TLS)" if s.grpc_tls is not None else "")
    return server


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
    dataplane = DataPlane(broker, pool, s.server_id, s.allow_client_shm, cache)
    runner: web.AppRunner | None = None
    grpc_server: grpc.aio.Server | None = None
    metrics: MetricsServer | None = None
    try:
        try:
            if s.allow_http:
                runner = await _start_http(s, dataplane)
            if s.allow_grpc:
                grpc_server = await _start_grpc(s, dataplane)
            if s.allow_metrics:
                metrics = MetricsServer(s.metrics, dataplane.metrics, dataplane.cache)
                await metrics.start()
        except (OSError, RuntimeError) as exc:
            log.error("cannot listen: %s", exc)
            return EXIT_FATAL
        settle_gc()
        await stop.wait()
        broker.leaving()
        log.info("stopping: draining in-flight requests (up to %.0fs)", s.exit_timeout_secs)
    finally:
        # Both listeners stop accepting at once, then each drains until the deadline.
        drains = []
        if grpc_server is not None:
            drains.append(grpc_server.stop(s.exit_timeout_secs))
        if runner is not None:
            drains.append(runner.cleanup())
        await asyncio.gather(*drains)
        if metrics is not None:
            await metrics.close()
        await broker.close()
        dataplane.pool.close()
    return 0
