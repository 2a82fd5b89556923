"""Where the TUI's data comes from: one interface over the SDK, a live fleet behind it
(:class:`LiveSource`) or a replayed one (:mod:`pdctl.tui.replay`).

A source is polled by one worker; each round gives an :class:`Update` (the monitor's
snapshot, the router's flight recorder and control state, the launcher's view of each
instance). Actions go through the same object, so a view never talks to the network.
"""

from __future__ import annotations

import asyncio
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.client import AsyncRouterClient, RouterState
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.events import Event, EventSource
from pdctl.sdk.fleet import (
    FleetStatus,
    InstanceStatus,
    fleet_dir,
    fleet_status,
    read_state,
    remote_restart,
    remote_stop,
)
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.keys import admin_key
from pdctl.sdk.metrics import Trends
from pdctl.sdk.metrics.monitor import FleetMonitor, Snapshot
from pdctl.sdk.plan.recommend import PROFILE_ENV, LivePlanner, LiveRecommendation
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import router_url


@dataclass(frozen=True)
class Update:
    snapshot: Snapshot
    requests: tuple[dict[str, Any], ...] | None = None
    """The router's recent requests, newest first; None without a router."""
    router: RouterState | None = None
    fleet: dict[str, InstanceStatus] | None = None
    """The launcher's state per instance; None when no supervisor runs it here."""
    notes: tuple[str, ...] = ()
    """Why a part is missing (e.g. the router's control API did not answer)."""
    recommendation: LiveRecommendation | None = None
    """The planner's recommendation for the live load (the latest one computed)."""
    recommendation_note: str = ""
    """Why there is no recommendation (no profile, no traffic yet, …)."""
    events: tuple[Event, ...] = ()
    """Fleet events new since the previous update (the first: every one kept)."""
    trends: Trends | None = None
    """The trends from before the UI started (Prometheus' range query, the first update
    only): the sparklines start full, not empty."""


@dataclass(frozen=True)
class PreflightResult:
    available: bool
    report: dict[str, Any] | None = None
    """``PreflightReport.as_dict()``."""
    message: str = ""
    expected_bps: float | None = None
    """The KV throughput the report expects for this placement, when it says."""


class Clock:
    """Wall time for the source's own stamps; tests inject one they advance."""

    def now(self) -> float:
        return time.time()

    def tick(self, seconds: float) -> None:
        """Called once per round with the interval (a system clock moves by itself)."""


@dataclass
class Source(ABC):
    title: str
    interval_s: float = 1.0
    spec: FleetSpec | None = None
    fleet_name: str | None = None
    """The launcher's name for the fleet (restart/stop/logs need it)."""
    router: AsyncRouterClient | None = None
    """The router's client (``pool=False``: polls and actions run on different loops)."""
    expected_bps: float | None = None
    """Expected KV throughput (``--expect-gbps`` or the preflight report)."""
    clock: Clock = field(default_factory=Clock)
    planner: LivePlanner | None = None
    """The planner for the recommendation view; None: ``planner_note`` says why."""
    planner_note: str = ""
    recommend_every_s: float = 5.0
    """Seconds between recommendations (each one plans every candidate layout); at
    least ten times the last one's planning time, so planning a large fleet's many
    layouts takes at most a tenth of the poll worker's time."""
    _advice: tuple[float, LiveRecommendation | None, str] | None = field(
        default=None, init=False, repr=False
    )
    _advice_gap_s: float = field(default=0.0, init=False, repr=False)
    events: EventSource | None = None
    """The fleet's event journal (None: this source has no events to show)."""
    _events_read: bool = field(default=False, init=False, repr=False)

    @abstractmethod
    async def poll(self) -> Update: ...

    def journal(self, update: Update) -> Update:
        """``update`` with the fleet events since the last one: what this round derived
        (alerts, the router's view, requests' retries and failures) is journaled first.
        Runs on the poll worker's thread."""
        if self.events is None:
            return update
        if not self._events_read:
            self.events.history()
        self.events.observe(
            update.snapshot, update.router, update.requests or (), at=self.clock.now()
        )
        if not self._events_read:
            self._events_read = True
            return replace(update, events=tuple(self.events.history()))
        return replace(update, events=tuple(self.events.new()))

    def control(self, what: str, subject: str | None) -> None:
        """Journal a control action this UI made (restart and stop are journaled by the
        supervisor that carries them out)."""
        if self.events is not None:
            self.events.control(what, subject, via="pdctl UI")

    def advise(self, update: Update) -> Update:
        """``update`` with the planner's latest recommendation (recomputed once every
        ``recommend_every_s``, or each round until one could be made). Runs on the poll
        worker's thread, never the UI's."""
        if self.planner is None:
            return replace(update, recommendation_note=self.planner_note)
        now = self.clock.now()
        last = self._advice
        gap = max(self.recommend_every_s, self._advice_gap_s)
        if last is None or last[1] is None or now - last[0] >= gap:
            t0 = time.perf_counter()
            try:
                last = (now, self.planner.recommend(update.snapshot), "")
            except PdctlError as e:
                last = (now, None, str(e))
            self._advice_gap_s = 10 * (time.perf_counter() - t0)
            self._advice = last
        return replace(update, recommendation=last[1], recommendation_note=last[2])

    async def _requests(
        self, notes: list[str], limit: int = 200
    ) -> tuple[dict[str, Any], ...] | None:
        """The router's recent requests (None without a router; a note when it failed)."""
        if self.router is None:
            return None
        try:
            return tuple(t.raw for t in await self.router.requests(limit))
        except PdctlError as e:
            notes.append(str(e))
            return None

    async def _router_state(self, notes: list[str]) -> RouterState | None:
        if self.router is None:
            return None
        try:
            return await self.router.state()
        except PdctlError as e:
            notes.append(str(e))
            return None

    async def close(self) -> None:  # noqa: B027 - most sources hold nothing to release
        """Release connections (called by the poll worker when it ends)."""

    def log_path(self, name: str) -> Path | None:
        if self.fleet_name is None:
            return None
        path = fleet_dir(self.fleet_name) / "logs" / f"{name}.log"
        return path if path.exists() else None

    def _need_fleet(self) -> str:
        if self.fleet_name is None or read_state(fleet_dir(self.fleet_name)) is None:
            raise PdctlError(
                "this fleet is not supervised by pdctl on this machine (no `pdctl up` state): "
                "restart and stop need the supervisor"
            )
        return self.fleet_name

    async def restart(self, name: str) -> None:
        """Stop the instance and start it again (returns once it is ready)."""
        await asyncio.to_thread(remote_restart, self._need_fleet(), name)

    async def stop(self, name: str) -> None:
        await asyncio.to_thread(remote_stop, self._need_fleet(), name)

    async def preflight(self) -> PreflightResult:
        return await run_preflight(self.spec)


class LiveSource(Source):
    """A running fleet, through :class:`FleetMonitor`, the router's control API and the
    launcher's state directory."""

    def __init__(
        self,
        spec: FleetSpec,
        plan: FleetPlan,
        *,
        title: str | None = None,
        fleet_name: str | None = None,
        interval_s: float = 1.0,
        window_s: float = 60.0,
        timeout_s: float = 2.0,
        expected_bps: float | None = None,
        status_every: int = 3,
        request_limit: int = 200,
        planner: LivePlanner | None = None,
    ) -> None:
        """Without ``planner`` the profile is looked up as ``LivePlanner.discover`` does
        (``PDCTL_PLAN_PROFILE``, else ./pdctl-profile.json)."""
        router = None
        if spec.router is not None:
            router = AsyncRouterClient(
                router_url(spec),
                api_key=admin_key(spec),
                control_timeout_s=timeout_s,
                pool=False,
            )
        super().__init__(
            title=title or f"fleet {spec.fleet.name}",
            interval_s=interval_s,
            spec=spec,
            fleet_name=fleet_name or spec.fleet.name,
            router=router,
            expected_bps=expected_bps,
        )
        if planner is None:
            self.planner, self.planner_note = LivePlanner.discover(spec)
        else:
            self.planner = planner
        self.monitor = FleetMonitor.for_fleet(
            spec,
            plan,
            interval_s=interval_s,
            timeout_s=timeout_s,
            window_s=window_s,
            expected_throughput_bps=expected_bps,
        )
        self.status_every = max(1, status_every)
        self.request_limit = request_limit
        self._client: httpx.AsyncClient | None = None
        self._round = 0
        self._fleet: dict[str, InstanceStatus] | None = None
        self.events = EventSource(fleet_dir(self.fleet_name)) if self.fleet_name else None

    def use_profile(self, path: str) -> None:
        """Plan from the profile at ``path`` (``pdctl top --plan-profile``); a profile
        that cannot be read leaves the view saying why."""
        assert self.spec is not None
        env = {**os.environ, PROFILE_ENV: path}
        self.planner, self.planner_note = LivePlanner.discover(self.spec, environ=env)

    async def poll(self) -> Update:
        if self._client is None:
            self._client = httpx.AsyncClient()
        notes: list[str] = []
        snap, reqs, state, fleet = await asyncio.gather(
            self.monitor.poll(self._client),
            self._requests(notes, self.request_limit),
            self._router_state(notes),
            self._fleet_status(),
        )
        self._round += 1
        return self.journal(self.advise(Update(snap, reqs, state, fleet, tuple(notes))))

    async def _fleet_status(self) -> dict[str, InstanceStatus] | None:
        if self.fleet_name is None or self._round % self.status_every:
            return self._fleet
        try:
            st: FleetStatus = await fleet_status(self.fleet_name)
        except PdctlError:
            self._fleet = None
        else:
            self._fleet = {i.name: i for i in st.instances}
        return self._fleet

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class MonitorSource(Source):
    """A fleet pdctl did not launch, known only through a :class:`FleetMonitor` (its
    endpoints, or a Prometheus) and, when given, its router: no spec, so no launcher
    actions, no planner and no preflight."""

    def __init__(
        self,
        monitor: FleetMonitor,
        *,
        title: str,
        interval_s: float = 1.0,
        router_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 2.0,
        request_limit: int = 200,
    ) -> None:
        router = None
        if router_url is not None:
            router = AsyncRouterClient(
                router_url, api_key=api_key, control_timeout_s=timeout_s, pool=False
            )
        super().__init__(title=title, interval_s=interval_s, router=router)
        self.monitor = monitor
        self.request_limit = request_limit
        self.planner_note = "no spec: the planner needs the fleet's spec (-f SPEC)"
        self._client: httpx.AsyncClient | None = None
        self._trends_read = False
        self.trend_points = 120
        """Points of history asked of Prometheus once (the TUI's sparkline length)."""

    async def poll(self) -> Update:
        if self._client is None:
            self._client = httpx.AsyncClient()
        notes: list[str] = []
        try:
            snap, reqs, state = await asyncio.gather(
                self.monitor.poll(self._client),
                self._requests(notes, self.request_limit),
                self._router_state(notes),
            )
        except PdctlError as e:  # Prometheus refused or is gone: say so, keep the UI
            notes.append(str(e))
            snap, reqs, state = self.monitor.snapshot(), None, None
        found = self.monitor.discovery
        if found is not None and found.problem:  # the last known pods are shown
            notes.append(f"Kubernetes: {found.problem}")
        if found is not None and (waiting := found.waiting()):
            shown = ", ".join(f"{n} ({why})" for n, why in sorted(waiting.items())[:3])
            more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
            notes.append(f"Kubernetes: {len(waiting)} selected pod(s) not shown: {shown}{more}")
        trends = None
        if not self._trends_read:  # once: a range query for what came before
            self._trends_read = True
            try:
                trends = await self.monitor.trends(self._client, self.trend_points)
            except PdctlError as e:
                notes.append(f"no trends from before: {e}")
        update = Update(snap, reqs, state, None, tuple(notes), trends=trends)
        return self.journal(self.advise(update))

    async def close(self) -> None:
        await self.monitor.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None


async def run_preflight(spec: FleetSpec | None) -> PreflightResult:
    """The topology report for the spec's placement (:mod:`pdctl.sdk.preflight`)."""
    if spec is None:
        return PreflightResult(False, message="preflight needs a fleet spec")
    try:
        from pdctl.sdk.preflight import run_preflight as preflight
    except ImportError:  # an installation without the preflight module
        return PreflightResult(False, message="preflight not available in this pdctl")
    try:
        report = await asyncio.to_thread(preflight, spec)
    except PdctlError as e:
        return PreflightResult(True, message=f"preflight failed: {e}")
    return PreflightResult(True, report.as_dict(), expected_bps=report.expected_throughput_bps())
