"""Triton's ``inference.GRPCInferenceService`` (and ``grpc.health.v1.Health``) on
grpcio's asyncio server: a thin adapter over the same DataPlane as HTTP.

Errors map to gRPC status codes with Triton's table (ipc.errors.GRPC_STATUS). A stream
(ModelStreamInfer) is shoal/frontend/grpc_stream.py's.

A message that is not the protobuf its method takes is refused as Triton's C++ server
refuses it, INTERNAL "Unable to parse request", with one log line: grpcio would answer
UNKNOWN and log a traceback for each, a flood any client could cause. On a stream the
requests before it are answered, then the stream ends with that status (Triton ends it
with OK, which hides that the rest of the stream was dropped). An RPC shoal does not
implement answers UNIMPLEMENTED without grpcio's traceback too.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from shoal.configs.flags.frontend import GrpcTls
from shoal.configs.trace_settings import Changes
from shoal.configs.traffic import ROUTE_KEY, ROUTE_KEY_HEADER
from shoal.dataplane.plane import DataPlane
from shoal.dataplane.tracing import Trace
from shoal.dataplane.types import ClientRequest
from shoal.frontend import grpc_codec, grpc_stream, log_settings, restricted, trace_api
from shoal.frontend.grpc_stream import UNPARSABLE_MESSAGE, Unparsable, decode_request, internal
from shoal.ipc import logs
from shoal.ipc.errors import DECOUPLED_UNARY, GRPC_STATUS, Code, ServingError

log = logging.getLogger("shoal.frontend.grpc")

MAX_MESSAGE_BYTES: Final[int] = 2**31 - 1  # Triton's INT32_MAX
R = TypeVar("R")
_STREAM_METHOD: Final[str] = "/inference.GRPCInferenceService/ModelStreamInfer"


def _parse_guarded(method: str, parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def guarded(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, or whatever else the parser raises
            return Unparsable(method, f"{type(exc).__name__}: {exc}"[:200])

    return guarded


def _refusing(behavior: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Any]:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Unparsable):
            request.log()
            await context.abort(grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)
        return await behavior(request, context)

    return unary


def _unimplemented(method: str) -> Callable[[Any, Any], Awaitable[Any]]:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented")

    return unary


def _unimplemented_stream(method: str) -> Callable[[Any, Any], AsyncIterator[Any]]:
    refuse = _refusing(_unimplemented(method))

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await refuse(request, context)  # aborts
        yield None  # never reached: makes this the async generator grpcio expects

    return stream


class _GuardedRegistration:
    """Stands in for the server while generated code registers a service: each method's
    deserializer is guarded (unary methods refuse the unparsable themselves; the stream
    handler checks each message) before the handlers reach the real server. A method
    the servicer leaves to the generated base class (a plain function that raises
    NotImplementedError, which grpcio logs with a traceback per call) answers
    UNIMPLEMENTED itself."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.services: list[str] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come again, by name, in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        guarded = {}
        for name, h in handlers.items():
            method = f"/{service}/{name}"
            behavior = h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream
            ours = inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)
            if not ours and h.unary_unary is not None:
                h = h._replace(unary_unary=_unimplemented(method))
            elif not ours and h.unary_stream is not None:
                h = h._replace(
                    request_deserializer=_parse_guarded(method, h.request_deserializer),
                    unary_stream=_unimplemented_stream(method),
                )
            if h.unary_unary is not None and h.request_deserializer is not None:
                h = h._replace(
                    request_deserializer=_parse_guarded(method, h.request_deserializer),
                    unary_unary=_refusing(h.unary_unary),
                )
            elif method == _STREAM_METHOD:  # its handler checks each message itself
                h = h._replace(request_deserializer=_parse_guarded(method, h.request_deserializer))
            guarded[name] = h
        # Generic handlers only. grpc.aio keeps a pending request-call future for each
        # registered method and waits on all of them for every call it takes (one wait
        # over 25 futures a request for these two services); the generic handler's one
        # future and a dictionary lookup by method name cost far less.
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, guarded),)
        )
        self.services.append(service)


async def _guard(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[R]]) -> R:
    """Run an RPC: a ServingError becomes its gRPC status; anything else unexpected is
    logged once and answered INTERNAL, as the HTTP side answers 500."""
    try:
        return await call()
    except ServingError as exc:
        await context.abort(getattr(grpc.StatusCode, GRPC_STATUS[exc.code]), exc.message)
        raise  # abort raises; this keeps type checkers honest
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        log.exception("unhandled error in an RPC")
        await context.abort(grpc.StatusCode.INTERNAL, internal(exc))
        raise


class LateAnswerLogFilter(logging.Filter):
    """grpcio logs at ERROR, with a traceback, an answer it could not send because the
    call had already ended: the client cancelled it or its deadline passed in the instant
    between the handler's last await and the send (before that instant the handler is
    cancelled quietly). The client already has its CANCELLED or DEADLINE_EXCEEDED, and
    an operator alerting on errors would be paged for a client's timeout. Such a record
    becomes one DEBUG line (shown with ``--log-verbose``); any other record of that
    logger, a failure to start a batch included, passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if type(exc).__name__ != "ExecuteBatchError" or not str(exc).startswith(
            'Failed "execute_batch"'
        ):
            return True
        method = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        logs.rewrite(
            record,
            logging.DEBUG,
            "%s: the call ended (cancelled, or past its deadline) before its answer was sent",
            method,
        )
        return logging.getLogger().isEnabledFor(logging.DEBUG)


logging.getLogger("grpc._cython.cygrpc").addFilter(LateAnswerLogFilter())


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=await self.dp.server_live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self.dp.server_ready())

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        async def call() -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(
                ready=await self.dp.model_ready(request.name, request.version)
            )

        return await _guard(context, call)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        status = self.dp.frontend_status()
        context.set_trailing_metadata(
            (
                ("shoal-frontend", str(status["index"])),
                ("shoal-frontend-requests", str(status["inference_requests"])),
            )
        )
        return pb.ServerMetadataResponse(**self.dp.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        async def call() -> pb.ModelMetadataResponse:
            handle = await self.dp.model(request.name, request.version)
            return grpc_codec.model_metadata(handle.metadata)

        return await _guard(context, call)

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        async def call() -> pb.ModelConfigResponse:
            handle = await self.dp.model(request.name, request.version)
            return grpc_codec.model_config(handle.config_bytes)

        return await _guard(context, call)

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        async def call() -> pb.ModelStatisticsResponse:
            stats = await self.dp.statistics(request.name, request.version)
            return grpc_codec.model_statistics(stats)

        return await _guard(context, call)

    async def LogSettings(self, request: Any, context: Any) -> pb.LogSettingsResponse:
        async def call() -> pb.LogSettingsResponse:
            changes = log_settings.grpc_changes(request.settings)
            settings = await self.dp.log_settings(changes)
            return log_settings.grpc_settings(settings, pb.LogSettingsResponse())

        return await _guard(context, call)

    async def TraceSetting(self, request: Any, context: Any) -> pb.TraceSettingResponse:
        async def call() -> pb.TraceSettingResponse:
            def changes() -> Changes | None:
                return trace_api.grpc_changes(request.settings) if request.settings else None

            reply = await self.dp.trace_settings(request.model_name, changes)
            return trace_api.grpc_settings(trace_api.as_settings(*reply), pb.TraceSettingResponse())

        return await _guard(context, call)

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        async def call() -> pb.RepositoryIndexResponse:
            if request.repository_name:
                raise self.dp.repository.refuse_named_repository()
            entries = await self.dp.repository.index(request.ready)
            models = [pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries]
            return pb.RepositoryIndexResponse(models=models)

        return await _guard(context, call)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            if request.repository_name:
                raise self.dp.repository.refuse_named_repository()
            grpc_codec.check_load_parameters(request.parameters)
            if (refusal := self.dp.repository.refuse_model_control()) is not None:
                raise refusal  # (mode none or poll)
            params = request.parameters
            config = params["config"].string_param if "config" in params else ""
            files = {k: v.bytes_param for k, v in params.items() if k.startswith("file:")}
            await self.dp.repository.model_control("load", request.model_name, config, files)
            return pb.RepositoryModelLoadResponse()

        return await _guard(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            if request.repository_name:
                raise self.dp.repository.refuse_named_repository()
            grpc_codec.check_unload_parameters(request.parameters)
            if (refusal := self.dp.repository.refuse_model_control()) is not None:
                raise refusal  # (mode none or poll)
            params = request.parameters
            dependents = "unload_dependents" in params and params["unload_dependents"].bool_param
            await self.dp.repository.model_control("unload", request.model_name, "", {}, dependents)
            return pb.RepositoryModelUnloadResponse()

        return await _guard(context, call)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            resp = pb.SystemSharedMemoryStatusResponse()
            for r in await self.dp.shared_memory("status", "system", request.name):
                resp.regions[r.name].CopyFrom(
                    pb.SystemSharedMemoryStatusResponse.RegionStatus(
                        name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                    )
                )
            return resp

        return await _guard(context, call)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.dp.shared_memory(
                "register",
                "system",
                request.name,
                key=request.key,
                offset=request.offset,
                byte_size=request.byte_size,
            )
            return pb.SystemSharedMemoryRegisterResponse()

        return await _guard(context, call)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.dp.shared_memory("unregister", "system", request.name)
            return pb.SystemSharedMemoryUnregisterResponse()

        return await _guard(context, call)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            resp = pb.CudaSharedMemoryStatusResponse()
            for r in await self.dp.shared_memory("status", "cuda", request.name):
                resp.regions[r.name].CopyFrom(
                    pb.CudaSharedMemoryStatusResponse.RegionStatus(
                        name=r.name, device_id=r.device_id, byte_size=r.byte_size
                    )
                )
            return resp

        return await _guard(context, call)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.dp.shared_memory(
                "register",
                "cuda",
                request.name,
                raw_handle=request.raw_handle,
                device_id=request.device_id,
                byte_size=request.byte_size,
            )
            return pb.CudaSharedMemoryRegisterResponse()

        return await _guard(context, call)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.dp.shared_memory("unregister", "cuda", request.name)
            return pb.CudaSharedMemoryUnregisterResponse()

        return await _guard(context, call)

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        if self.dp.tracer.active:  # (the one check tracing costs when off)
            parent = self._traceparent(context)
            return await _guard(context, lambda: self._traced(request, parent, context))
        return await _guard(context, lambda: self._infer(request, call=context))

    def _traceparent(self, context: Any) -> str:
        """The client's W3C trace context, which counts in opentelemetry mode only."""
        if self.dp.tracer.mode != "opentelemetry":
            return ""
        return str(dict(context.invocation_metadata() or ()).get("traceparent", ""))

    async def _traced(
        self, request: pb.ModelInferRequest, parent: str, call: Any
    ) -> pb.ModelInferResponse:
        """A unary request while tracing is on: sampled, and stamped if it is. The
        answer's GRPC_SEND stamps mark it handed to grpcio."""
        trace = self.dp.tracer.sample(request.model_name, parent)
        if trace is None:
            return await self._infer(request, call=call)
        trace.stamp("GRPC_WAITREAD_START")
        trace.stamp("GRPC_WAITREAD_END")
        try:  # (a failed request's stamps so far are written too, as Triton's)
            answer = await self._infer(request, None, trace, call)
            trace.stamp("INFER_RESPONSE_COMPLETE")
            trace.stamp("GRPC_SEND_START")
            trace.stamp("GRPC_SEND_END")
            return answer
        finally:
            self.dp.tracer.finish(trace)

    async def _infer(
        self,
        request: pb.ModelInferRequest,
        decoded: ClientRequest | None = None,
        trace: Trace | None = None,
        call: Any = None,
    ) -> pb.ModelInferResponse:
        """``decoded``: the request's tensors, read already (a stream's); ``call``: the
        unary call's context, whose shoal-route-key metadata is read only for a model
        under a traffic policy (docs/version-traffic.md)."""
        # The model first, as Triton looks it up before reading the request's tensors.
        model = await self.dp.model(request.model_name, request.model_version)
        if model.decoupled:
            raise ServingError(Code.UNSUPPORTED, DECOUPLED_UNARY)
        req = decoded if decoded is not None else await decode_request(request)
        req.trace = trace
        if call is not None and model.traffic.active:
            key = dict(call.invocation_metadata() or ()).get(ROUTE_KEY_HEADER)
            if key is not None:
                req.parameters.setdefault(ROUTE_KEY, key)  # (the parameter wins)
        result = await self.dp.infer(req)
        try:
            return grpc_codec.encode_infer_response(result)
        finally:
            result.release()

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """A stream's requests and their answers (shoal/frontend/grpc_stream.py); while
        tracing is on, each request is sampled there, continuing the stream's trace
        context."""
        parent = self._traceparent(context) if self.dp.tracer.active else ""
        answered = grpc_stream.serve(self.dp, self._infer, request_iterator, context, parent)
        async with contextlib.aclosing(answered) as answers:
            async for answer in answers:
                yield answer


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1: SERVING when the server is ready (for Kubernetes gRPC probes)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        ready = await self.dp.server_ready()
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


def build_server(
    dataplane: DataPlane,
    address: str,
    reuse_port: bool,
    restrictions: restricted.Rules | None = None,
    options: list[tuple[str, int]] | None = None,
    tls: GrpcTls | None = None,
) -> grpc.aio.Server:
    """``restrictions``: the restricted protocol groups (--grpc-restricted-protocol),
    checked by an interceptor for every call, whatever its service; ``options``: channel
    settings (keepalive...); ``tls``: serve TLS (mutual: clients must present a
    certificate that chains to its root)."""
    server = grpc.aio.server(
        interceptors=[restricted.GrpcRestriction(restrictions)] if restrictions else None,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            *(options or []),
        ],
    )
    registration = _GuardedRegistration(server)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(dataplane), registration)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(dataplane), registration)
    if len(registration.services) != 2:  # generated code that registers some other way
        raise RuntimeError(f"gRPC services not registered: {registration.services}")
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.key, tls.cert)], root_certificates=tls.root, require_client_auth=tls.mutual
            )
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    return server
