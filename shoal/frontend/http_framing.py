"""One request framing Triton serves and aiohttp's fast (llhttp) parser refuses: a
request with both ``Transfer-Encoding: chunked`` and ``Content-Length``, which
``requests`` sends when it is given a chunk-encoded body and a header saying so. HTTP/1.1
(RFC 9112 6.3) lets Transfer-Encoding override Content-Length; Triton's evhtp does so.

The fast parser stays in place: only a connection whose first request it refuses for
that reason is handed, with everything it has sent, to aiohttp's Python parser told to
drop the Content-Length. A later request on a connection already under way is refused
as before (the fast parser has by then consumed bytes it cannot give back).

Uses two private parts of aiohttp (a handler's ``_parser``, the server's ``__call__``),
both stable through the 3.x series; tests/integration/test_http_errors.py covers them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.http_parser import HttpRequestParserPy
from aiohttp.web_protocol import RequestHandler

_TE = b"transfer-encoding:"
_CL = b"content-length:"


class _ChunkedOverLength(HttpRequestParserPy):
    """aiohttp's Python request parser, reading Transfer-Encoding over Content-Length."""

    def parse_headers(self, lines: list[bytes]) -> Any:
        if any(line[: len(_TE)].lower() == _TE for line in lines):
            lines = [line for line in lines if line[: len(_CL)].lower() != _CL]
        return super().parse_headers(lines)


class _FirstRequestFallback:
    """A connection's parser: the fast one, until it refuses the first request for
    carrying both headers; then the lenient one, fed everything the connection sent."""

    def __init__(self, handler: RequestHandler) -> None:
        self._handler = handler
        self._parser: Any = handler._parser
        self._seen: bytearray | None = bytearray()  # until the first request is parsed

    def feed_data(self, data: bytes) -> Any:
        seen = self._seen
        if seen is None:  # (a Python parser after a fallback)
            return self._parser.feed_data(data)
        seen += data
        try:
            parsed = self._parser.feed_data(data)
        except BadHttpMessage as exc:
            if "Content-Length" not in exc.message or "Transfer-Encoding" not in exc.message:
                raise
            self._parser = _ChunkedOverLength(
                self._handler,
                self._handler._loop,
                2**16,
                payload_exception=web.RequestPayloadError,
                auto_decompress=False,
            )
            self._seen = None
            return self._parser.feed_data(bytes(seen))
        if parsed[0]:  # the first request's head is through: nothing to fall back for,
            self._seen = None  # and the connection reads through the fast parser itself
            self._handler._parser = self._parser
        return parsed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        self.prepare_handler(handler)
        return handler

    def prepare_handler(self, handler: RequestHandler) -> None:
        """Give a connection's handler the parser above (a protocol factory that makes
        its handlers itself, shoal.frontend.http_connections's gate, calls this)."""
        handler._parser = _FirstRequestFallback(handler)  # type: ignore[assignment]


def accept_chunked_with_length(runner: web.AppRunner) -> None:
    """Make ``runner``'s server (set up, not yet listening) serve the framing above."""
    assert runner.server is not None
    runner.server.__class__ = _Server
