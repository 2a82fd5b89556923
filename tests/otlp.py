"""A minimal OTLP/HTTP trace receiver for tests: collects the spans posted to
``/v1/traces`` (protobuf or JSON) by the router and by vLLM."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _decode(body: bytes, content_type: str) -> list[ReceivedSpan]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    if "json" in content_type:
        from google.protobuf import json_format  # type: ignore[import-untyped, unused-ignore]

        json_format.Parse(body, req)
    else:
        req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        service=str(resource.get("service.name", "")),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        resource=resource,
                    )
                )
    return out


class OtlpReceiver:
    """``with OtlpReceiver() as rx:`` listens on a free port; ``rx.url`` is the base URL
    to configure (``rx.url + "/v1/traces"`` is where spans go)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.spans: list[ReceivedSpan] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                try:
                    spans = _decode(body, self.headers.get("Content-Type") or "")
                except Exception as e:  # report, never crash the exporter's call
                    receiver.errors.append(f"{self.path}: {e}")
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.spans.extend(spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def dump(self) -> str:
        with self._lock:
            return json.dumps([s.__dict__ for s in self.spans], indent=1, default=str)
