"""A readiness probe's questions to the instances whose model checks its own readiness
(a Python model's ``is_ready``): each worker answers on its readiness socket
(shoal/workers/readiness.py). The version is ready only if each says so; one that does
not answer in time, or is gone, is not."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from shoal.ipc import sockets
from shoal.ipc.readiness import CHECK_TIMEOUT_S, decode

#: Beyond the worker's own timeout (after which it answers "not ready" itself).
_MARGIN_S = 1.0


async def instances_ready(runtime_dir: Path, pids: list[int]) -> bool:
    """Whether every instance ``pids`` says its model is ready."""
    answers = await asyncio.gather(*(_ask(sockets.readiness_path(runtime_dir, p)) for p in pids))
    return all(answers)


async def _ask(path: str) -> bool:
    writer = None
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S + _MARGIN_S):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"?")
            return decode(await reader.read(65536))[0]
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
