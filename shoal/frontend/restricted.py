"""Triton's restricted API groups: ``--http-restricted-api=<apis>:<key>=<value>`` and
``--grpc-restricted-protocol=<protocols>:<key>=<value>``.

A request to an API of a restricted group must carry the header ``<key>: <value>`` (HTTP)
or the metadata ``triton-grpc-protocol-<key>: <value>`` (gRPC); otherwise it is refused
before anything else is looked at, with Triton 2.51's answer (HTTP 403 "This API is
restricted, expecting header '<key>'"; gRPC UNAVAILABLE "This protocol is restricted,
expecting header 'triton-grpc-protocol-<key>'").

The check is one layer that every request passes through whatever its route: an aiohttp
middleware that classifies the request's path itself, and a gRPC server interceptor that
classifies the method's name. A path or method no group names (the metrics port, an
unknown path) is not restricted. Values are compared in constant time.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
from aiohttp import web
from aiohttp.typedefs import Middleware

from shoal.configs.flags.frontend import RestrictionRule as Rule
from shoal.configs.flags.frontend import Restrictions as Rules
from shoal.frontend.http_codec import encode_error

GRPC_HEADER_PREFIX: Final = "triton-grpc-protocol-"
_JSON: Final = "application/json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
# (pattern, category), first match wins; full matches of the request's path.
_HTTP: Final[list[tuple[re.Pattern[str], str]]] = [
    (re.compile(r"/v2/health/(?:live|ready)"), "health"),
    (re.compile(_MODEL + r"/ready"), "health"),
    (re.compile(r"/v2/models/stats"), "statistics"),
    (re.compile(_MODEL + r"/stats"), "statistics"),
    (re.compile(r"/v2/shoal/.*"), "statistics"),  # shoal's status: pids, cores, queues
    (re.compile(_MODEL + r"/(?:infer|generate|generate_stream)"), "inference"),
    (re.compile(_MODEL + r"/config"), "model-config"),
    (re.compile(_MODEL + r"/trace/setting"), "trace"),
    (re.compile(r"/v2/trace/setting"), "trace"),
    (re.compile(r"/v2/logging"), "logging"),
    (re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/.*)?"), "shared-memory"),
    (re.compile(r"/v2/repository(?:/.*)?"), "model-repository"),
    # The OpenAI-compatible API, in the groups Triton's OpenAI frontend puts it
    (re.compile(r"/v1/(?:chat/)?completions"), "inference"),
    (re.compile(r"/v1/models(?:/.*)?"), "model-repository"),
    (re.compile(r"/v2/?"), "metadata"),
    (re.compile(_MODEL + r"/?"), "metadata"),
]

_GRPC: Final[dict[str, str]] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


def http_category(path: str) -> str | None:
    for pattern, category in _HTTP:
        if pattern.fullmatch(path):
            return category
    return None


def grpc_category(method: str) -> str | None:
    """``method``: the full name, ``/inference.GRPCInferenceService/ModelInfer``."""
    service, _, name = method.rpartition("/")
    if service == "/grpc.health.v1.Health":
        return "health"
    if service == "/inference.GRPCInferenceService":
        return _GRPC.get(name)
    return None


def _allowed(rule: Rule, got: str | None) -> bool:
    # aiohttp hands bytes that are no UTF-8 over as surrogate escapes: compared as sent
    sent = got.encode("utf-8", "surrogateescape") if got is not None else None
    return sent is not None and hmac.compare_digest(sent, rule[1].encode())


def http_middleware(rules: Rules) -> Middleware:
    @web.middleware
    async def restricted(request: web.Request, handler: Handler) -> web.StreamResponse:
        category = http_category(request.path)
        rule = rules.get(category) if category is not None else None
        if rule is not None and not _allowed(rule, request.headers.get(rule[0])):
            message = f"This API is restricted, expecting header '{rule[0]}'"
            return web.Response(body=encode_error(message), status=403, content_type=_JSON)
        return await handler(request)

    return restricted


class GrpcRestriction(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, rules: Rules) -> None:
        self.rules = rules

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        category = grpc_category(details.method)
        rule = self.rules.get(category) if category is not None else None
        if rule is None or handler is None:
            return handler
        header = GRPC_HEADER_PREFIX + rule[0].lower()
        got = next((v for k, v in details.invocation_metadata or () if k == header), None)
        if _allowed(rule, got if isinstance(got, str) else None):
            return handler
        return _denying(handler, f"This protocol is restricted, expecting header '{header}'")


def _denying(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that refuses the call."""

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        yield None  # never reached: makes this the async generator grpcio expects

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **codec)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **codec)
