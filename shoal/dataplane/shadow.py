"""Shadow traffic: a share of the requests that name no version is sent again to the
model's shadow version (``shoal_shadow`` in its config, shoal/configs/traffic.py), whose
answer is dropped. The shadow version's statistics and metrics measure it; the client only
ever sees the answer of the version its request was routed to.

Each frontend process mirrors its own share of what it receives (a counter per model, not
chance), so the share holds over all of them together. Requests whose inputs lie in client
shared memory (the client may reuse it once answered) and the requests of sequences (their
state lives in one version) are never mirrored. A mirrored request copies its inputs at
once: the shadow copy owns them and the client's buffers may go as soon as it is answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from shoal.configs.traffic import shadow_due
from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import ClientRequest, InferenceResult, InputTensor

log = logging.getLogger("shoal.frontend")

_SEQUENCE_PARAMS = ("sequence_id", "sequence_start", "sequence_end")


class ShadowMirror:
    """Sends copies through ``infer`` (the data plane's) and drops their answers. One
    event loop; the copies run as tasks this object keeps until they end."""

    def __init__(self, infer: Callable[[ClientRequest], Awaitable[InferenceResult]]) -> None:
        self._infer = infer
        self._seen: dict[str, int] = {}
        self._running: set[asyncio.Task[None]] = set()
        self.sent = 0

    def offer(self, req: ClientRequest, model: ModelHandle) -> None:
        """Mirror ``req`` (to ``model``, the version a request naming none validates
        against) if its turn has come."""
        policy = model.traffic
        if not policy.shadow or req.version or any(t.data is None for t in req.inputs):
            return
        if any(p in req.parameters for p in _SEQUENCE_PARAMS):
            return
        seen = self._seen.get(model.name, 0)
        self._seen[model.name] = seen + 1
        if not shadow_due(seen, policy.shadow_ppm):
            return
        inputs = [
            InputTensor(t.name, t.datatype, list(t.shape), memoryview(bytes(t.data or b"")),
                        dict(t.parameters))
            for t in req.inputs
        ]  # fmt: skip
        copy = ClientRequest(
            req.model, str(policy.shadow), req.id, dict(req.parameters), inputs, list(req.outputs)
        )
        task = asyncio.ensure_future(self._run(copy))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self.sent += 1

    async def settled(self) -> None:
        """Once every copy sent so far has its answer (or its failure)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def _run(self, req: ClientRequest) -> None:
        try:
            result = await self._infer(req)
        except Exception as exc:  # only measured: its failure is the shadow version's count
            log.debug("shadow request to '%s' version %s failed: %s", req.model, req.version, exc)
            return
        result.release()
