"""Triton's generate extension over HTTP: ``/v2/models/{m}[/versions/{v}]/generate`` (one
response as one JSON object) and ``/generate_stream`` (server-sent events, one per
response). The JSON codec is shoal/frontend/generate.py; a sampled request is traced as
Triton traces it (shoal/frontend/http_trace.py): ``INFER_RESPONSE_COMPLETE`` per response,
and for a stream ``HTTP_SEND_START``/``HTTP_SEND_END`` per event."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aiohttp import web

from shoal.dataplane.json_limits import MAX_JSON_DEPTH
from shoal.dataplane.plane import DataPlane
from shoal.dataplane.tracing import Trace
from shoal.dataplane.types import ClientRequest, InferenceResult, ResponseError
from shoal.frontend import generate, http_codec, http_trace, json_members
from shoal.frontend.http_body import read_body
from shoal.ipc.errors import ServingError

_JSON = "application/json"


def _error(message: str, status: int) -> web.Response:
    return web.Response(body=http_codec.encode_error(message), status=status, content_type=_JSON)


def _event(item: InferenceResult | ResponseError) -> bytes:
    if isinstance(item, ResponseError):
        return generate.encode_error(item.message)
    try:
        return generate.encode_response(item)
    finally:
        item.release()


class Generate:
    """The two handlers; ``dp_of(request)`` gives the DataPlane."""

    def __init__(self, dp_of: Callable[[web.Request], DataPlane]) -> None:
        self.dp_of = dp_of

    async def _request(self, request: web.Request) -> ClientRequest:
        dp = self.dp_of(request)
        name, version = request.match_info["model"], request.match_info.get("version", "")
        body = await read_body(request)
        model = await dp.model(name, version)
        doc = http_codec.parse_json(memoryview(body), MAX_JSON_DEPTH)
        return generate.decode_request(json_members.read_members(body, doc), model, version)

    async def one(self, request: web.Request) -> web.StreamResponse:
        """One response as one JSON object. A model error is 400; a decoupled model that
        sends no response or several answers 200 with an error, as Triton 2.51 does (its
        headers have gone out by then)."""
        dp = self.dp_of(request)
        if dp.tracer.active and (trace := http_trace.sample(request, dp.tracer)) is not None:
            return await http_trace.traced(request, trace, dp.tracer, self._one)
        return await self._one(request, None)

    async def _one(self, request: web.Request, trace: Trace | None) -> web.Response:
        req = await self._request(request)
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
            req.trace = trace
        answers: list[bytes | ResponseError] = []
        async with contextlib.aclosing(self.dp_of(request).infer_stream(req)) as responses:
            async for r in responses:
                if trace is not None:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                answers.append(r if isinstance(r, ResponseError) else _event(r))
        if trace is not None:
            trace.stamp("HTTP_SEND_START")
        if answers and isinstance(answers[0], ResponseError):
            return _error(answers[0].message, 400)
        if len(answers) != 1:
            return _error(generate.ONE_RESPONSE, 200)
        body = answers[0]
        assert isinstance(body, bytes)
        return web.Response(body=body, content_type=_JSON)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``data: <JSON>`` per response as it comes (a model error
        too: 400 if it is the first, else one more event). What refuses the request
        before it runs is a plain JSON error."""
        dp = self.dp_of(request)
        if not dp.tracer.active or (trace := http_trace.sample(request, dp.tracer)) is None:
            return await self._stream(request, None)
        trace.stamp("HTTP_RECV_START")
        try:
            return await self._stream(request, trace)
        finally:
            dp.tracer.finish(trace)

    async def _stream(self, request: web.Request, trace: Trace | None) -> web.StreamResponse:
        req = await self._request(request)
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
            req.trace = trace
        async with contextlib.aclosing(self.dp_of(request).infer_stream(req)) as answers:
            first = await anext(answers, None)
            if trace is not None and first is not None:
                trace.stamp("INFER_RESPONSE_COMPLETE")
            resp = web.StreamResponse(status=400 if isinstance(first, ResponseError) else 200)
            resp.content_type = "text/event-stream"
            resp.charset = "utf-8"
            await resp.prepare(request)
            item = first
            while item is not None:
                event = b"data: " + _event(item) + b"\n\n"
                if trace is not None:
                    trace.stamp("HTTP_SEND_START")
                await resp.write(event)
                if trace is not None:
                    trace.stamp("HTTP_SEND_END")
                try:
                    item = await anext(answers, None)
                except ServingError as exc:  # the server lost its broker: the last event
                    item = ResponseError(exc.message, True)
                if trace is not None and item is not None:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
            await resp.write_eof()
            return resp
