"""The fleet metrics stream: one collector for the TUI, scripts and alerts.

:class:`FleetMonitor` scrapes every instance's ``/metrics``, the router's ``/metrics`` and
its recent-requests API concurrently, each with its own timeout, and turns each round
into an immutable :class:`Snapshot` of derived figures over a sliding window. A target
that does not answer is DOWN at once and STALE once it has been down for
``stale_after_s``; the others are unaffected. Malformed lines are skipped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx

from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.kube import PodDiscovery
from pdctl.sdk.metrics.alerts import ALERTS as ALERTS  # re-exported: the alert listing
from pdctl.sdk.metrics.alerts import evaluate_alerts
from pdctl.sdk.metrics.derive import (
    Latency,
    Lengths,
    Scrape,
    Window,
    counter_delta,
    window_of,
)
from pdctl.sdk.metrics.pairs import canary_of, canary_window, pairs_of
from pdctl.sdk.metrics.promql import Trends
from pdctl.sdk.metrics.promsource import PrometheusSource, PromRound, scrapes
from pdctl.sdk.metrics.promtext import Sample, parse_text
from pdctl.sdk.metrics.rendezvous import METRICS as RENDEZVOUS_METRICS
from pdctl.sdk.metrics.rendezvous import present, rendezvous_of
from pdctl.sdk.metrics.snapshot import (
    Alert,
    InstanceMetrics,
    PairMetrics,
    Snapshot,
    Summary,
    Target,
    Transfers,
)
from pdctl.sdk.metrics.targets import (
    base_url,
    discovered,
    discovery_of,
    targets_for,
    targets_from_urls,
)
from pdctl.sdk.metrics.watch import LifecycleWatch
from pdctl.sdk.spec import FleetSpec

__all__ = [
    "ALERTS",
    "Alert",
    "FleetMonitor",
    "InstanceMetrics",
    "PairMetrics",
    "Snapshot",
    "Summary",
    "Target",
    "Transfers",
    "evaluate_alerts",
    "targets_for",
    "targets_from_urls",
]

V = "vllm:"
WANTED = (
    V + "time_to_first_token_seconds",
    V + "inter_token_latency_seconds",
    V + "request_time_per_output_token_seconds",
    V + "e2e_request_latency_seconds",
    V + "nixl_",
    V + "num_requests_running",
    V + "num_requests_waiting",
    V + "num_requests_kv_fetch_by_stage",
    V + "kv_cache_usage_perc",
    V + "prompt_tokens_by_source_total",
    V + "request_success_total",
    V + "prefix_cache_",
    V + "request_prompt_tokens",
    V + "request_generation_tokens",
    "pdctl",
)
"""The series the monitor reads (router: pdctl_router_*, connector: pdctl:*); the
parser skips every other line of a ~60 KB payload without looking inside it."""
QUANTILES = (0.5, 0.9, 0.99)
LENGTHS = (V + "request_prompt_tokens", V + "request_generation_tokens")
"""The token-length histograms (:class:`Lengths`: a mean and a p95, not latencies)."""
ROUTER_TTFT = "pdctl_router_ttft_seconds"
"""The router's time to the answer's first byte, every request (router/timeline.py)."""
ROUTER_E2E = "pdctl_router_e2e_seconds"
HISTOGRAMS = (
    V + "time_to_first_token_seconds",
    V + "inter_token_latency_seconds",
    V + "request_time_per_output_token_seconds",
    V + "e2e_request_latency_seconds",
    V + "nixl_xfer_time_seconds",
    V + "nixl_post_time_seconds",
    ROUTER_TTFT,
    ROUTER_E2E,
    *(m.name for m in RENDEZVOUS_METRICS if m.kind == "histogram"),
)
"""The histograms whose quantiles the snapshot shows (:class:`Latency`); of the others
(NIXL's bytes and descriptors, :data:`LENGTHS`) it reads the sum and count, or one
quantile."""


class FleetMonitor:
    """The fleet's metrics stream. Its source is either the instances themselves (each
    target's ``/metrics``, scraped concurrently) or, with ``prometheus``, an operator's
    Prometheus (four instant queries per update, whatever the fleet's size; see
    :mod:`~pdctl.sdk.metrics.promsource`); the same :class:`Snapshot` comes out."""

    def __init__(
        self,
        targets: Iterable[Target],
        *,
        mode: str = "push",
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        window_s: float = 60.0,
        stale_after_s: float = 30.0,
        expected_throughput_bps: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        prometheus: PrometheusSource | None = None,
        router_url: str | None = None,
        discovery: PodDiscovery | None = None,
    ) -> None:
        """``router_url``: with ``prometheus``, where the router's recent requests are
        read (its per-pair figures); the router's series come from Prometheus.
        ``discovery``: Kubernetes pods found by labels, added to ``targets`` as they come
        and removed as they go (:meth:`from_kubernetes`)."""
        self.targets = list(targets)
        self.discovery = discovery
        self._static = list(self.targets)
        self.prometheus = prometheus
        self.router_url = None if router_url is None else base_url(router_url)
        self.mode = mode
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.window_s = window_s
        self.stale_after_s = stale_after_s
        self.expected_throughput_bps = expected_throughput_bps
        self._transport = transport
        self._history: dict[str, deque[Scrape]] = {t.name: deque() for t in self.targets}
        self._down_since: dict[str, float] = {}
        self._errors: dict[str, str] = {}
        self._malformed: dict[str, int] = {}
        self._recent: list[dict[str, Any]] = []
        self._router_mode: str | None = None
        self._alert_since: dict[tuple[str, str], float] = {}
        self._watch = LifecycleWatch()
        self._window_end: float | None = None
        self._kv_states: dict[str, str] = {}

    @classmethod
    def for_fleet(cls, spec: FleetSpec, plan: FleetPlan, **kw: Any) -> FleetMonitor:
        return cls(targets_for(spec, plan), mode=spec.fleet.mode, **kw)

    @classmethod
    def for_endpoints(
        cls,
        prefill: Iterable[str] = (),
        decode: Iterable[str] = (),
        router: str | None = None,
        **kw: Any,
    ) -> FleetMonitor:
        """A fleet known only by its URLs (``pdctl metrics --prefill URL --decode URL``)."""
        return cls(targets_from_urls(prefill, decode, router), **kw)

    @classmethod
    def from_prometheus(
        cls,
        url: str,
        selector: str = "",
        *,
        router_url: str | None = None,
        instance_label: str = "instance",
        role_label: str = "role",
        buckets: bool = False,
        **kw: Any,
    ) -> FleetMonitor:
        """A fleet read from the Prometheus at ``url`` (``selector``: label matchers such
        as ``fleet="demo"``); the instances are those ``up{selector}`` lists. The
        quantiles come from Prometheus' ``histogram_quantile``; ``buckets``: from every
        bucket, computed by pdctl (see :class:`PrometheusSource`)."""
        timeout = kw.get("timeout_s", 2.0)
        source = PrometheusSource(
            url,
            selector=selector,
            instance_label=instance_label,
            role_label=role_label,
            timeout_s=max(5.0, timeout),
            buckets=buckets,
        )
        return cls((), prometheus=source, router_url=router_url, **kw)

    @classmethod
    def from_kubernetes(
        cls,
        namespace: str | None = None,
        prefill_selector: str | None = None,
        decode_selector: str | None = None,
        router_selector: str | None = None,
        preset: str | None = None,
        *,
        router_url: str | None = None,
        **kw: Any,
    ) -> FleetMonitor:
        """The pods of ``namespace`` a preset or the selectors find, followed with list +
        watch (:func:`pdctl.sdk.kube.discovery` takes its keywords: ``port``, ``config``,
        ``kubeconfig``, ``context``, ...); ``router_url``: a router outside the pods."""
        found = discovery_of(
            namespace, prefill_selector, decode_selector, router_selector, preset, kw
        )
        return cls(
            targets_from_urls(router=router_url) if router_url else [], discovery=found, **kw
        )

    async def aclose(self) -> None:
        """Stop following the pods (only a monitor with discovery holds anything)."""
        if self.discovery is not None:
            await self.discovery.aclose()

    def _use(self, targets: Iterable[Target]) -> None:
        """The targets from now on; what was kept of those that left is dropped."""
        self.targets = list(targets)
        live = {t.name for t in self.targets}
        for gone in [n for n in self._history if n not in live]:
            for state in (self._history, self._down_since, self._errors, self._malformed):
                state.pop(gone, None)
        for t in self.targets:
            self._history.setdefault(t.name, deque())

    # ------------------------------------------------------------------ scraping

    async def _scrape(self, client: httpx.AsyncClient, t: Target) -> None:
        now = time.monotonic()
        try:
            r = await client.get(t.url + "/metrics", timeout=self.timeout_s)
            if r.status_code != 200:
                raise httpx.HTTPError(f"/metrics answered {r.status_code}")
            samples, bad = parse_text(r.text, WANTED)
            if t.role == "router":
                await self._read_recent(client, t.url)
        except (httpx.HTTPError, ValueError, OSError) as e:
            self._down_since.setdefault(t.name, now)
            self._errors[t.name] = str(e) or type(e).__name__
            return
        self._down_since.pop(t.name, None)
        self._errors.pop(t.name, None)
        self._record(t.name, samples, len(bad), now)

    async def _read_recent(self, client: httpx.AsyncClient, url: str) -> None:
        rr = await client.get(url + "/v1/pdctl/requests?limit=1000", timeout=self.timeout_s)
        data = rr.json()
        if not isinstance(data, dict) or not isinstance(data.get("requests", []), list):
            raise ValueError("the router's recent requests are not a JSON object with a list")
        self._recent = [r for r in data.get("requests", []) if isinstance(r, dict)]
        self._router_mode = data.get("mode")

    async def _collect(self, client: httpx.AsyncClient, source: PrometheusSource) -> None:
        """One update from Prometheus; the router's recent requests from ``router_url``."""
        rnd = await source.collect(client, time.time(), self.window_s, WANTED, HISTOGRAMS, LENGTHS)
        if self.router_url is not None:
            try:
                await self._read_recent(client, self.router_url)
            except (httpx.HTTPError, ValueError, OSError):
                self._recent = []
        self._window_end = rnd.at
        self._apply(rnd)

    def _apply(self, rnd: PromRound) -> None:
        now = time.monotonic()
        self._use(rnd.targets)
        for t in self.targets:
            hist = scrapes(rnd, t.name, self.window_s)
            why = rnd.down.get(t.name) or (None if hist else "no series in Prometheus")
            if why is not None:
                self._down_since.setdefault(t.name, now)
                self._errors[t.name] = why
                self._history.setdefault(t.name, deque())
                continue
            self._down_since.pop(t.name, None)
            self._errors.pop(t.name, None)
            self._history[t.name] = deque(hist)

    def _record(self, name: str, samples: list[Sample], malformed: int, at: float) -> None:
        self._malformed[name] = self._malformed.get(name, 0) + malformed
        hist = self._history[name]
        hist.append(Scrape(samples, at))
        while len(hist) > 2 and at - hist[1].at >= self.window_s:
            hist.popleft()

    def ingest(self, name: str, text: str, at: float | None = None) -> int:
        """Feed one target's payload scraped elsewhere (tests, benchmarks, other
        transports); returns the number of malformed lines skipped."""
        samples, bad = parse_text(text, WANTED)
        self._record(name, samples, len(bad), time.monotonic() if at is None else at)
        return len(bad)

    async def poll(self, client: httpx.AsyncClient | None = None) -> Snapshot:
        """Scrape everything once and return the new snapshot."""
        if client is None:
            async with httpx.AsyncClient(transport=self._transport) as c:
                return await self.poll(c)
        if self.prometheus is not None:
            await self._collect(client, self.prometheus)
        else:
            if self.discovery is not None:
                await self.discovery.start()
                self._use(discovered(self.discovery, self._static))
            await asyncio.gather(*(self._scrape(client, t) for t in self.targets))
        return self.snapshot()

    async def trends(self, client: httpx.AsyncClient, points: int = 120) -> Trends | None:
        """With a Prometheus source: each instance's request rate and TTFT p50 over the
        last ``points`` updates (``interval_s`` apart, the last one at the latest
        update's evaluation time, or now before any), as these updates would have
        derived them, in one range query; None with any other source (the instances
        keep no history)."""
        if self.prometheus is None:
            return None
        return await self.prometheus.trends(
            client,
            self._window_end or time.time(),
            points,
            self.interval_s,
            self.window_s,
            V + "request_success_total",
            V + "time_to_first_token_seconds",
        )

    async def snapshots(self, count: int | None = None) -> AsyncIterator[Snapshot]:
        """A snapshot every ``interval_s`` (``count`` of them, or forever)."""
        n = 0
        async with (
            httpx.AsyncClient(transport=self._transport) as client,
            contextlib.aclosing(self),
        ):
            while count is None or n < count:
                t0 = time.monotonic()
                yield await self.poll(client)
                n += 1
                if count is None or n < count:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    # ------------------------------------------------------------------ deriving

    def _instance(self, t: Target, now: float) -> InstanceMetrics:
        hist = self._history[t.name]
        down = self._down_since.get(t.name)
        if down is not None:
            health = "STALE" if now - down >= self.stale_after_s else "DOWN"
        elif not hist:
            health = "DOWN"
        else:
            health = "UP"
        base: dict[str, Any] = {
            "name": t.name,
            "role": t.role,
            "url": t.url,
            "health": health,
            "error": self._errors.get(t.name),
            "down_since": None if down is None else time.time() - (now - down),
            "malformed_lines": self._malformed.get(t.name, 0),
        }
        if hist and t.role != "router":
            base["prefix_hit_rate"] = _hit_rate(hist[-1], hist[0] if len(hist) > 1 else None)
        base["kv_index"] = self._kv_states.get(t.name)
        if not hist:
            return InstanceMetrics(**base)
        new, old = hist[-1], (hist[0] if len(hist) > 1 else None)
        dt = new.at - old.at if old is not None else 0.0

        def window(name: str, prefix: str = V) -> Window | None:
            return window_of(new, old, prefix + name)

        if t.role == "router":  # what the router measured of every request it answered
            e2e = window(ROUTER_E2E, "")
            return InstanceMetrics(
                **base,
                ttft=Latency.of(window(ROUTER_TTFT, "")),
                e2e=Latency.of(e2e),
                request_rate=(e2e.count / dt) if (e2e is not None and dt > 0) else None,
                span_s=dt if old is not None else None,
            )

        done = counter_delta(
            new.total(V + "request_success_total"),
            old.total(V + "request_success_total") if old else None,
        )
        src_new = new.by_label(V + "prompt_tokens_by_source_total", "source")
        src_old = old.by_label(V + "prompt_tokens_by_source_total", "source") if old else {}
        return InstanceMetrics(
            **base,
            request_rate=(done / dt) if (done is not None and dt > 0) else None,
            ttft=Latency.of(window("time_to_first_token_seconds")),
            itl=Latency.of(window("inter_token_latency_seconds")),
            tpot=Latency.of(window("request_time_per_output_token_seconds")),
            e2e=Latency.of(window("e2e_request_latency_seconds")),
            running=new.total(V + "num_requests_running"),
            waiting=new.total(V + "num_requests_waiting"),
            kv_usage=new.total(V + "kv_cache_usage_perc"),
            transfers=self._transfers(t, new, old, dt, window),
            kv_fetch_by_stage=new.by_label(V + "num_requests_kv_fetch_by_stage", "stage"),
            prompt_tokens_by_source=src_new,
            prompt_tokens_by_source_window={
                k: counter_delta(v, src_old.get(k)) or 0.0 for k, v in src_new.items()
            }
            if old
            else {},
            rendezvous=rendezvous_of(new, old, t.role),
            pdctl_series=present(new),
            prompt_tokens=Lengths.of(window("request_prompt_tokens")),
            output_tokens=Lengths.of(window("request_generation_tokens")),
            span_s=dt if old is not None else None,
        )

    def _kv_index(self) -> dict[str, str]:
        """The router's index state per instance, from its latest scrape (read once per
        snapshot, not once per instance)."""
        out: dict[str, str] = {}
        for t in self.targets:
            hist = self._history.get(t.name) if t.role == "router" else None
            if hist:
                for s in hist[-1].by_name.get("pdctl_router_kv_index_state", ()):
                    if s.value == 1:
                        out.setdefault(s.label("instance"), s.label("state"))
        return out

    def _transfers(
        self, t: Target, new: Scrape, old: Scrape | None, dt: float, window: Any
    ) -> Transfers:
        total_bytes = new.total(V + "nixl_bytes_transferred_sum")
        if total_bytes is None:
            return Transfers()
        bytes_h: Window | None = window("nixl_bytes_transferred")
        desc_h: Window | None = window("nixl_num_descriptors")
        bw = bytes_h.sum if (bytes_h is not None and old is not None) else None
        handles = bytes_h.count if bytes_h is not None else 0.0

        def dcount(name: str) -> float:
            return counter_delta(new.total(V + name), old.total(V + name) if old else None) or 0.0

        # One NIXL sample per WRITE handle (request x initiator rank x target rank), pooled
        # across ranks: with equal TP on both sides there is one handle per rank.
        per_req: float | None = None
        note = "pooled over ranks; not normalised (no transfers in the window)"
        if bw is not None and handles > 0:
            per_req = bw / handles * t.tp
            note = f"bytes per handle x {t.tp} initiator rank(s), assuming equal P/D TP"
        return Transfers(
            bytes_total=total_bytes,
            bytes_window=bw,
            throughput_bps=(bw / dt) if (bw is not None and dt > 0) else None,
            transfers_window=handles,
            bytes_per_request=per_req,
            per_request_note=note,
            xfer_time=Latency.of(window("nixl_xfer_time_seconds")),
            post_time=Latency.of(window("nixl_post_time_seconds")),
            descriptors_per_transfer=desc_h.mean if desc_h is not None else None,
            failed_transfers=new.total(V + "nixl_num_failed_transfers_total"),
            failed_notifications=new.total(V + "nixl_num_failed_notifications_total"),
            expired_leases=new.total(V + "nixl_num_kv_expired_reqs_total"),
            failed_window=dcount("nixl_num_failed_transfers_total")
            + dcount("nixl_num_failed_notifications_total"),
            expired_window=dcount("nixl_num_kv_expired_reqs_total"),
        )

    def _router_scrapes(self) -> tuple[Scrape, Scrape | None] | None:
        """The router's latest scrape and the oldest of the window (None without one)."""
        for t in self.targets:
            hist = self._history.get(t.name) if t.role == "router" else None
            if hist:
                return hist[-1], (hist[0] if len(hist) > 1 else None)
        return None

    def _canary(self) -> dict[tuple[str, str], dict[str, float]]:
        """The router's canary results per P->D pair since it started (its latest
        scrape); pairs with none yet are left out."""
        got = self._router_scrapes()
        out = canary_of(got[0]) if got else {}
        return {k: v for k, v in out.items() if any(v.values())}

    def snapshot(self) -> Snapshot:
        now = time.monotonic()
        self._kv_states = self._kv_index()
        insts = tuple(self._instance(t, now) for t in self.targets)
        roles: dict[str, dict[str, Any]] = {}
        for i in insts:
            r = roles.setdefault(
                i.role,
                {
                    "instances": 0,
                    "up": 0,
                    "request_rate": 0.0,
                    "running": 0.0,
                    "waiting": 0.0,
                    "kv_bytes_window": 0.0,
                },
            )
            r["instances"] += 1
            r["up"] += i.health == "UP"
            r["request_rate"] += i.request_rate or 0.0
            r["running"] += i.running or 0.0
            r["waiting"] += i.waiting or 0.0
            r["kv_bytes_window"] += i.transfers.bytes_window or 0.0
        front = [i for i in insts if i.role in ("decode", "colocated")]

        def slowest(of: Callable[[InstanceMetrics], float | None]) -> float | None:
            return max((v for v in map(of, front) if v is not None), default=None)

        summary = Summary(
            request_rate=sum(i.request_rate or 0.0 for i in front),
            ttft_p50_s=slowest(lambda i: i.ttft.p50),
            ttft_p99_s=slowest(lambda i: i.ttft.p99),
            itl_p50_s=slowest(lambda i: i.itl.p50),
            itl_p99_s=slowest(lambda i: i.itl.p99),
            e2e_p50_s=slowest(lambda i: i.e2e.p50),
            kv_bytes_moved=sum(i.transfers.bytes_total or 0.0 for i in insts),
            transfer_bps=sum(i.transfers.throughput_bps or 0.0 for i in insts),
            requests_running=sum(i.running or 0.0 for i in front),
            requests_waiting=sum(i.waiting or 0.0 for i in front),
            instances_up=sum(i.health == "UP" for i in insts),
            instances=len(insts),
        )
        router = None
        if self.router_url is not None or any(t.role == "router" for t in self.targets):
            router = {"mode": self._router_mode, "recent_requests": len(self._recent)}
        alerts = self._alerts(insts)
        return Snapshot(
            time.time(),
            self.window_s,
            insts,
            roles,
            pairs_of(
                self._recent,
                (self._window_end or time.time()) - self.window_s,
                self._canary(),
            ),
            router,
            alerts,
            summary,
        )

    # ------------------------------------------------------------------ alerts

    def _alerts(self, insts: tuple[InstanceMetrics, ...]) -> tuple[Alert, ...]:
        kv_idle_s, down_count = self._watch.update(insts, time.monotonic())
        got = self._router_scrapes()
        raised = evaluate_alerts(
            insts,
            mode=self.mode,
            router_mode=self._router_mode,
            recent=self._recent,
            expected_throughput_bps=self.expected_throughput_bps,
            kv_idle_s=kv_idle_s,
            down_count=down_count,
            canary_diverged=canary_window(*got, "diverged") if got else None,
        )
        now = time.time()
        live = {(a[0], a[2]) for a in raised}
        for key in list(self._alert_since):
            if key not in live:
                del self._alert_since[key]
        return tuple(
            Alert(code, sev, subj, msg, self._alert_since.setdefault((code, subj), now))
            for code, sev, subj, msg in raised
        )


def _hit_rate(new: Scrape, old: Scrape | None) -> float | None:
    q, h = new.total(V + "prefix_cache_queries_total"), new.total(V + "prefix_cache_hits_total")
    if q is None or h is None:
        return None
    if old is not None:
        q = counter_delta(q, old.total(V + "prefix_cache_queries_total")) or 0.0
        h = counter_delta(h, old.total(V + "prefix_cache_hits_total")) or 0.0
    return h / q if q > 0 else None
