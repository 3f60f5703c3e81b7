"""A frontend process: the HTTP server (and, next, gRPC) on one uvloop event loop.

Several frontend processes can share the same ports (SO_REUSEPORT). Each owns one
shared-memory slab pool for the tensors of its requests. Shutdown order: stop
accepting -> let in-flight requests finish until the exit timeout -> close the broker
connection -> unlink the slabs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from frontend.broker_client import BrokerClient
from frontend.dataplane import DataPlane
from frontend.http_server import build_app
from ipc.lifecycle import EXIT_FATAL
from ipc.shm import SlabPool

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


async def serve(s: FrontendSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker = BrokerClient(s.runtime_dir, s.index)
    broker.start()
    pool = SlabPool("front", s.shm_pool_bytes)
    runner: web.AppRunner | None = None
    try:
        dataplane = DataPlane(broker, pool, s.server_id)
        if s.allow_http:
            app = build_app(dataplane, s.http_max_input_size)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=s.exit_timeout_secs)
            await runner.setup()
            site = web.TCPSite(
                runner,
                s.http_address,
                s.http_port,
                reuse_port=s.reuse_http_port,
                backlog=1024,
                shutdown_timeout=s.exit_timeout_secs,
            )
            try:
                await site.start()
            except OSError as exc:
                log.error("cannot listen on %s:%d: %s", s.http_address, s.http_port, exc)
                return EXIT_FATAL
            log.info("HTTP on %s:%d", s.http_address, s.http_port)
        await stop.wait()
        log.info("stopping: draining in-flight requests (up to %.0fs)", s.exit_timeout_secs)
    finally:
        if runner is not None:
            await runner.cleanup()
        await broker.close()
        pool.close()
    return 0
