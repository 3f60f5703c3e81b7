"""The HTTP endpoints of Triton's system and CUDA shared-memory extensions (register,
unregister, status): thin handlers over DataPlane.shared_memory. Body errors are those of
Triton's HandleSystemSharedMemory and HandleCudaSharedMemory (src/http_server.cc)."""

from __future__ import annotations

import base64
import re
from typing import Any

import msgspec
from aiohttp import web

from shoal.configs.devices import gpu_count
from shoal.dataplane.json_limits import MAX_JSON_DEPTH, check_depth
from shoal.dataplane.plane import DataPlane
from shoal.frontend.http_codec import parse_json
from shoal.ipc.errors import Code, ServingError, invalid_arg
from shoal.ipc.messages import CUDA_HANDLE_BYTES

_NOT_B64 = re.compile(r"[^A-Za-z0-9+/]")


async def _body(request: web.Request) -> dict[str, Any]:
    """The register body, read as the inference one (Triton's EVBufferToJson for both)."""
    doc = parse_json(memoryview(await request.read()), MAX_JSON_DEPTH)
    check_depth(doc)  # (a small body)
    return doc


def _json_layer(problem: str) -> ServingError:
    """Triton 2.51's JSON layer (TritonJson), word for word: INTERNAL, and the register
    handlers name no member."""
    return ServingError(Code.INTERNAL, f"attempt to access {problem}")


def _uint(doc: dict[str, Any], key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        # (a number past uint64 is a double to it)
        raise _json_layer("JSON non-unsigned-integer as unsigned-integer")
    return value


def _member(doc: Any, key: str) -> Any:
    """A required member, as MemberAs* reads it: missing (or ``doc`` no object) is the
    JSON layer's error, not a register-request message."""
    if not isinstance(doc, dict) or key not in doc:
        raise _json_layer(f"non-existing object member '{key}'")
    return doc[key]


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _json_layer("JSON non-string as string")
    return value


def _lenient_b64decode(text: str) -> bytes:
    """Base64 as Triton's decoder (libb64) reads it: characters outside the alphabet are
    skipped, padding is optional, a lone trailing character is dropped."""
    clean = _NOT_B64.sub("", text)
    if len(clean) % 4 == 1:
        clean = clean[:-1]
    return base64.b64decode(clean + "=" * (-len(clean) % 4))


def _required(doc: dict[str, Any], key: str) -> None:
    if key not in doc:
        raise invalid_arg(f"Shared memory register request has no '{key}' field")


def _member_uint(doc: dict[str, Any], key: str) -> int:
    _member(doc, key)
    return _uint(doc, key)


def routes(dp_of: Any) -> list[web.RouteDef]:
    """The routes; ``dp_of(request)`` gives the DataPlane."""

    def dp(request: web.Request) -> DataPlane:
        return dp_of(request)  # type: ignore[no-any-return]

    def region(request: web.Request) -> str:
        return request.match_info.get("region", "")

    async def registered(
        request: web.Request, kind: str, **fields: int | str | bytes
    ) -> web.Response:
        await dp(request).shared_memory("register", kind, region(request), **fields)
        return web.Response(status=200)

    async def system_status(request: web.Request) -> web.Response:
        regions = await dp(request).shared_memory("status", "system", region(request))
        body = [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in regions
        ]
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def system_register(request: web.Request) -> web.Response:
        doc = await _body(request)
        _required(doc, "key")
        key = _string(doc["key"])
        offset = _uint(doc, "offset", 0)
        _required(doc, "byte_size")
        return await registered(
            request, "system", key=key, offset=offset, byte_size=_uint(doc, "byte_size")
        )

    async def cuda_status(request: web.Request) -> web.Response:
        regions = await dp(request).shared_memory("status", "cuda", region(request))
        body = [
            {"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions
        ]
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def cuda_register(request: web.Request) -> web.Response:
        if gpu_count() == 0:
            # Triton built without GPU support answers this before reading the body.
            raise invalid_arg(
                f"failed to register CUDA shared memory region: '{region(request)}', "
                "GPUs not supported"
            )
        doc = await _body(request)
        _required(doc, "raw_handle")
        b64 = _string(_member(doc["raw_handle"], "b64"))
        byte_size = _member_uint(doc, "byte_size")
        device_id = _member_uint(doc, "device_id")
        handle = _lenient_b64decode(b64)
        if len(handle) != CUDA_HANDLE_BYTES:  # checked here first, as Triton's HTTP does
            raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        return await registered(
            request, "cuda", raw_handle=handle, device_id=device_id, byte_size=byte_size
        )

    async def unnamed_register(request: web.Request) -> web.Response:
        kind = "cuda" if request.path.startswith("/v2/cuda") else "system"
        raise invalid_arg(f"'region name' is necessary to register {kind} shared memory region")

    def unregister(kind: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            await dp(request).shared_memory("unregister", kind, region(request))
            return web.Response(status=200)

        return handler

    out: list[web.RouteDef] = []
    for kind, status, register in (
        ("system", system_status, system_register),
        ("cuda", cuda_status, cuda_register),
    ):
        base = f"/v2/{kind}sharedmemory"
        one = base + "/region/{region:[^/]+}"
        out += [
            web.get(base + "/status", status),
            web.get(one + "/status", status),
            web.post(one + "/register", register),
            web.post(base + "/register", unnamed_register),
            web.post(base + "/unregister", unregister(kind)),
            web.post(one + "/unregister", unregister(kind)),
        ]
    return out
