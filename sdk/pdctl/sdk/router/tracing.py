"""One trace per request across the router and both legs (W3C Trace Context).

The router takes the client's ``traceparent`` (or starts a trace), opens a ``route`` span
for the request and a child span per leg (``prefill leg``, ``decode leg``, ``render``,
``migration``), and sends each leg its own span as the ``traceparent`` header, so the
engines' spans (vLLM's ``--otlp-traces-endpoint``) hang under the leg that caused them.

Without ``router.otlp_endpoint`` nothing is exported: ids are generated here and only the
header travels (a few random bits per request). With it, spans are OpenTelemetry SDK spans
exported over OTLP/HTTP to ``<endpoint>/v1/traces``; OpenTelemetry is imported only then
(``pip install 'pdctl[otel]'``).
"""

from __future__ import annotations

import random
import re
from typing import Any, Protocol


class Timeline(Protocol):
    """What tracing reads of a request's timeline (:class:`pdctl.sdk.router.timeline.
    Timeline` has it; declared here so that tracing does not import the timeline)."""

    trace: RequestTrace | None
    id: str
    mode: str
    endpoint: str
    prefill: str | None
    decode: str | None
    outcome: str
    status: int | None
    error: str | None


TRACEPARENT = "traceparent"
_TP_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
SPAN_NAMES = {
    "route": "route",
    "prefill": "prefill leg",
    "decode": "decode leg",
    "render": "render",
    "migration": "migration",
}


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid version-00 header, else None."""
    if not value:
        return None
    m = _TP_RE.match(value.strip().lower())
    if m is None or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
        return None
    return m.group(1), m.group(2), m.group(3)


class Span(Protocol):
    @property
    def traceparent(self) -> str: ...

    def set(self, **attrs: Any) -> None: ...

    def end(self, error: str | None = None) -> None: ...


class _IdSpan:
    """A span that is only an id: its header is passed on, nothing is exported. Its own
    id is drawn when its header is first asked for (most route spans never are: each
    leg carries its own span's)."""

    __slots__ = ("_flags", "_tp", "_trace_id")

    def __init__(self, trace_id: str, flags: str) -> None:
        self._trace_id, self._flags = trace_id, flags
        self._tp: str | None = None

    @property
    def traceparent(self) -> str:
        tp = self._tp
        if tp is None:
            tp = self._tp = f"00-{self._trace_id}-{random.getrandbits(64) or 1:016x}-{self._flags}"
        return tp

    def set(self, **attrs: Any) -> None:
        return None

    def end(self, error: str | None = None) -> None:
        return None


class RequestTrace:
    """The spans of one request: the route span and its open children by role."""

    def __init__(self, tracer: Tracer, incoming: str | None) -> None:
        self._tracer = tracer
        self.exporting = tracer.exporting
        parent = parse_traceparent(incoming)
        self.incoming = incoming if parent is not None else None
        if parent is None:
            self.trace_id, self.flags = f"{random.getrandbits(128) or 1:032x}", "01"
        else:
            self.trace_id, _, self.flags = parent
        self.root = tracer.span("route", self, None)
        self.open: dict[str, Span] = {}

    def start(self, role: str, **attrs: Any) -> Span:
        """Open the ``role`` leg's span (ending one still open for that role)."""
        old = self.open.pop(role, None)
        if old is not None:
            old.end()
        span = self._tracer.span(role, self, self.root)
        if self.exporting and attrs:
            span.set(**attrs)
        self.open[role] = span
        return span

    def stop(self, role: str, error: str | None = None, **attrs: Any) -> None:
        span = self.open.pop(role, None)
        if span is not None:
            if self.exporting and attrs:
                span.set(**attrs)
            span.end(error)

    def header(self, role: str) -> str:
        """The ``traceparent`` a leg of ``role`` carries: its own span, else the route's."""
        span = self.open.get(role) or self.root
        return span.traceparent

    def end(self, tl: Timeline) -> None:
        """Close every open span and the route span with the request's outcome."""
        if not self.exporting:
            self.open.clear()  # ids only: nothing to record
            return
        error = tl.error if tl.outcome != "ok" else None
        for role in list(self.open):
            instance = tl.decode if role == "decode" else None
            self.stop(role, error, **({"pdctl.instance": instance} if instance else {}))
        self.root.set(
            **{
                "pdctl.mode": tl.mode,
                "pdctl.path": tl.endpoint,
                "pdctl.prefill": tl.prefill or "",
                "pdctl.decode": tl.decode or "",
                "pdctl.outcome": tl.outcome,
                "http.response.status_code": tl.status or 0,
                "pdctl.request_id": tl.id,
            }
        )
        self.root.end(error)


class Tracer:
    """Makes the router's spans: ids only, or OpenTelemetry spans exported over OTLP."""

    def __init__(self, traces_url: str | None = None, **resource: str) -> None:
        """``traces_url``: the collector's OTLP/HTTP traces URL; None exports nothing."""
        self.traces_url = traces_url
        self.exporting = bool(traces_url)
        self._otel: Any = None
        if traces_url:
            from pdctl.sdk.router import otel  # OpenTelemetry, only when asked for

            self._otel = otel.OtelSpans(traces_url, resource)

    def begin(self, incoming: str | None) -> RequestTrace:
        return RequestTrace(self, incoming)

    def span(self, role: str, trace: RequestTrace, parent: Span | None) -> Span:
        if self._otel is None:
            return _IdSpan(trace.trace_id, trace.flags)
        tp = parent.traceparent if parent is not None else trace.incoming
        return self._otel.span(SPAN_NAMES.get(role, role), tp, server=parent is None)  # type: ignore[no-any-return]

    def shutdown(self) -> None:
        if self._otel is not None:
            self._otel.shutdown()


# ------------------------------------------------------------ calls from the router


def open_leg(tl: Timeline, role: str, instance: str | None = None) -> None:
    t = tl.trace
    if t is not None:
        if t.exporting and instance:
            t.start(role, **{"pdctl.instance": instance})
        else:
            t.start(role)


def close_leg(
    tl: Timeline, role: str, instance: str | None = None, status: int | None = None
) -> None:
    t = tl.trace
    if t is not None and not t.exporting:
        t.stop(role)
    elif t is not None:
        attrs: dict[str, Any] = {}
        if instance:
            attrs["pdctl.instance"] = instance
        if status is not None:
            attrs["http.response.status_code"] = status
        err = f"{role} answered {status}" if status is not None and status >= 400 else None
        t.stop(role, err, **attrs)


def migrated(tl: Timeline, reason: str) -> None:
    """Decode was sent again (told the wrong prefill, or moved off a failed instance):
    the old decode leg ends and a ``migration`` span records why."""
    if tl.trace is not None:
        tl.trace.stop("decode", f"migrated: {reason}")
        tl.trace.start("migration", **{"pdctl.reason": reason})
        tl.trace.stop("migration")


def finished(tl: Timeline) -> None:
    if tl.trace is not None:
        tl.trace.end(tl)
