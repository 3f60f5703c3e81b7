"""A small OTLP/HTTP trace receiver for the tests (the OpenTelemetry Collector cannot be
installed here): it takes the protobuf ``ExportTraceServiceRequest`` POSTed to
``/v1/traces``, from the ``opentelemetry-proto`` package's definitions, and keeps every
span with its resource's attributes. Runs on a thread; ``wait_for`` blocks on a condition
until the spans asked for have come (no polling)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(otlp.ExportTraceServiceRequest.FromString(body))
                answer = otlp.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, req: Any) -> None:
        spans = []
        for rs in req.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    events = [(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events]
                    spans.append(
                        Span(
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.name,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            _attrs(s.attributes),
                            events,
                            resource,
                        )
                    )
        with self._cond:
            self.spans.extend(spans)
            self._cond.notify_all()

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float = 30.0) -> list[Span]:
        """The spans received, once ``done`` says they are enough (AssertionError after
        ``timeout`` seconds without)."""
        with self._cond:
            assert self._cond.wait_for(lambda: done(self.spans), timeout), self.spans
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
