"""KServe v2 over HTTP (with Triton's extensions): a thin adapter over the DataPlane.

Routes follow Triton's router: anything else is 404 ``{"error":"Not Found"}``, a wrong
verb 405. Every error is ``{"error": "..."}`` with the status Triton maps its error code
to; no request can take the process down (unexpected exceptions become 500s).
Request bodies are read by shoal.frontend.http_body.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from shoal.configs.traffic import ROUTE_KEY, ROUTE_KEY_HEADER
from shoal.dataplane.json_limits import MAX_JSON_DEPTH, check_depth
from shoal.dataplane.plane import DataPlane
from shoal.dataplane.tracing import Trace
from shoal.frontend import (
    http_client_shm,
    http_codec,
    http_generate,
    http_trace,
    json_members,
    log_settings,
    restricted,
)
from shoal.frontend.http_body import (
    BODY_DEADLINE,
    MAX_INPUT,
    BodyDeadline,
    UnsupportedEncoding,
    read_body,
)
from shoal.frontend.http_raw_input import RawInputMeta
from shoal.frontend.openai import routes as openai_routes
from shoal.frontend.openai.generative import GenerativeModels
from shoal.ipc import logs
from shoal.ipc.errors import DECOUPLED_HTTP, Code, ServingError, invalid_arg

log = logging.getLogger("shoal.frontend.http")
# aiohttp's connection handlers log here instead of "aiohttp.server" (see build_app).
protocol_log = logging.getLogger("shoal.frontend.http.protocol")


DATAPLANE: web.AppKey[DataPlane] = web.AppKey("dataplane", DataPlane)
FRONTEND_INDEX: web.AppKey[str] = web.AppKey("frontend_index", str)
FRONTEND_HEADER = "Shoal-Frontend"
IHCL = "Inference-Header-Content-Length"
_JSON = "application/json"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type=_JSON)


def _error(message: str, status: int) -> web.Response:
    return web.Response(body=http_codec.encode_error(message), status=status, content_type=_JSON)


def _empty(ok: bool) -> web.Response:
    return web.Response(status=200 if ok else 400)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServingError as exc:
        return _error(exc.message, exc.http_status)
    except UnsupportedEncoding as exc:
        # Triton answers 415 naming what it accepts (with an empty body; ours says why).
        resp = _error(
            f"unsupported Content-Encoding '{exc.encoding}': the server accepts gzip and deflate",
            415,
        )
        resp.headers["Accept-Encoding"] = "gzip, deflate"
        return resp
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_INPUT]
        return _error(  # the current Triton's words (2.51: "Request JSON size ... value of")
            f"request JSON size of {request.content_length or 'more than ' + str(limit)} bytes "
            f"exceeds the maximum allowed input size of {limit} bytes. Use "
            "--http-max-input-size to increase the limit.",
            400,
        )
    except web.RequestPayloadError as exc:
        # The body broke off in its framing (a client's error, not ours: no traceback).
        reason = getattr(exc.__cause__, "message", None) or str(exc)
        return _error(f"failed to read the request body: {reason}", 400)
    except web.HTTPNotFound:
        return _error("Not Found", 404)
    except web.HTTPMethodNotAllowed:
        return _error("Method Not Allowed", 405)
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500)


def _dp(request: web.Request) -> DataPlane:
    return request.app[DATAPLANE]


def _model_args(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


async def health_live(request: web.Request) -> web.Response:
    return _empty(await _dp(request).server_live())


async def health_ready(request: web.Request) -> web.Response:
    return _empty(await _dp(request).server_ready())


async def server_metadata(request: web.Request) -> web.Response:
    return _json(_dp(request).server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    handle = await _dp(request).model(*_model_args(request))
    return _json(handle.metadata)


async def model_config(request: web.Request) -> web.Response:
    handle = await _dp(request).model(*_model_args(request))
    return _json(handle.config_json)


async def model_ready(request: web.Request) -> web.Response:
    """200 with no body; otherwise Triton's 400 with its one message (an unknown model
    or version included), where the server health endpoints answer with no body."""
    name, version = _model_args(request)
    if await _dp(request).model_ready(name, version):
        return _empty(True)
    return _error("Model version not ready", 400)


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(IHCL)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ServingError(
            Code.INVALID_ARG, f"Unable to parse {IHCL} header value '{raw}'"
        ) from None


async def infer(request: web.Request) -> web.StreamResponse:
    dp = _dp(request)
    # (the one check tracing costs when off)
    if dp.tracer.active and (trace := http_trace.sample(request, dp.tracer)) is not None:
        return await http_trace.traced(request, trace, dp.tracer, _infer)
    return await _infer(request, None)


async def _infer(request: web.Request, trace: Trace | None) -> web.Response:
    dp = _dp(request)
    name, version = _model_args(request)
    header_length = _header_length(request)
    body = await read_body(request)
    if trace is not None:
        trace.stamp("HTTP_RECV_END")

    def raw_meta() -> RawInputMeta:
        handle = dp.cached_model(name, version)
        first = next(iter(handle.inputs.values()), None)
        return RawInputMeta(
            name=first.name if first else "",
            datatype=first.datatype if first else "",
            dims=first.dims if first else (),
            max_batch_size=handle.max_batch_size,
            input_count=len(handle.inputs),
        )

    # The model first, as Triton creates the request for it before reading the body: an
    # unknown model is the answer to any body sent to it (and the raw form needs the
    # model's single input).
    if (await dp.model(name, version)).decoupled:
        raise ServingError(Code.UNSUPPORTED, DECOUPLED_HTTP)
    req, options = http_codec.decode_infer_request(
        body, header_length, name, version, raw_input_meta=raw_meta
    )
    req.trace = trace
    if (key := request.headers.get(ROUTE_KEY_HEADER)) is not None:
        req.parameters.setdefault(ROUTE_KEY, key)  # (the parameter, when both are given)
    result = await dp.infer(req)
    if trace is not None:
        trace.stamp("INFER_RESPONSE_COMPLETE")
        trace.stamp("HTTP_SEND_START")
    try:
        parts, json_len = http_codec.encode_infer_response(result, options)
        payload = b"".join(parts)
    finally:
        result.release()
    if json_len is None:
        resp = web.Response(body=payload, content_type=_JSON)
    else:
        resp = web.Response(body=payload, content_type="application/octet-stream")
        resp.headers[IHCL] = str(json_len)
    if "Accept-Encoding" in request.headers:
        resp.enable_compression()
    return resp


async def model_stats(request: web.Request) -> web.Response:
    name = request.match_info.get("model", "")
    stats = await _dp(request).statistics(name, request.match_info.get("version", ""))
    return _json({"model_stats": stats})


def _control_json(body: bytes) -> dict[str, Any]:
    """A control request's JSON body, refused (Triton's 400) when nested deeper than
    Triton allows; such bodies are small, so the walk that measures the depth is cheap."""
    doc = http_codec.parse_json(memoryview(body), MAX_JSON_DEPTH)
    check_depth(doc)
    return doc


async def repository_index(request: web.Request) -> web.Response:
    """The body is optional; its ``ready`` (a boolean) keeps READY versions only. A
    repository name in the path is ignored here, as Triton 2.51 does. A body nested past
    Triton's depth is refused as any control body is (Triton's 400), unless it is
    ``ready`` itself that is too deep: that is no boolean, and the current Triton says so
    whatever its depth (L0_http reads one 250,000 levels deep)."""
    body = await request.read()
    ready = False
    if body:
        try:
            doc = _control_json(body)
        except ServingError:
            deep = json_members.shallow_members(body)
            if deep is None or "ready" not in deep or isinstance(deep["ready"], bool):
                raise
            doc = deep
        if "ready" in doc:
            if not isinstance(doc["ready"], bool):  # the current Triton's (2.51: INTERNAL)
                raise invalid_arg("Invalid value for 'ready': expected a boolean")
            ready = doc["ready"]
    return _json(await _dp(request).repository.index(ready))


async def repository_load(request: web.Request) -> web.Response:
    """Load (or reload) a model: explicit model control. The body's checks come first, in
    Triton 2.51's order and words: every parameter a string, named ``config`` (a JSON
    ModelConfig that replaces config.pbtxt) or ``file:<version>/<path>`` (base64)."""
    if "repository" in request.match_info:
        raise _dp(request).repository.refuse_named_repository()
    body = await request.read()
    config = ""
    files: dict[str, bytes] = {}
    if body:
        doc = _control_json(body)
        if "parameters" in doc:
            params = doc["parameters"]
            if not isinstance(params, dict):
                raise ServingError(Code.INTERNAL, "attempt to get members for non-object")
            for key, value in params.items():
                if not isinstance(value, str):
                    raise ServingError(Code.INTERNAL, "attempt to access JSON non-string as string")
                if key != "config" and not key.startswith("file:"):
                    raise ServingError(
                        Code.INTERNAL, "unexpected error on creating Triton parameter"
                    )
                if key == "config":
                    config = value
                else:
                    files[key] = value.encode()
    if (refusal := _dp(request).repository.refuse_model_control()) is not None:
        raise refusal  # (mode none or poll: after the body's checks, as Triton)
    model = request.match_info["model"]
    for key, value in files.items():
        try:
            files[key] = base64.b64decode(value, validate=True)
        except binascii.Error:  # Triton's: as a file it cannot write
            raise ServingError(
                Code.INTERNAL,
                f"failed to load '{model}', failed to poll from model repository: "
                f"'{key}' is not base64",
            ) from None
    await _dp(request).repository.model_control("load", model, config, files)
    return _empty(True)


async def repository_unload(request: web.Request) -> web.Response:
    """Unload a model (with ``unload_dependents``: an ensemble's composing models that
    only it uses)."""
    if "repository" in request.match_info:
        raise _dp(request).repository.refuse_named_repository()
    if (refusal := _dp(request).repository.refuse_model_control()) is not None:
        raise refusal  # Triton reads no body first
    body = await request.read()
    dependents = False
    # A body that does not parse, or says something else, is ignored: Triton 2.51 unloads
    # all the same (checked side by side).
    with contextlib.suppress(ServingError):
        doc = _control_json(body) if body else {}
        params = doc.get("parameters", {}) if isinstance(doc, dict) else {}
        dependents = isinstance(params, dict) and params.get("unload_dependents") is True
    await _dp(request).repository.model_control(
        "unload", request.match_info["model"], "", {}, dependents
    )
    return _empty(True)


async def logging_get(request: web.Request) -> web.Response:
    return _json(log_settings.as_json(await _dp(request).log_settings({})))


async def logging_update(request: web.Request) -> web.Response:
    doc = _control_json(await request.read())
    changes = log_settings.http_changes(doc)
    return _json(log_settings.as_json(await _dp(request).log_settings(changes)))


async def model_instances(request: web.Request) -> web.Response:
    return _json(await _dp(request).repository.model_instances(request.match_info["model"]))


async def frontend_status(request: web.Request) -> web.Response:
    return _json(_dp(request).frontend_status())


async def _tag_frontend(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[FRONTEND_HEADER] = request.app[FRONTEND_INDEX]


class ClientErrorLogFilter(logging.Filter):
    """aiohttp logs every request it cannot parse (bad chunk size or Content-Length,
    oversized headers, an HTTP/2 preface), and a body whose framing breaks off, at ERROR
    with a traceback: a client's mistake, and a log flood any client can cause. Such a
    record becomes one WARNING line (or stays a DEBUG one) naming the error; any other
    record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            lines = str(getattr(exc, "message", exc)).splitlines() or [""]
            reason = lines[0][:200].rstrip(": ")
            level = min(record.levelno, logging.WARNING)
            logs.rewrite(
                record, level, "%s: %s: %s", record.getMessage(), type(exc).__name__, reason
            )
        return True


protocol_log.addFilter(ClientErrorLogFilter())


def build_reserve_app(
    dataplane: DataPlane, refusal: str, restrictions: restricted.Rules | None = None
) -> web.Application:
    """What answers a connection beyond the cap (shoal.frontend.http_connections): the health
    endpoints as usual, anything else 503 ``refusal``; each connection closes after its
    answer."""
    middlewares: list[Middleware] = [errors_middleware]
    if restrictions:
        middlewares.append(restricted.http_middleware(restrictions))
    app = web.Application(middlewares=middlewares, handler_args={"logger": protocol_log})
    app[DATAPLANE] = dataplane
    app[FRONTEND_INDEX] = str(dataplane.broker.index)
    app.on_response_prepare.append(_tag_frontend)
    app.on_response_prepare.append(_close_after)

    async def refuse(request: web.Request) -> web.Response:
        resp = _error(refusal, 503)
        resp.headers["Retry-After"] = "1"
        return resp

    app.router.add_get("/v2/health/live", health_live)
    app.router.add_get("/v2/health/ready", health_ready)
    app.router.add_route("*", "/{tail:.*}", refuse)
    return app


async def _close_after(request: web.Request, response: web.StreamResponse) -> None:
    response.force_close()
    response.headers["Connection"] = "close"  # (aiohttp 3.14 wrote its own before this hook)


def build_app(
    dataplane: DataPlane,
    max_input_size: int,
    restrictions: restricted.Rules | None = None,
    body_deadline: BodyDeadline | None = None,
) -> web.Application:
    """``restrictions``: the restricted API groups (--http-restricted-api), checked for
    every request before its handler, whatever its route."""
    middlewares: list[Middleware] = [errors_middleware]
    if restrictions:
        middlewares.append(restricted.http_middleware(restrictions))
    app = web.Application(
        client_max_size=max_input_size,
        middlewares=middlewares,
        # Bodies are decompressed in _read_body; aiohttp's connection handlers log
        # through ClientErrorLogFilter.
        handler_args={"auto_decompress": False, "logger": protocol_log},
    )
    app[DATAPLANE] = dataplane
    app[MAX_INPUT] = max_input_size
    app[BODY_DEADLINE] = body_deadline or BodyDeadline()
    app[FRONTEND_INDEX] = str(dataplane.broker.index)
    app.on_response_prepare.append(_tag_frontend)
    model = r"/v2/models/{model:[^/]+}"
    versioned = model + r"/versions/{version:[0-9]+}"
    r = app.router
    r.add_get("/v2/health/live", health_live)
    r.add_get("/v2/health/ready", health_ready)
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/shoal/frontend", frontend_status)
    r.add_get("/v2/shoal/models/{model:[^/]+}", model_instances)
    r.add_get("/v2/models/stats", model_stats)
    r.add_get("/v2/logging", logging_get)
    r.add_post("/v2/logging", logging_update)
    for repo in ("/v2/repository", "/v2/repository/{repository:[^/]+}"):
        r.add_post(repo + "/index", repository_index)
        r.add_post(repo + "/models/{model:[^/]+}/load", repository_load)
        r.add_post(repo + "/models/{model:[^/]+}/unload", repository_unload)
    app.add_routes(http_client_shm.routes(_dp))
    app.add_routes(http_trace.routes(_dp))
    app[openai_routes.GENERATIVE] = GenerativeModels(dataplane)
    app.add_routes(openai_routes.routes())
    # aiohttp tries a prefix's dynamic routes in the order added, one regex each: infer
    # (the hot path) and ready (the probes) first.
    gen = http_generate.Generate(_dp)
    for base in (model, versioned):
        r.add_post(base + "/infer", infer)
        r.add_post(base + "/generate", gen.one)
        r.add_post(base + "/generate_stream", gen.stream)
        r.add_get(base + "/ready", model_ready)
        r.add_get(base + "/stats", model_stats)
        r.add_get(base, model_metadata)
        r.add_get(base + "/config", model_config)
    return app
