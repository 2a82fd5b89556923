"""Each request's timeline and the router's own metrics."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.router.tracing import RequestTrace, Tracer

_IDS = random.Random()
"""Where request ids come from: seeded from the system's randomness once per process,
then 128 bits per id without a system call (an id names a request in vLLM and in the KV
transfer; it needs to be unique, not secret). A forked child draws a new seed (the
parent's ids are not repeated)."""
os.register_at_fork(after_in_child=_IDS.seed)


def request_id() -> str:
    """A new request's id: ``pdctl-`` and 32 hex digits."""
    return f"pdctl-{_IDS.getrandbits(128):032x}"


@dataclass(slots=True)
class Timeline:
    """One request's path through the fleet; times are seconds since ``received``."""

    id: str
    mode: str
    endpoint: str
    stream: bool
    received: float
    t0: float
    prefill: str | None = None
    decode: str | None = None
    prefill_sent: float | None = None
    prefill_done: float | None = None
    decode_sent: float | None = None
    decode_first_byte: float | None = None
    done: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    outcome: str = "running"
    status: int | None = None
    error: str | None = None
    retries: int = 0
    redispatched: bool = False
    route_path: str = "text"
    """text | tokens | text-fallback (tokens asked for, no render server answered)."""
    decision: str | None = None
    """tokens path: disaggregated | decode-only (prompt under the threshold) | colocated."""
    render: str | None = None
    render_done: float | None = None
    notes: list[str] = field(default_factory=list)
    """What the router did beyond the plain path: waits, retries, cancellations."""
    migrations: list[dict[str, Any]] = field(default_factory=list)
    """Decode migrations: from, to, at_ms, tokens_sent, why (and through_prefill: the
    prefill a request was disaggregated again through, where it was)."""

    @classmethod
    def begin(
        cls,
        mode: str,
        endpoint: str,
        stream: bool,
        tracer: Tracer | None = None,
        traceparent: str | None = None,
    ) -> Timeline:
        """A new request's timeline (and its trace, continuing ``traceparent``)."""
        tl = cls(
            id=request_id(),
            mode=mode,
            endpoint=endpoint,
            stream=stream,
            received=time.time(),
            t0=time.perf_counter(),
        )
        if tracer is not None:
            tl.trace = tracer.begin(traceparent)
        return tl

    def note(self, text: str) -> None:
        self.notes.append(f"{self.mark() * 1000:.1f} ms: {text}")

    kv_on: tuple[Upstream, str] | None = None
    """The prefill that may hold KV for this request (push) and the id its leg carried."""

    prefill_leg: Any = None
    """How the request's P/D attempt made its prefill leg from its body (push mode), so
    that a retry can make one for another prefill; None: no P/D attempt."""

    trace: RequestTrace | None = None
    """The request's spans (W3C trace context); None for timelines made elsewhere."""
    flight: Any = None
    """The TTFT split (:class:`~pdctl.sdk.router.flightrec.Flight`), joined on demand."""
    flight_final: bool = False
    canary: dict[str, Any] | None = None
    """The live output canary's word on this request (:mod:`pdctl.sdk.router.canary`):
    result (match, diverged, error, dropped), the instance it was replayed on, detail."""
    ttft_due: float | None = None
    """``time.perf_counter()`` by which its first byte is wanted (the nearer of its SLO and
    deadline; None: neither), for SLO routing (:mod:`pdctl.sdk.router.predictor`)."""
    size: Any = None
    """What the TTFT predictor reads of its body (:class:`~.predictor.Size`)."""
    prediction: Any = None
    """Its pair's predicted TTFT when placed (:class:`~.predictor.Prediction`)."""

    def mark(self) -> float:
        return time.perf_counter() - self.t0

    def as_dict(self) -> dict[str, Any]:
        ms = {
            k: None if v is None else round(v * 1000, 3)
            for k, v in (
                ("prefill_sent_ms", self.prefill_sent),
                ("prefill_done_ms", self.prefill_done),
                ("decode_sent_ms", self.decode_sent),
                ("decode_first_byte_ms", self.decode_first_byte),
                ("render_done_ms", self.render_done),
                ("done_ms", self.done),
            )
        }
        return {
            "id": self.id,
            "mode": self.mode,
            "path": self.endpoint,
            "stream": self.stream,
            "received": self.received,
            "prefill": self.prefill,
            "decode": self.decode,
            **ms,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "outcome": self.outcome,
            "status": self.status,
            "error": self.error,
            "retries": self.retries,
            "redispatched": self.redispatched,
            "route_path": self.route_path,
            "decision": self.decision,
            "render": self.render,
            "notes": list(self.notes),
            "migrations": list(self.migrations),
            "canary": self.canary,
            "predicted_ttft_ms": _predicted_ms(self),
            **_flight_fields(self),
        }


def _predicted_ms(tl: Timeline) -> float | None:
    ttft = None if tl.prediction is None else tl.prediction.ttft_s
    return None if ttft is None else round(ttft * 1000, 3)


def _flight_fields(tl: Timeline) -> dict[str, Any]:
    if tl.flight is not None:
        out: dict[str, Any] = tl.flight.as_dict()
        return out
    ttft = tl.decode_first_byte
    return {"ttft_ms": None if ttft is None else round(ttft * 1000, 3), "segments": []}


OUTCOMES = ("ok", "error", "cancelled")
"""How a request settles (:meth:`~pdctl.sdk.router.ledger.Ledger.finish`)."""
MAX_PRIMED_PAIRS = 4096


class RouterMetrics:
    """The router's ``/metrics`` series (``pdctl_router_*``)."""

    def __init__(self, upstreams: list[Upstream]) -> None:
        self._upstreams = upstreams
        r = self.registry = Registry()
        self.requests = r.counter(
            "pdctl_router_requests_total", "Requests by mode and outcome.", ("mode", "outcome")
        )
        self.retries = r.counter(
            "pdctl_router_retries_total", "Legs re-sent after a connection failure.", ("role",)
        )
        self.identity = r.counter(
            "pdctl_router_prefill_identity_changes_total",
            "Prefill responses whose identity differed from the one decode was given.",
            ("instance",),
        )
        self.ttft = r.histogram(
            "pdctl_router_ttft_seconds",
            "Router-side time to first byte of the answer.",
            ("mode",),
        )
        self.e2e = r.histogram(
            "pdctl_router_e2e_seconds", "Router-side request duration.", ("mode",)
        )
        self.prefill_leg = r.histogram(
            "pdctl_router_prefill_leg_seconds", "Prefill leg duration.", ("instance",)
        )
        self.after_prefill = r.histogram(
            "pdctl_router_decode_first_byte_after_prefill_seconds",
            "Decode first byte minus prefill done (KV wait, transfer, decode admission and "
            "first step; not the transfer alone).",
            ("mode",),
        )
        self.overlap = r.histogram(
            "pdctl_router_leg_overlap_seconds",
            "Time both legs were in flight together (0 when sequential).",
            ("mode",),
        )
        self.decisions = r.counter(
            "pdctl_router_disaggregation_decisions_total",
            "Requests by decision (disaggregated; decode-only under "
            "router.disaggregate_min_tokens on the tokens path or "
            "router.disaggregate_min_uncached_tokens with cache_aware; colocated) and "
            "route (text, tokens, text-fallback).",
            ("decision", "route"),
        )
        self.migrations = r.counter(
            "pdctl_router_migrations_total",
            "Requests continued on another decode after theirs failed, by failed instance.",
            ("instance",),
        )
        self.render = r.histogram(
            "pdctl_router_render_seconds", "tokens path: time to render a request.", ("instance",)
        )
        self.pair_requests = r.counter(
            "pdctl_router_pair_requests_total",
            "Requests by prefill, decode (the P->D pair that carried the KV) and outcome.",
            ("prefill", "decode", "outcome"),
        )
        self.pair_handoff = r.histogram(
            "pdctl_router_pair_handoff_seconds",
            "Decode first byte minus prefill done, by P->D pair (transfer + decode admission).",
            ("prefill", "decode"),
        )
        r.gauge(
            "pdctl_router_outstanding",
            "Requests in flight per instance.",
            ("instance", "role"),
            lambda: {(u.name, u.role): float(u.outstanding) for u in upstreams},
        )
        r.gauge(
            "pdctl_router_instance_up",
            "1 when the instance passes health checks.",
            ("instance", "role"),
            lambda: {(u.name, u.role): float(u.healthy) for u in upstreams},
            merge="min",  # with several workers: up while every worker sees it up
        )
        r.gauge(
            "pdctl_router_breaker_open",
            "1 while the instance's circuit breaker is open.",
            ("instance",),
            lambda: {(u.name,): float(u.breaker.state == "open") for u in upstreams},
            merge="max",  # with several workers: 1 while any worker's breaker is open
        )

    def prime(
        self,
        modes: Iterable[str],
        decisions: Iterable[str],
        routes: Iterable[str],
        *,
        max_pairs: int = MAX_PRIMED_PAIRS,
    ) -> None:
        """Export every counter at 0, and every histogram empty, for the label values
        this router can produce, from start-up: dashboards and alerts see 0 retries
        rather than no series, and a histogram's first observations count in
        Prometheus' ``rate()``: a series first scraped after its first requests has no
        earlier sample, so those requests never show as an increase (on a short burst,
        a latency panel without data). The P->D pair series are primed only up to
        ``max_pairs`` pairs (they grow as prefills x decodes); beyond that a pair
        appears with its first request."""
        ups = self._upstreams
        modes = tuple(modes)
        prefills = [u.name for u in ups if u.role == "prefill"]
        decodes = [u.name for u in ups if u.role == "decode"]
        self.requests.prime(modes, OUTCOMES)
        self.retries.prime(("prefill", "decode"))
        self.identity.prime(prefills)
        self.decisions.prime(tuple(decisions), tuple(routes))
        self.migrations.prime(decodes)
        for h in (self.ttft, self.e2e, self.after_prefill, self.overlap):
            h.prime(modes)
        self.prefill_leg.prime(prefills)
        self.render.prime([u.name for u in ups if u.role == "render"])
        if len(prefills) * len(decodes) <= max_pairs:
            self.pair_requests.prime(prefills, decodes, OUTCOMES)
            self.pair_handoff.prime(prefills, decodes)

    def finished(self, tl: Timeline, mode: str, outcome: str) -> None:
        """Count a settled request and observe its latencies."""
        self.requests.inc(mode, outcome)
        pair = (tl.prefill, tl.decode) if tl.prefill and tl.decode else None
        if pair is not None:
            self.pair_requests.inc(*pair, outcome)
        if outcome == "ok" and tl.done is not None:
            self.e2e.observe(tl.done, mode)
            if tl.decode_first_byte is not None:
                self.ttft.observe(tl.decode_first_byte, mode)
                if tl.prefill_done is not None:
                    handoff = max(0.0, tl.decode_first_byte - tl.prefill_done)
                    self.after_prefill.observe(handoff, mode)
                    if pair is not None:
                        self.pair_handoff.observe(handoff, *pair)
            if tl.prefill_done is not None and tl.decode_sent is not None:
                self.overlap.observe(max(0.0, tl.prefill_done - tl.decode_sent), mode)
