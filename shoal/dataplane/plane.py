"""The one data plane behind every transport (HTTP, gRPC, a Python model's scripting).

It validates a request against the model's config, places input bytes in this
process's shared-memory slab (small tensors ride inline in the message), reserves slots
for outputs of known size (shoal/dataplane/request_message.py), sends one typed message to
the broker, and returns views of the outputs. The caller releases those views
(``InferenceResult.release``) once it has written the response. The server's and models'
metadata, statistics and shared-memory registrations go through the broker too; the
repository extension (index, load, unload) is ``repository``
(shoal/dataplane/repository_extension.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from shoal.configs.trace_settings import Changes
from shoal.dataplane import client_shm_refs, ensemble_runner
from shoal.dataplane.broker_client import BrokerClient
from shoal.dataplane.model_handle import ModelHandle, check_byte_size
from shoal.dataplane.readiness_checks import instances_ready
from shoal.dataplane.repository_extension import RepositoryExtension, server_state
from shoal.dataplane.request_message import outputs, parse_version, request_message, uint_param
from shoal.dataplane.response_cache import ResponseCache
from shoal.dataplane.shadow import ShadowMirror
from shoal.dataplane.tracing import Sink, Tracer
from shoal.dataplane.types import (
    EMPTY_FINAL,
    FINAL_FLAG,
    ClientRequest,
    InferenceResult,
    OutputTensor,
    ResponseError,
)
from shoal.ipc import messages as m
from shoal.ipc.errors import (
    UNKNOWN_MODEL,
    AnswerError,
    Code,
    RequestError,
    ServingError,
    named,
)
from shoal.ipc.shm import ShmFull, SlabPool, Slot

log = logging.getLogger("shoal.frontend")

SERVER_VERSION = "2.73.0"
EXTENSIONS = [
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


def _no_sink(*_: object) -> None:
    return None


_HASH_IN_THREAD_BYTES = 1 << 20  # about 1 ms of hashing: more goes to a thread


class DataPlane:
    def __init__(
        self,
        broker: BrokerClient,
        pool: SlabPool,
        server_id: str = "triton",
        allow_client_shm: bool = False,
        cache: ResponseCache | None = None,
        trace_sink: Sink | None = None,
    ) -> None:
        """``trace_sink``: where finished traces go (shoal/frontend/trace_sink.py); None:
        this plane samples none of its requests (a worker's BLS plane: its traces are
        the children of the request its model runs, shoal/workers/bls.py)."""
        self.allow_client_shm = allow_client_shm
        self.cache = cache  # for models whose config enables it (response_cache.py)
        self.broker = broker
        self.pool = pool
        self.server_id = server_id
        self._models: dict[tuple[str, int], ModelHandle] = {}
        self._models_epoch = 0  # models loaded or unloaded so far (model control)
        # ensembles' steps, and their max_inflight_requests
        self._plans: dict[
            tuple[str, int], tuple[list[ensemble_runner.Step], dict[int, asyncio.Semaphore] | None]
        ] = {}
        self.requests_handled = 0
        self.repository = RepositoryExtension(broker)  # the index, load and unload
        self.shadow = ShadowMirror(self.infer)  # shadow traffic (shadow.py)
        # (bound once, not per request: what request_message calls)
        self._alloc_slot, self._next_id = self._alloc, broker.next_id
        broker.on_broker_lost.append(self._broker_lost)
        broker.on_models_changed.append(self._models_changed)
        self.tracer = Tracer(broker.index, trace_sink or _no_sink)
        if trace_sink is not None:
            broker.on_trace_table.append(self.tracer.apply)

    def _broker_lost(self) -> None:
        """Workers may still write into slots of requests that were just failed: those
        slots must never be handed out again. The whole pool is replaced; the old slabs
        are unlinked and their pages go once nothing maps them."""
        old, self.pool = self.pool, self.pool.fresh()
        old.close()
        self._models.clear()
        self._plans.clear()
        if self.cache is not None:  # a new broker may serve other model files
            self.cache.clear()

    def _models_changed(self, names: list[str]) -> None:
        """Models were loaded, reloaded or unloaded: what this frontend kept of them goes
        (their configs; the ensemble plans, which may use them; cached answers)."""
        changed = set(names)
        self._models_epoch += 1
        for key in [k for k in self._models if k[0] in changed]:
            del self._models[key]
        self._plans.clear()
        if self.cache is not None:
            self.cache.clear()

    # -- control plane ---------------------------------------------------------------

    def frontend_status(self) -> dict[str, object]:
        """Which frontend process this is, how many inferences it has served (shoal's
        extension: with several frontends, shows how the kernel spreads load), how many
        wait for an answer, the shared memory its pool holds and how much of it is taken."""
        status: dict[str, object] = {
            "index": self.broker.index,
            "pid": os.getpid(),
            "inference_requests": self.requests_handled,
            "requests_waiting": self.broker.waiting,
            "shm_pool_bytes": self.pool.total_bytes,
            "shm_pool_used_bytes": self.pool.used_bytes,
        }
        if self.broker.hop_timing:  # (SHOAL_HOP_TIMING=1) per leg: [requests, total ns]
            status["hops_ns"] = {leg: list(t) for leg, t in self.broker.hops.items()}
        if self.cache is not None:
            c = self.cache
            status |= {
                "response_cache_bytes": c.capacity,
                "response_cache_used_bytes": c.used,
                "response_cache_entries": len(c),
                "response_cache_hits": c.hits,
                "response_cache_misses": c.misses,
            }
        return status

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    async def log_settings(self, changes: dict[str, bool | int | str]) -> m.LogSettings:
        """The server's log settings, after ``changes`` (checked) if any: the broker
        applies them and sends them to every process."""
        query = m.LogQuery(self.broker.next_id(), changes)
        return (await self.broker.query(query, m.LogReply)).settings

    async def trace_settings(
        self, model: str, changes: Callable[[], Changes | None]
    ) -> tuple[m.TraceReply, int | None]:
        """The trace settings of ``model`` ("": the global ones), after the changes
        ``changes()`` reads from the request (checked: shoal/frontend/trace_api.py; None:
        none), and the traces their count still allows this frontend (None: it samples
        none under them). The broker keeps them and sends them to every frontend, this
        one before its answer. A model not ready is refused, in Triton's words, before
        the request's changes are read, as Triton does."""
        if model and not await self.model_ready(model, "", own_check=False):
            raise ServingError(Code.INVALID_ARG, f"Request for unknown model : {model}")
        query = m.TraceQuery(self.broker.next_id(), model, changes() or {})
        reply = await self.broker.query(query, m.TraceReply)
        if reply.error is not None:
            raise ServingError(Code(reply.error.code), reply.error.message)
        return reply, self.tracer.remaining(model)

    async def server_live(self) -> bool:
        state = await server_state(self.broker)
        return state is not None and state.live

    async def server_ready(self) -> bool:
        """Triton's server readiness: under strict readiness, also each READY model's
        own check (a Python model's ``is_ready``) on each of its instances."""
        state = await server_state(self.broker)
        if state is None or not state.ready:
            return False
        if state.ready_checks:
            return await instances_ready(self.broker.runtime_dir, state.ready_checks)
        return True

    async def _info(self, name: str, version: int) -> m.ModelInfo:
        info = await self.broker.query(
            m.ModelQuery(self.broker.next_id(), name, version), m.ModelInfo
        )
        if info.error is not None:
            raise ServingError(Code(info.error.code), info.error.message)
        return info

    async def model(self, name: str, version: str) -> ModelHandle:
        v = parse_version(version)
        handle = self._models.get((name, v))
        if handle is not None:
            return handle
        epoch = self._models_epoch
        info = await self._info(name, v)  # answers only for a READY version
        handle = ModelHandle(name, info.version, list(info.versions), info.config)
        if epoch == self._models_epoch:  # else a load or unload came in between: not kept
            self._models[(name, v)] = handle
        return handle

    def cached_model(self, name: str, version: str) -> ModelHandle:
        """The handle ``model()`` fetched earlier (call that first)."""
        return self._models[(name, parse_version(version))]

    async def statistics(self, name: str, version: str) -> list[m.ModelStats]:
        """Triton's statistics of every version of ``name`` (of every model when "")."""
        reply = await self.broker.query(
            m.StatsQuery(self.broker.next_id(), name, parse_version(version)), m.StatsReply
        )
        if reply.error is not None:
            raise ServingError(Code(reply.error.code), reply.error.message)
        return reply.model_stats

    async def metrics(self, quantiles: list[float]) -> list[m.VersionMetrics]:
        """The figures of the Prometheus metrics, with ``quantiles`` of each latency."""
        q = m.MetricsQuery(self.broker.next_id(), quantiles)
        return (await self.broker.query(q, m.MetricsReply)).versions

    async def shared_memory(
        self, op: str, kind: str, name: str = "", **fields: int | str | bytes
    ) -> list[m.RegionStatus]:
        """The shared-memory extension (register / unregister / status), one region table
        for every frontend process (it lives in the broker)."""
        if op != "status" and not self.allow_client_shm:
            raise client_shm_refs.disabled()
        msg = m.ShmRequest(self.broker.next_id(), op, kind, name, **fields)  # type: ignore[arg-type]
        reply = await self.broker.query(msg, m.ShmReply)
        if reply.error is not None:
            raise ServingError(Code(reply.error.code), reply.error.message)
        return reply.regions

    async def model_ready(self, name: str, version: str, own_check: bool = True) -> bool:
        """Whether that version (or the model, for "") is ready: an unknown one is not,
        nor one whose model's own readiness check (a Python model's ``is_ready``) says
        no on one of its instances (unless not ``own_check``). A version string that is
        no version is refused, as Triton refuses it."""
        number = parse_version(version)
        try:
            info = await self._info(name, number)
        except ServingError:
            return False
        if own_check and info.ready and info.ready_checks:  # (a Python model's is_ready)
            return await instances_ready(self.broker.runtime_dir, info.ready_checks)
        return info.ready

    # -- inference -------------------------------------------------------------------

    async def infer(self, req: ClientRequest) -> InferenceResult:
        model = await self.model(req.model, req.version)
        if model.decoupled:  # (the protocols refuse it first, in Triton's words)
            raise ServingError(
                Code.UNSUPPORTED,
                f"model '{model.name}' is decoupled: it answers through ModelStreamInfer and "
                "the generate extension only",
            )
        if model.is_ensemble:
            return await self._infer_ensemble(model, req)
        self.shadow.offer(req, model)
        started = time.perf_counter_ns()
        slots: list[Slot] = []
        key: bytes | None = None
        try:
            batch = model.batch_size(req)
            if self.cache is not None and model.response_cache:
                epoch = self._models_epoch
                lookup = time.perf_counter_ns()
                looked_up = time.monotonic_ns() if req.trace is not None else 0
                key = await self._key(req, model)
                if key is not None and (hit := self._cached(req, model, key, started, lookup)):
                    if req.trace is not None:
                        req.trace.cache_hit(req, model.version, looked_up, hit.outputs)
                    return hit
                lookup = time.perf_counter_ns() - lookup
                self.cache.lookup_ns += lookup
            msg = request_message(
                req, model, batch, slots, self._alloc_slot, self._next_id, self.allow_client_shm
            )
            if key is not None:
                msg.cache_miss_ns = lookup
            if req.trace is not None:
                req.trace.leaving(req, msg, self.broker)
        except ServingError as err:
            raise await self._refused(req, err, slots) from None
        except BaseException:
            self._free(slots)
            raise
        pool = self.pool
        late = req.trace.late if req.trace is not None else None
        try:
            # Cancelled after sending: the slots stay reserved until the answer comes back
            # (a traced request's trace waits for it too: the stamps the answer brings).
            resp = await self.broker.infer(msg, lambda: self._free(slots, pool), late)
        except asyncio.CancelledError:
            if req.trace is not None:
                req.trace.waiting = True
            raise
        except BaseException:
            self._free(slots, pool)
            raise
        if req.trace is not None:
            req.trace.answered(resp)
        try:
            if resp.error is not None:
                raise self._answer_error(resp.error, req)
            answer = outputs(resp, slots)
            if req.trace is not None:
                req.trace.outputs(answer)
        except BaseException:
            self._free(slots, pool)
            raise
        if key is not None and not resp.parameters:  # (the cache keeps outputs alone)
            self._keep(key, epoch, resp, model, answer)
        self.requests_handled += 1
        return InferenceResult(
            model_name=model.name,
            model_version=str(resp.model_version or model.version),
            id=req.id,
            outputs=answer,
            parameters=dict(resp.parameters),
            release=lambda: self._free(slots, pool),
        )

    async def infer_stream(
        self, req: ClientRequest
    ) -> AsyncGenerator[InferenceResult | ResponseError, None]:
        """The responses to ``req`` as they come, each an answer of its own: outputs, or
        an error that ends nothing but itself (raised: what refused the request before
        it ran). A decoupled model may send any number; the last is the one with the
        final flag, and the final flag alone yields nothing unless the request asked for
        it (``triton_enable_empty_final_response``), as an empty response. Each response
        says whether it is the final one (``triton_final_response``), as Triton's do.
        Another model's one answer (``infer``'s) is the final one. An ensemble with
        decoupled steps answers once per pass through its steps (``EnsembleRun.stream``)."""
        model = await self.model(req.model, req.version)
        if not model.decoupled:
            try:
                result = await self.infer(req)
            except AnswerError as err:  # the model's (or its instance's) answer
                yield ResponseError(err.message, True, err.code)
                return
            result.parameters[FINAL_FLAG] = True
            yield result
            return
        if model.is_ensemble:  # one with decoupled steps
            async with contextlib.aclosing(self._stream_ensemble(model, req)) as responses:
                async for r in responses:
                    yield r
            return
        slots: list[Slot] = []  # its inputs' (its outputs travel in its answers)
        try:
            batch = model.batch_size(req)
            msg = request_message(
                req, model, batch, slots, self._alloc_slot, self._next_id, self.allow_client_shm
            )
            if req.trace is not None:
                req.trace.leaving(req, msg, self.broker)
        except ServingError as err:
            raise await self._refused(req, err, slots) from None
        except BaseException:
            self._free(slots)
            raise
        pool = self.pool
        try:
            stream = self.broker.open_stream(msg)
        except BaseException:
            self._free(slots, pool)
            raise
        empty_final = req.parameters.get(EMPTY_FINAL) is True
        try:
            while True:
                resp = await stream.queue.get()
                if isinstance(resp, BaseException):
                    raise resp
                # The model has its own copy of the inputs once it answers (the Python
                # backend copies them before execute): a long stream pins no slot.
                self._free(slots, pool)
                if req.trace is not None and resp.final:
                    req.trace.answered(resp)  # (the worker's part rides on the final one)
                answer = self._stream_answer(resp, req, model, empty_final)
                if req.trace is not None and isinstance(answer, InferenceResult):
                    req.trace.outputs(answer.outputs)
                if answer is not None:
                    yield answer
                if resp.final:
                    self.requests_handled += 1
                    return
        finally:
            self.broker.close_stream(msg.req_id, stream, lambda: self._free(slots, pool))
            if stream.done():
                self._free(slots, pool)

    def _stream_answer(
        self, resp: m.InferResponse, req: ClientRequest, model: ModelHandle, empty_final: bool
    ) -> InferenceResult | ResponseError | None:
        """A decoupled model's response as its client gets it: an error, its outputs, or
        the final flag alone (None unless the request asked for it, ``empty_final``)."""
        if resp.error is not None:
            failed = self._answer_error(resp.error, req)
            return ResponseError(failed.message, resp.final, failed.code)
        if resp.empty and not empty_final:
            return None
        return InferenceResult(
            model_name=model.name,
            # (the final flag alone names no version, as in Triton 2.51)
            model_version="" if resp.empty else str(resp.model_version or model.version),
            id=req.id,
            outputs=outputs(resp, []),
            parameters={**resp.parameters, FINAL_FLAG: resp.final},
        )

    def _keep(
        self,
        key: bytes,
        epoch: int,
        resp: m.InferResponse,
        model: ModelHandle,
        answer: list[OutputTensor],
    ) -> None:
        """Keep a cacheable answer under its request's ``key``, unless a load or unload
        came since its request began (``epoch``: a stale answer) or another version
        answered (not this key's)."""
        assert self.cache is not None
        if resp.model_version in (0, model.version) and epoch == self._models_epoch:
            t0 = time.perf_counter_ns()
            self.cache.put(key, answer)
            self.cache.insertion_ns += time.perf_counter_ns() - t0

    def _answer_error(self, error: m.ErrorInfo, req: ClientRequest) -> AnswerError:
        """An answer's error as raised; a model unknown by now is no longer cached."""
        if error.message.startswith(UNKNOWN_MODEL):
            self._models.pop((req.model, parse_version(req.version)), None)
        message = named(error.message, req.id) if error.names_request else error.message
        return AnswerError(Code(error.code), message)

    async def _refused(
        self, req: ClientRequest, err: ServingError, slots: list[Slot]
    ) -> ServingError:
        """The error a request refused before it was sent gets (its slots freed)."""
        self._free(slots)
        await self._region_errors_first(req, err)
        if isinstance(err, RequestError):
            return ServingError(err.code, named(err.message, req.id))
        return err

    async def _infer_ensemble(self, model: ModelHandle, req: ClientRequest) -> InferenceResult:
        """Run an ensemble's steps (shoal/dataplane/ensemble_runner.py)."""
        started = time.perf_counter_ns()
        run, todo, batch = self._ensemble_run(model, req)
        if req.trace is not None:  # (its queue: the ensemble's own scheduler, as Triton's)
            req.trace.request_id = req.id
            req.trace.version = model.version
            req.trace.stamp("REQUEST_START")
            req.trace.stamp("QUEUE_START")
        try:
            result = await run.run(todo)
        except ServingError:
            self.broker.notify(ensemble_runner.done_note(model, started, False, batch))
            raise
        self.broker.notify(ensemble_runner.done_note(model, started, True, batch))
        self.requests_handled += 1
        if req.trace is not None:
            req.trace.stamp("REQUEST_END")
        return result

    async def _stream_ensemble(
        self, model: ModelHandle, req: ClientRequest
    ) -> AsyncGenerator[InferenceResult | ResponseError, None]:
        """Run the steps of an ensemble with decoupled ones: its responses as they come.
        A request its client leaves before the end is not counted."""
        started = time.perf_counter_ns()
        run, todo, batch = self._ensemble_run(model, req)
        if req.trace is not None:
            req.trace.request_id, req.trace.version = req.id, model.version
            req.trace.stamp("REQUEST_START")
            req.trace.stamp("QUEUE_START")
        async with contextlib.aclosing(run.stream(todo)) as responses:
            async for r in responses:
                yield r
        if req.trace is not None:
            req.trace.stamp("REQUEST_END")
        self.broker.notify(ensemble_runner.done_note(model, started, not run.failed, batch))
        self.requests_handled += 1

    def _ensemble_run(
        self, model: ModelHandle, req: ClientRequest
    ) -> tuple[ensemble_runner.EnsembleRun, list[ensemble_runner.Step], int]:
        """A request to an ensemble, once it passed the checks any request to the
        ensemble's own config passes: the run, the steps it needs, its batch size."""
        key = (model.name, model.version)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = (
                ensemble_runner.plan(model.spec),
                ensemble_runner.inflight_limits(model.spec),
            )
        steps, inflight = plan
        run = ensemble_runner.EnsembleRun(
            model, req, self.infer, self.model, inflight, self.infer_stream,
            model_file=self.repository.model_file,
        )  # fmt: skip
        try:
            batch = model.batch_size(req)
            in_region = any(t.data is None for t in req.inputs) or any(
                client_shm_refs.output_spec(o) is not None for o in req.outputs
            )
            if in_region and not self.allow_client_shm:
                raise client_shm_refs.disabled()
            for t in req.inputs[::-1]:
                if t.data is not None:
                    check_byte_size(t, model.name)
            todo = run.check(steps)
        except RequestError as err:
            raise ServingError(err.code, named(err.message, req.id)) from None
        return run, todo, batch

    def _cached(
        self, req: ClientRequest, model: ModelHandle, key: bytes, started: int, lookup: int
    ) -> InferenceResult | None:
        """The answer kept for ``key``, counted as Triton counts a cache hit (a success,
        no inference, no execution), or None. ``started``, ``lookup``: when the request
        and its lookup began (perf_counter_ns)."""
        assert self.cache is not None
        outputs = self.cache.get(key)
        if outputs is None:
            return None
        # A request kept was checked whole (request_message) before its answer was kept; its key
        # covers all those checks read, but for these parameters.
        uint_param(req, "priority")
        uint_param(req, "timeout")
        now = time.perf_counter_ns()
        self.cache.lookup_ns += now - lookup
        self.broker.notify(m.CacheHit(model.name, model.version, now - started, now - lookup))
        self.requests_handled += 1
        return InferenceResult(model.name, str(model.version), req.id, outputs)

    async def _key(self, req: ClientRequest, model: ModelHandle) -> bytes | None:
        """The request's cache key; large inputs are hashed off the event loop (hashlib
        lets go of the GIL), as a large body is inflated."""
        assert self.cache is not None
        size = sum(t.data.nbytes for t in req.inputs if t.data is not None)
        if size < _HASH_IN_THREAD_BYTES:
            return self.cache.key(req, model.name, model.version)
        return await asyncio.to_thread(self.cache.key, req, model.name, model.version)

    async def _region_errors_first(self, req: ClientRequest, err: ServingError) -> None:
        """Triton looks up every shared-memory reference while it parses a request, before
        any check against the model: a request that fails such a check (a shape, a byte
        size) but also names a region that does not resolve gets the region's error. The
        regions live in the broker, so only a failing request pays this round trip."""
        if not self.allow_client_shm or err.code == Code.UNSUPPORTED:
            return
        refs = client_shm_refs.references(req.inputs, req.outputs)
        if not refs:
            return
        check = m.ShmRequest(self.broker.next_id(), "check", "system", refs=refs)
        try:
            reply = await self.broker.query(check, m.ShmReply)
        except ServingError:
            return  # no broker: the request's own error stands
        if reply.error is not None:
            raise ServingError(Code(reply.error.code), reply.error.message) from None

    def _alloc(self, nbytes: int) -> Slot:
        try:
            return self.pool.alloc(nbytes)
        except ShmFull as exc:
            raise ServingError(Code.UNAVAILABLE, str(exc)) from None

    def _free(self, slots: list[Slot], pool: SlabPool | None = None) -> None:
        target = pool or self.pool
        for s in slots:
            target.free(s)
        slots.clear()
