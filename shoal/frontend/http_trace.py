"""Tracing over HTTP: a sampled inference request's protocol stamps, and the trace
extension, ``GET/POST /v2/trace/setting`` and ``/v2/models/{m}/trace/setting``
(shoal/frontend/trace_api.py has the checks)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from shoal.configs.trace_settings import Changes
from shoal.dataplane.json_limits import MAX_JSON_DEPTH, check_depth
from shoal.dataplane.tracing import Trace, Tracer
from shoal.frontend import http_codec, trace_api

Handler = Callable[[web.Request, Trace], Awaitable[web.Response]]


def sample(request: web.Request, tracer: Tracer) -> Trace | None:
    """A trace for this request to ``/v2/models/{m}/...`` if it is sampled."""
    return tracer.sample(request.match_info["model"], request.headers.get("traceparent", ""))


async def traced(
    request: web.Request, trace: Trace, tracer: Tracer, handler: Handler
) -> web.StreamResponse:
    """``handler``'s answer to a sampled request, sent here so that the send's end is
    stamped. The trace is finished whatever happens: a failed request's stamps so far
    are written too, as Triton writes them."""
    trace.stamp("HTTP_RECV_START")
    try:
        resp = await handler(request, trace)
        await resp.prepare(request)
        await resp.write_eof()
        trace.stamp("HTTP_SEND_END")
        return resp
    finally:
        tracer.finish(trace)


def routes(dp_of: Any) -> list[web.RouteDef]:
    """The routes; ``dp_of(request)`` gives the DataPlane."""

    async def setting(request: web.Request) -> web.Response:
        dp = dp_of(request)
        model = request.match_info.get("model", "")
        body = await request.read() if request.method == "POST" else None

        def changes() -> Changes | None:
            """The update's changes, read once the model is known, as Triton reads them."""
            if body is None:
                return None
            doc = http_codec.parse_json(memoryview(body), MAX_JSON_DEPTH) if body else {}
            check_depth(doc)
            return trace_api.http_changes(doc if isinstance(doc, dict) else {})

        settings = trace_api.as_settings(*await dp.trace_settings(model, changes))
        return web.Response(body=msgspec.json.encode(settings), content_type="application/json")

    out = []
    for path in ("/v2/trace/setting", "/v2/models/{model:[^/]+}/trace/setting"):
        out += [web.get(path, setting), web.post(path, setting)]
    return out
