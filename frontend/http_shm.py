"""Triton's system and CUDA shared-memory extensions over HTTP (register, unregister,
status): thin handlers over DataPlane.shared_memory. Body errors are those of Triton's
HandleSystemSharedMemory and HandleCudaSharedMemory (src/http_server.cc)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec
from aiohttp import web

from configs.devices import gpu_count
from frontend.dataplane import DataPlane
from frontend.http_codec import parse_json
from ipc.errors import Code, ServingError, invalid_arg

_MAX_JSON_DEPTH = 100  # deeper than any register body


async def _body(request: web.Request) -> dict[str, Any]:
    """The register body, read as the inference one (Triton's EVBufferToJson for both)."""
    return parse_json(memoryview(await request.read()), _MAX_JSON_DEPTH)


def _uint(doc: dict[str, Any], key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        # Triton 2.51's JSON layer, word for word: INTERNAL, the member not named (a
        # number past uint64 is a double to it).
        raise ServingError(
            Code.INTERNAL, "attempt to access JSON non-unsigned-integer as unsigned-integer"
        )
    return value


def _required(doc: dict[str, Any], key: str) -> None:
    if key not in doc:
        raise invalid_arg(f"Shared memory register request has no '{key}' field")


def _member_uint(doc: dict[str, Any], key: str) -> int:
    """A required member read as Triton's JSON layer reads it (MemberAsUInt): a missing
    one is its INTERNAL error, not a register-request message."""
    if key not in doc:
        raise ServingError(Code.INTERNAL, f"attempt to access non-existing object member '{key}'")
    return _uint(doc, key)


def routes(dp_of: Any) -> list[web.RouteDef]:
    """The routes; ``dp_of(request)`` gives the DataPlane."""

    def dp(request: web.Request) -> DataPlane:
        return dp_of(request)  # type: ignore[no-any-return]

    def region(request: web.Request) -> str:
        return request.match_info.get("region", "")

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
        key = doc["key"]
        if not isinstance(key, str):  # Triton's JSON layer, word for word
            raise ServingError(Code.INTERNAL, "attempt to access JSON non-string as string")
        offset = _uint(doc, "offset", 0)
        _required(doc, "byte_size")
        await dp(request).shared_memory(
            "register",
            "system",
            region(request),
            key=key,
            offset=offset,
            byte_size=_uint(doc, "byte_size"),
        )
        return web.Response(status=200)

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
        raw = doc["raw_handle"]
        b64 = raw.get("b64") if isinstance(raw, dict) else None
        if not isinstance(b64, str):
            raise invalid_arg("Unable to parse 'raw_handle': expected {\"b64\": <base64>}")
        byte_size = _member_uint(doc, "byte_size")
        device_id = _member_uint(doc, "device_id")
        try:
            handle = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise invalid_arg("Unable to parse 'raw_handle': invalid base64") from None
        await dp(request).shared_memory(
            "register",
            "cuda",
            region(request),
            raw_handle=handle,
            device_id=device_id,
            byte_size=byte_size,
        )
        return web.Response(status=200)

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
            web.post(base + "/unregister", unregister(kind)),
            web.post(one + "/unregister", unregister(kind)),
        ]
    return out
