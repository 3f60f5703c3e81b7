"""Request bodies over HTTP: read as sent within their deadline, then decompressed.

Bodies are read and decompressed here (gzip, deflate), not by aiohttp: its C parser
(3.14) reports a deflate stream that ends early to the connection only, as a 400 queued
behind the request still waiting for that body, which then never ends. The application
holds the limits (``MAX_INPUT``, ``BODY_DEADLINE``); errors are ServingError (400, or
UnsupportedEncoding for Triton's 415).
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

from aiohttp import web

from shoal.ipc.errors import invalid_arg

_DECODERS = ("gzip", "deflate")
# Bodies larger than this are inflated on a thread (zlib releases the GIL), not on the
# event loop; 64 KiB of deflate inflates to at most ~64 MiB.
_INLINE_INFLATE_BYTES = 64 * 1024


@dataclass(frozen=True)
class BodyDeadline:
    """How long a request body may take to arrive: no gap longer than ``idle_s`` between
    its bytes, and all of it within ``idle_s`` plus one second per ``min_rate`` bytes
    from the start of its read (0: no rate). aiohttp's C parser (3.14) reports a chunked
    framing error that comes after the headers to the connection only, never to the body
    being read, which would wait as long as the client kept the socket open; a client
    that trickles its body (slow loris) is stopped the same way."""

    idle_s: float = 30.0
    min_rate: int = 8192


MAX_INPUT: web.AppKey[int] = web.AppKey("max_input_size", int)
BODY_DEADLINE: web.AppKey[BodyDeadline] = web.AppKey("body_deadline", BodyDeadline)


class UnsupportedEncoding(Exception):
    """A Content-Encoding other than gzip, deflate or identity (Triton's 415)."""

    def __init__(self, encoding: str) -> None:
        super().__init__(encoding)
        self.encoding = encoding


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decompressed (``encoding`` is gzip or deflate), at most ``limit`` bytes.

    As Triton, either encoding takes a zlib or a gzip stream; deflate also takes a raw
    deflate stream (what aiohttp took). Unlike Triton, which keeps whatever inflated
    before an error and lets the JSON parser fail on it, a corrupt, truncated or
    over-long stream is refused with its own message.
    """
    if not body:
        raise invalid_arg("nothing to be decompressed")  # Triton's words
    inflater = zlib.decompressobj(_window_bits(body, encoding))
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        reason = str(exc).partition(": ")[2] or str(exc)
        raise invalid_arg(f"failed to decompress the {encoding} request body: {reason}") from None
    if len(out) > limit:
        raise invalid_arg(
            f"request body decompresses to more than the maximum allowed input size of {limit} "
            "bytes. Use --http-max-input-size to increase the limit."
        )
    if not inflater.eof:
        raise invalid_arg(
            f"failed to decompress the {encoding} request body: the compressed data is truncated"
        )
    if inflater.unused_data:
        raise invalid_arg(
            f"failed to decompress the {encoding} request body: "
            f"{len(inflater.unused_data)} unexpected byte(s) after the compressed data"
        )
    return out


def _window_bits(body: bytes, encoding: str) -> int:
    zlib_header = (body[0] & 0x0F) == 8 and int.from_bytes(body[:2], "big") % 31 == 0  # RFC 1950
    if encoding == "deflate" and not zlib_header and body[:2] != b"\x1f\x8b":
        return -zlib.MAX_WBITS  # a raw deflate stream
    return zlib.MAX_WBITS | 32  # a zlib or a gzip stream, whichever it is


async def _read_raw(request: web.Request) -> bytes:
    """The body as sent, at most ``client_max_size`` bytes, refused once it misses its
    BodyDeadline."""
    limit = request.app[MAX_INPUT]
    content = request.content
    if content.is_eof():  # all of it is here already (most requests): no timer to arm
        body = content.read_nowait()
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
        return body
    deadline = request.app[BODY_DEADLINE]
    parts: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    start = last = loop.time()
    try:
        async with asyncio.timeout(deadline.idle_s) as timer:
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > limit:
                    raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
                parts.append(chunk)
                last = loop.time()
                due = last + deadline.idle_s
                if deadline.min_rate:
                    due = min(due, start + deadline.idle_s + size / deadline.min_rate)
                timer.reschedule(due)
    except TimeoutError:
        now = loop.time()
        if now - last >= deadline.idle_s:
            reason = f"no data for {deadline.idle_s:g} s"
        else:
            reason = f"{size} bytes in {now - start:.0f} s, slower than {deadline.min_rate} bytes/s"
        raise invalid_arg(f"failed to read the request body: {reason}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_body(request: web.Request) -> bytes:
    """The request body as the client meant it: read whole (at most the input limit, as
    sent), then decompressed per Content-Encoding as Triton does for inference."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", *_DECODERS):
        raise UnsupportedEncoding(request.headers["Content-Encoding"][:100])
    body = await _read_raw(request)
    if encoding in ("", "identity"):
        return body
    limit = request.app[MAX_INPUT]
    if len(body) <= _INLINE_INFLATE_BYTES:
        return inflate(body, encoding, limit)
    return await asyncio.to_thread(inflate, body, encoding, limit)
