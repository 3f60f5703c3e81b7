"""KServe v2 over HTTP (with Triton's extensions): a thin adapter over the DataPlane.

Routes follow Triton's router: anything else is 404 ``{"error":"Not Found"}``, a wrong
verb 405. Every error is ``{"error": "..."}`` with the status Triton maps its error code
to; no request can take the process down (unexpected exceptions become 500s).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from frontend import http_codec, http_shm
from frontend.dataplane import DataPlane
from frontend.http_raw_input import RawInputMeta
from ipc.errors import Code, ServingError

log = logging.getLogger("shoal.frontend.http")

DATAPLANE: web.AppKey[DataPlane] = web.AppKey("dataplane", DataPlane)
MAX_INPUT: web.AppKey[int] = web.AppKey("max_input_size", int)
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
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[MAX_INPUT]
        return _error(
            f"Request JSON size of {request.content_length or 'more than ' + str(limit)} bytes "
            f"exceeds the maximum allowed value of {limit} bytes. Use --http-max-input-size to "
            "increase the limit.",
            400,
        )
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
    name, version = _model_args(request)
    return _empty(await _dp(request).model_ready(name, version))


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


async def infer(request: web.Request) -> web.Response:
    dp = _dp(request)
    name, version = _model_args(request)
    header_length = _header_length(request)
    body = await request.read()

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

    if header_length == 0:
        await dp.model(name, version)  # the raw form needs the model's single input
    req, options = http_codec.decode_infer_request(
        body, header_length, name, version, raw_input_meta=raw_meta
    )
    result = await dp.infer(req)
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


async def model_instances(request: web.Request) -> web.Response:
    return _json(await _dp(request).model_instances(request.match_info["model"]))


async def frontend_status(request: web.Request) -> web.Response:
    return _json(_dp(request).frontend_status())


async def _tag_frontend(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[FRONTEND_HEADER] = request.app[FRONTEND_INDEX]


def build_app(dataplane: DataPlane, max_input_size: int) -> web.Application:
    app = web.Application(client_max_size=max_input_size, middlewares=[errors_middleware])
    app[DATAPLANE] = dataplane
    app[MAX_INPUT] = max_input_size
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
    app.add_routes(http_shm.routes(_dp))
    for base in (model, versioned):
        r.add_get(base + "/stats", model_stats)
        r.add_get(base, model_metadata)
        r.add_get(base + "/config", model_config)
        r.add_get(base + "/ready", model_ready)
        r.add_post(base + "/infer", infer)
    return app
