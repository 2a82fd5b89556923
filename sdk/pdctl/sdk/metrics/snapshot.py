"""One round of the metrics stream, as data: what :class:`~pdctl.sdk.metrics.monitor.
FleetMonitor` yields and the alerts, the TUI and scripts read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pdctl.sdk.metrics.derive import Latency, Lengths
from pdctl.sdk.metrics.rendezvous import Rendezvous


@dataclass(frozen=True)
class Target:
    name: str
    role: str  # prefill | decode | colocated | router
    url: str
    tp: int = 1


@dataclass(frozen=True)
class Transfers:
    """NIXL figures recorded by the WRITE initiator (prefill in push, decode in pull)."""

    bytes_total: float | None = None
    bytes_window: float | None = None
    throughput_bps: float | None = None
    transfers_window: float = 0.0
    bytes_per_request: float | None = None
    per_request_note: str = ""
    xfer_time: Latency = Latency()
    post_time: Latency = Latency()
    descriptors_per_transfer: float | None = None
    failed_transfers: float | None = None
    failed_notifications: float | None = None
    expired_leases: float | None = None
    failed_window: float = 0.0
    expired_window: float = 0.0


@dataclass(frozen=True)
class InstanceMetrics:
    name: str
    role: str
    url: str
    health: str  # UP | DOWN | STALE
    error: str | None = None
    down_since: float | None = None
    request_rate: float | None = None
    ttft: Latency = Latency()
    itl: Latency = Latency()
    tpot: Latency = Latency()
    e2e: Latency = Latency()
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    transfers: Transfers = Transfers()
    kv_fetch_by_stage: dict[str, float] = field(default_factory=dict)
    prompt_tokens_by_source: dict[str, float] = field(default_factory=dict)
    prompt_tokens_by_source_window: dict[str, float] = field(default_factory=dict)
    rendezvous: Rendezvous | None = None
    """The connector's push rendezvous figures; None when its series are absent."""
    malformed_lines: int = 0
    prefix_hit_rate: float | None = None
    """vLLM's own prefix-cache hits / queried tokens (over the window when it has two
    scrapes, else since start); None without queries."""
    kv_index: str | None = None
    """The cache_aware router's index state for this instance (EXACT, DEGRADED,
    FALLBACK); None with other policies."""
    prompt_tokens: Lengths = Lengths()
    """Prompt tokens of the requests finished in the window."""
    output_tokens: Lengths = Lengths()
    """Generated tokens of the requests finished in the window (1 on a prefill)."""
    span_s: float | None = None
    """Seconds between the two scrapes the window's figures come from (None with one)."""
    pdctl_series: bool | None = None
    """Whether the instance exports pdctl's connector series (``pdctl:*``); None for the
    router and before the first answer (see :mod:`~pdctl.sdk.metrics.coverage`)."""


@dataclass(frozen=True)
class PairMetrics:
    prefill: str
    decode: str
    requests: int
    ok: int
    errors: int
    ttft_p50_ms: float | None
    overlap_p50_ms: float | None
    segments: dict[str, dict[str, float]] = field(default_factory=dict)
    """The flight recorder's TTFT split: segment name → p50/p99 ms (see
    :func:`~pdctl.sdk.metrics.flight.segment_stats`)."""
    transfers: int = 0
    """Requests of the window whose flight shows KV pushed over this pair (bytes > 0)."""
    kv_verify: dict[str, int] = field(default_factory=dict)
    """The digest check's word on the window's requests, from their flights
    (``push.verified``): ``ok``, ``mismatch`` and ``unsampled`` (pushed, not checked);
    empty when no flight of the window measured a push (the instances export no flight
    series)."""
    canary: dict[str, float] = field(default_factory=dict)
    """The router's output canary since it started (``pdctl_router_canary_total`` of
    this pair): ``match``, ``diverged``, ``error``; empty when the canary is off."""


@dataclass(frozen=True)
class Alert:
    code: str
    severity: str  # critical | warning
    subject: str
    message: str
    since: float


@dataclass(frozen=True)
class Summary:
    """The fleet in a few figures. Latencies are the slowest front instance's (decode or
    colocated: where a client's first token comes from) over the window, in seconds;
    ``None`` until a request has finished there."""

    request_rate: float = 0.0
    """Requests finished per second on the front instances."""
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    e2e_p50_s: float | None = None
    kv_bytes_moved: float = 0.0
    """KV bytes written over NIXL since the instances started (all initiators)."""
    transfer_bps: float = 0.0
    """KV bytes per second over the window."""
    requests_running: float = 0.0
    """Requests running on the front instances now."""
    requests_waiting: float = 0.0
    instances_up: int = 0
    instances: int = 0


@dataclass(frozen=True)
class RouterAdmission:
    """What the router's admission control and TTFT predictor did over the window, from
    its ``/metrics`` (:func:`~pdctl.sdk.metrics.overload.admission_of`). A figure that
    cannot be measured is None (an empty dict for the breakdowns) and ``missing`` says
    why; a zero is a zero the router counted."""

    span_s: float | None = None
    """Seconds between the two router scrapes the rates come from (None with one)."""
    shed_per_s: float | None = None
    """Requests answered without reaching the fleet, per second (every reason)."""
    shed_by_reason: dict[str, float] = field(default_factory=dict)
    """Reason (prefill_saturated, decode_saturated, slo_unreachable, draining) → per
    second, every reason the router exports (at 0 included)."""
    shed_by_class: dict[str, float] = field(default_factory=dict)
    """Priority class (interactive, standard, batch) → shed per second."""
    admitted_per_s: float | None = None
    """Requests admitted to the fleet per second (queued first or not)."""
    queued_admitted_per_s: float | None = None
    """Of those, the ones that waited in the router's queue first."""
    prediction_error_p50: float | None = None
    """Median of |predicted - observed| / observed TTFT (a ratio: 0.18 is 18 %) of the
    answered requests that had a prediction, from the histogram's buckets over the
    window (with one scrape: since the router started, as its latencies)."""
    predictions: float | None = None
    """Answered requests with a prediction in that window (the histogram's count)."""
    predictions_by_result: dict[str, float] = field(default_factory=dict)
    """Requests placed in the window with a prediction (known) or without (unknown)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Figure → why it has no value."""


@dataclass(frozen=True)
class Snapshot:
    at: float
    """Unix time of this round."""
    window_s: float
    instances: tuple[InstanceMetrics, ...]
    roles: dict[str, dict[str, Any]]
    pairs: tuple[PairMetrics, ...]
    router: dict[str, Any] | None
    alerts: tuple[Alert, ...]
    summary: Summary
    admission: RouterAdmission | None = None
    """The router's shedding, admissions and TTFT predictions over the window; None
    without a router to scrape."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def instance(self, name: str) -> InstanceMetrics:
        for i in self.instances:
            if i.name == name:
                return i
        raise KeyError(name)
