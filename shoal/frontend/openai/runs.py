"""The model requests of one OpenAI request, run side by side through the data plane.

Each choice's request streams through ``DataPlane.infer_stream`` in a task of its own;
their responses come out of one queue in the order they arrive, each tagged with its
choice. A request of one choice (the common case) is read directly, without a task or a
queue between its stream and the handler. Leaving the ``async with`` (the answer
written, a failure, or the client gone, which cancels the handler) cancels every request
still running: closing its stream tells the broker, which cancels it in the model (the
decoupled cancel path).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import TypeAlias

from shoal.dataplane.plane import DataPlane
from shoal.dataplane.types import ClientRequest, InferenceResult, ResponseError
from shoal.ipc.errors import ServingError

#: One response of a choice's request; a ServingError: the request was refused or lost
#: (it ends); None: the request's stream ended.
Event: TypeAlias = InferenceResult | ResponseError | ServingError | None


class ChoiceRuns:
    """Not thread-safe: one handler's coroutine reads it."""

    def __init__(self, dataplane: DataPlane, requests: Sequence[ClientRequest]) -> None:
        self._dataplane = dataplane
        self._requests = requests
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._only: AsyncGenerator[InferenceResult | ResponseError, None] | None = None

    async def __aenter__(self) -> ChoiceRuns:
        if len(self._requests) == 1:
            self._only = self._dataplane.infer_stream(self._requests[0])
            return self
        self._tasks = [
            asyncio.create_task(self._pump(i, req)) for i, req in enumerate(self._requests)
        ]
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._only is not None:
            await asyncio.shield(self._only.aclose())  # (its stream closed: a cancel)
            return
        for task in self._tasks:
            task.cancel()
        # Each task closes its stream as it ends; none is left behind (even if this
        # handler is being cancelled itself).
        await asyncio.shield(asyncio.gather(*self._tasks, return_exceptions=True))
        while not self._queue.empty():  # answers read by nobody: their slots go back
            _, event = self._queue.get_nowait()
            if isinstance(event, InferenceResult):
                event.release()

    def stop(self, index: int) -> None:
        """Cancel choice ``index``'s request (its text is complete); a request read
        directly is closed on leaving."""
        if self._tasks:
            self._tasks[index].cancel()

    async def next(self) -> tuple[int, Event]:
        if self._only is None:
            return await self._queue.get()
        try:
            return 0, await anext(self._only, None)
        except ServingError as err:
            return 0, err

    async def _pump(self, index: int, req: ClientRequest) -> None:
        put = self._queue.put_nowait
        try:
            async with contextlib.aclosing(self._dataplane.infer_stream(req)) as answers:
                async for item in answers:
                    put((index, item))
        except ServingError as err:
            put((index, err))
        put((index, None))
