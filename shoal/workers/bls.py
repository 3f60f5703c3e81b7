"""Business logic scripting: a Python model's own requests to other models
(``pb_utils.InferenceRequest(model_name=..., ...).exec()`` and ``async_exec()``), and its
model control (``pb_utils.load_model``, ``unload_model``, ``is_model_ready``: the
repository extension's, through the broker, which refuses them outside explicit mode).

The worker reaches the other models the way a frontend does, through the broker: it
runs the data plane (shoal/dataplane/plane.py) on an event loop in a thread of its own, with
its own broker connection, result socket and shared-memory pool (``bls``
segments, owned by the worker: removed when it stops, swept after it dies). So a model's
request is checked, batched, routed and counted as a client's is; it may go to an
ensemble or a decoupled model (``exec(decoupled=True)``: an iterator over its
responses); its error comes back in the response (``has_error()``), never raised.

Started on a model's first request, so a worker whose model never calls another costs
nothing. A model that calls its own model waits for an instance of it: with one
instance, for ever, as in Triton, until the execution timeout (--model-execution-timeout-
secs, which counts the wait) kills the instance. BF16 tensors (``from_dlpack`` of a
bfloat16 tensor) go as BF16, and a BF16 output comes back as one (DLPack only, as in
Triton); a plain uint16 array goes as UINT16.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np

from shoal.dataplane.broker_client import BrokerClient
from shoal.dataplane.plane import DataPlane
from shoal.dataplane.tracing import Trace
from shoal.dataplane.types import (
    FINAL_FLAG,
    ClientRequest,
    InferenceResult,
    InputTensor,
    RequestedOutput,
    ResponseError,
)
from shoal.ipc import datatypes
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.shm import SlabPool
from shoal.workers import pb_utils
from shoal.workers.tensors import on_host
from shoal.workers.trace_note import first_traced

log = logging.getLogger("shoal.worker.bls")

#: The frontend index of a worker's BLS connection (identities also carry the pid).
BLS_INDEX = 9999
_POOL_BYTES = 4 << 20  # grows on demand, as a frontend's
_START_TIMEOUT_S = 10.0
_CODES = {
    Code.UNKNOWN: pb_utils.TritonError.UNKNOWN,
    Code.INTERNAL: pb_utils.TritonError.INTERNAL,
    Code.NOT_FOUND: pb_utils.TritonError.NOT_FOUND,
    Code.INVALID_ARG: pb_utils.TritonError.INVALID_ARG,
    Code.UNAVAILABLE: pb_utils.TritonError.UNAVAILABLE,
    Code.UNSUPPORTED: pb_utils.TritonError.UNSUPPORTED,
    Code.ALREADY_EXISTS: pb_utils.TritonError.ALREADY_EXISTS,
    Code.CANCELLED: pb_utils.TritonError.CANCELLED,
}
_END = object()  # the end of a decoupled model's responses
_STOPPING = "business logic scripting: the model instance is stopping"
#: Request parameters the server reads itself: a scripted request's own are passed on to
#: the model it calls, so these names are refused there (its settings have their own
#: arguments: correlation_id, flags, timeout).
_RESERVED = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
     "binary_data_output")
)  # fmt: skip


class BlsClient:
    def __init__(self, runtime_dir: Path) -> None:
        self.runtime_dir = runtime_dir
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dp: DataPlane | None = None
        self._closed = False
        # The batch the model runs now, set by the worker. A BLS request made while it
        # runs is traced as a child of its first traced request, if it has one; the
        # children's records are kept (under the lock) until the worker sends its answer.
        self.batch: m.ExecuteBatch | None = None
        self._children: dict[int, list[m.TraceRecord]] = {}
        self.next_trace_id = itertools.count((os.getpid() << 40) + 1).__next__

    # -- pb_utils' side (any thread of the model's) ------------------------------------

    def exec(self, req: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        if decoupled:
            return Responses(self, req)
        try:
            return self.submit(req).result()
        except concurrent.futures.CancelledError:  # the worker is stopping
            return _failed(_STOPPING, Code.UNAVAILABLE)

    def submit(self, req: pb_utils.InferenceRequest) -> concurrent.futures.Future[Any]:
        """One answer, as a future (``async_exec`` awaits it); never an exception."""
        try:
            loop, dp = self._started()
            call = _request(req)
        except ServingError as err:
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            done.set_result(_failed(err.message, err.code))
            return done
        gpu = req.bls_gpu()
        # its parent: the trace it names (request.trace()), else the batch's first traced
        batch = self.batch
        parent = req.trace().trace_id or (first_traced(batch) if batch is not None else 0)
        if parent:
            call.trace = Trace(self.next_trace_id(), call.model, self.next_trace_id, parent)
            return asyncio.run_coroutine_threadsafe(self._traced(dp, call, gpu), loop)
        return asyncio.run_coroutine_threadsafe(_one(dp, call, gpu), loop)

    # -- model control (pb_utils.load_model, unload_model, is_model_ready) -------------

    def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        """Load (or reload) a model, as the repository extension's load: back once it is
        ready; its failure raised as ServingError."""
        self._wait(lambda dp: dp.repository.model_control("load", name, config, files))

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._wait(
            lambda dp: dp.repository.model_control("unload", name, "", {}, unload_dependents)
        )

    def is_model_ready(self, name: str, version: str) -> bool:
        return bool(self._wait(lambda dp: dp.model_ready(name, version)))

    def _wait(self, call: Any) -> Any:
        """``call(data plane)``'s coroutine run on the loop, waited for."""
        loop, dp = self._started()
        try:
            return asyncio.run_coroutine_threadsafe(call(dp), loop).result()
        except concurrent.futures.CancelledError:  # the worker is stopping
            raise ServingError(Code.UNAVAILABLE, _STOPPING) from None

    async def _traced(
        self, dp: DataPlane, call: ClientRequest, gpu: int | None
    ) -> pb_utils.InferenceResponse:
        """A traced BLS request: its record is kept before the model has its answer."""
        try:
            return await _one(dp, call, gpu)
        finally:
            assert call.trace is not None
            with self._lock:
                self._children.setdefault(call.trace.parent_id, []).append(call.trace.record())

    def children(self, trace_id: int) -> list[m.TraceRecord]:
        """The records of the BLS requests the traced request ``trace_id`` made (taken)."""
        with self._lock:
            return self._children.pop(trace_id, [])

    def _started(self) -> tuple[asyncio.AbstractEventLoop, DataPlane]:
        """The loop and its data plane, connected on the first call (raises ServingError
        when the broker does not answer, or the worker is stopping)."""
        with self._lock:
            if self._closed:
                raise ServingError(Code.UNAVAILABLE, _STOPPING)
            if self._dp is None:
                self._start()
            assert self._loop is not None and self._dp is not None
            return self._loop, self._dp

    def _start(self) -> None:
        started: concurrent.futures.Future[DataPlane] = concurrent.futures.Future()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._run, args=(loop, started), name="bls", daemon=True)
        thread.start()
        self._dp = started.result()  # the thread's own connection deadline bounds this
        self._loop, self._thread = loop, thread
        log.info("business logic scripting: connected to the broker")

    # -- the loop's thread ------------------------------------------------------------

    def _run(
        self, loop: asyncio.AbstractEventLoop, started: concurrent.futures.Future[DataPlane]
    ) -> None:
        asyncio.set_event_loop(loop)
        try:
            dp = loop.run_until_complete(self._connect())
        except BaseException as exc:
            loop.close()
            started.set_exception(exc)
            return
        started.set_result(dp)
        loop.run_forever()
        loop.close()

    async def _connect(self) -> DataPlane:
        broker = BrokerClient(self.runtime_dir, BLS_INDEX)
        pool = SlabPool("bls", _POOL_BYTES)
        broker.start()
        if not await broker.wait_connected(_START_TIMEOUT_S):
            await broker.close()
            pool.close()
            raise ServingError(
                Code.UNAVAILABLE,
                f"business logic scripting: no broker answered in {_START_TIMEOUT_S:.0f} s",
            )
        return DataPlane(broker, pool)

    def close(self) -> None:
        """Stop the loop (the worker is stopping): calls still waiting get UNAVAILABLE,
        later ones too; the connection and the pool go."""
        with self._lock:
            self._closed = True
            loop, dp, thread = self._loop, self._dp, self._thread
        if loop is None or dp is None or thread is None:
            return

        async def stop() -> None:
            here = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not here:
                    task.cancel()
            dp.broker.leaving()
            await dp.broker.close()
            dp.pool.close()
            loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop)
        thread.join(5.0)


class Responses:
    """A decoupled model's responses to one scripted request, in order, as they come
    (the request is sent at once). ``cancel()``, or letting go of it before its end,
    cancels the request: the called model sees it (``is_cancelled()``)."""

    def __init__(self, client: BlsClient, req: pb_utils.InferenceRequest) -> None:
        self._answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._head: Any = None  # an answer taken by ``first``, not yet iterated
        self._done = False
        self._call: concurrent.futures.Future[None] | None = None
        try:
            loop, dp = client._started()
            call = _request(req)
        except ServingError as err:
            self._answers.put(_failed(err.message, err.code))
            self._answers.put(_END)
            return
        stream = _stream(dp, call, self._answers.put, req.bls_gpu())
        self._call = asyncio.run_coroutine_threadsafe(stream, loop)

    def __iter__(self) -> Responses:
        return self

    def first(self) -> Responses:
        """Wait for the first answer (what Triton's ``async_exec`` awaits, on a thread of
        the event loop's executor); the iteration still starts with it."""
        if self._head is None and not self._done:
            self._head = self._answers.get()
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        if self._done:
            raise StopIteration
        if self._head is not None:
            answer, self._head = self._head, None
        else:
            answer = self._answers.get()
        if answer is _END:
            self._done = True
            raise StopIteration
        return answer  # type: ignore[no-any-return]

    def cancel(self) -> None:
        if self._call is not None and not self._done:
            self._call.cancel()  # its task's end sends the Cancel and frees its memory

    def __del__(self) -> None:
        self.cancel()


def _request(req: pb_utils.InferenceRequest) -> ClientRequest:
    """A pb_utils request as the data plane takes a client's."""
    inputs = []
    for t in req.inputs():
        arr = on_host(t.data())  # (a GPU tensor goes through the host)
        if arr.dtype.kind in "OSU":
            name, data = "BYTES", datatypes.serialize_bytes(arr.reshape(-1))
        else:
            name = "BF16" if t._bf16 else _V2_NAMES.get(np.dtype(arr.dtype).newbyteorder("<"), "")
            if not name:
                raise ServingError(
                    Code.INVALID_ARG,
                    f"input '{t.name()}' has data type {arr.dtype}, which no model takes",
                )
            data = np.ascontiguousarray(arr, dtype=np.dtype(arr.dtype).newbyteorder("<")).tobytes()
        inputs.append(InputTensor(t.name(), name, list(arr.shape), memoryview(data)))
    params = dict(req.bls_parameters())
    for key in params:
        if key in _RESERVED or key.startswith("triton_"):
            raise ServingError(
                Code.INVALID_ARG,
                f"parameter '{key}' is reserved for Triton usage: a scripted request sets "
                "it through its own argument",
            )
    if req.timeout():
        params["timeout"] = req.timeout()
    if req.correlation_id():
        params["sequence_id"] = req.correlation_id()
        flags = req.flags()
        params["sequence_start"] = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
        params["sequence_end"] = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    version = req.bls_model_version()
    return ClientRequest(
        model=req.model_name(),
        version=str(version) if version > 0 else "",
        id=req.request_id(),
        parameters=params,
        inputs=inputs,
        outputs=[RequestedOutput(n) for n in req.requested_output_names()],
    )


_V2_NAMES = {dt.numpy: dt.name for dt in datatypes.DATATYPES.values() if dt.numpy is not None} | {
    np.dtype("<u2"): "UINT16"
}  # (BF16 shares uint16's layout: uint16 it is)


async def _one(dp: DataPlane, req: ClientRequest, gpu: int | None) -> pb_utils.InferenceResponse:
    try:
        if (await dp.model(req.model, req.version)).decoupled:
            return _failed(
                f"model '{req.model}' is decoupled: call it with exec(decoupled=True)",
                Code.UNSUPPORTED,
            )
        result = await dp.infer(req)
    except ServingError as err:
        return _failed(err.message, err.code)
    except Exception as exc:  # whatever happens, the model gets a response
        return _failed(f"{type(exc).__name__}: {exc}", Code.INTERNAL)
    try:
        return _taken(result, gpu)
    except Exception as exc:
        return _failed(f"{type(exc).__name__}: {exc}", Code.INTERNAL)


async def _stream(dp: DataPlane, req: ClientRequest, put: Any, gpu: int | None) -> None:
    try:
        async for r in dp.infer_stream(req):
            put(_failed(r.message, r.code) if isinstance(r, ResponseError) else _taken(r, gpu))
    except ServingError as err:
        put(_failed(err.message, err.code))
    except Exception as exc:  # whatever happens, the model's iterator must end
        put(_failed(f"{type(exc).__name__}: {exc}", Code.INTERNAL))
    finally:
        put(_END)


def _taken(result: InferenceResult, gpu: int | None) -> pb_utils.InferenceResponse:
    try:
        return _response(result, gpu)
    finally:
        result.release()


def _failed(message: str, code: Code) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, _CODES[code]))


def _response(result: InferenceResult, gpu: int | None) -> pb_utils.InferenceResponse:
    """The answer's outputs as the model's own arrays (copied out of shared memory); on
    GPU ``gpu`` where the request preferred it (PreferredMemory), BYTES staying on the
    host."""
    tensors = []
    for o in result.outputs:
        dt = datatypes.datatype(o.datatype)
        assert dt is not None and o.data is not None  # (no client shared memory here)
        if dt.numpy is None:
            values = np.empty(datatypes.element_count(o.shape), dtype=object)
            values[:] = datatypes.split_bytes(o.data)
            arr = values.reshape(o.shape)
        else:
            arr = np.frombuffer(o.data, dtype=dt.numpy).reshape(o.shape).copy()
            if gpu is not None:
                import cupy  # (a model that asks for GPU memory has it)

                with cupy.cuda.Device(gpu):
                    on_device = cupy.asarray(arr)
                tensors.append(pb_utils.Tensor._of(o.name, None, on_device, dt.name == "BF16"))
                continue
        tensors.append(pb_utils.Tensor._of(o.name, arr, None, dt.name == "BF16"))
    # the model's own parameters (the final flag is the stream's, not the model's)
    params = {k: v for k, v in result.parameters.items() if k != FINAL_FLAG}
    return pb_utils.InferenceResponse(tensors, parameters=params)
