"""The router's spans as OpenTelemetry SDK spans, exported over OTLP/HTTP.

Imported only when ``router.otlp_endpoint`` is set (:mod:`pdctl.sdk.router.tracing`);
needs ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http``
(``pip install 'pdctl[otel]'``; vLLM's own tracing needs the same packages).
"""

from __future__ import annotations

from typing import Any

from pdctl.sdk.errors import PdctlError

try:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:  # pragma: no cover - depends on the installation
    raise PdctlError(
        f"router.otlp_endpoint is set but OpenTelemetry is not installed ({e.name}): "
        "pip install 'pdctl[otel]', or remove router.otlp_endpoint"
    ) from None

_PROPAGATOR = TraceContextTextMapPropagator()


class _OtelSpan:
    __slots__ = ("_span", "_tp")

    def __init__(self, span: Any) -> None:
        self._span = span
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        self._tp = carrier["traceparent"]

    @property
    def traceparent(self) -> str:
        return self._tp

    def set(self, **attrs: Any) -> None:
        if attrs:
            self._span.set_attributes(attrs)

    def end(self, error: str | None = None) -> None:
        if error:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()


class OtelSpans:
    def __init__(self, url: str, resource: dict[str, str]) -> None:
        attrs = {"service.name": "pdctl-router", **resource}
        self.provider = TracerProvider(resource=Resource.create(attrs))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("pdctl.router")

    def span(self, name: str, parent: str | None, *, server: bool) -> _OtelSpan:
        ctx = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
        kind = SpanKind.SERVER if server else SpanKind.CLIENT
        return _OtelSpan(self.tracer.start_span(name, context=ctx, kind=kind))

    def shutdown(self) -> None:
        self.provider.shutdown()
