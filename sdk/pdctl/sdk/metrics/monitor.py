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
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx

from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.kube import PodDiscovery
from pdctl.sdk.metrics.alerts import ALERTS as ALERTS  # re-exported: the alert listing
from pdctl.sdk.metrics.alerts import evaluate_alerts
from pdctl.sdk.metrics.derive import Scrape
from pdctl.sdk.metrics.instance import (
    instance_of,
    kv_index_of,
    roles_of,
    router_canary_of,
    router_window,
    summary_of,
)
from pdctl.sdk.metrics.overload import admission_of
from pdctl.sdk.metrics.pairs import canary_window, pairs_of
from pdctl.sdk.metrics.promanswers import PromRound
from pdctl.sdk.metrics.promql import Trends
from pdctl.sdk.metrics.promsource import PrometheusSource, scrapes
from pdctl.sdk.metrics.promtext import Sample, parse_text
from pdctl.sdk.metrics.series import HISTOGRAMS as HISTOGRAMS  # re-exported: the series read
from pdctl.sdk.metrics.series import LENGTHS as LENGTHS
from pdctl.sdk.metrics.series import WANTED as WANTED
from pdctl.sdk.metrics.series import V
from pdctl.sdk.metrics.snapshot import (
    Alert,
    InstanceMetrics,
    PairMetrics,
    RouterAdmission,
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
    "RouterAdmission",
    "Snapshot",
    "Summary",
    "Target",
    "Transfers",
    "evaluate_alerts",
    "targets_for",
    "targets_from_urls",
]


class FleetMonitor:
    """The fleet's metrics stream. Its source is either the instances themselves (each
    target's ``/metrics``, scraped concurrently) or, with ``prometheus``, an operator's
    Prometheus (four queries per update, whatever the fleet's size; see
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
            "kv_index": self._kv_states.get(t.name),
        }
        return instance_of(t, hist, base)

    def _histories(self) -> list[tuple[Target, deque[Scrape]]]:
        return [(t, self._history[t.name]) for t in self.targets if t.name in self._history]

    def snapshot(self) -> Snapshot:
        now = time.monotonic()
        self._kv_states = kv_index_of(self._histories())
        insts = tuple(self._instance(t, now) for t in self.targets)
        roles = roles_of(insts)
        summary = summary_of(insts)
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
                router_canary_of(self._histories()),
            ),
            router,
            alerts,
            summary,
            admission_of(self._histories()),
        )

    # ------------------------------------------------------------------ alerts

    def _alerts(self, insts: tuple[InstanceMetrics, ...]) -> tuple[Alert, ...]:
        kv_idle_s, down_count = self._watch.update(insts, time.monotonic())
        got = router_window(self._histories())
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
