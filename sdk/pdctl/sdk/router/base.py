"""The router's state: instances, health, selection, operator control, bookkeeping."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pdctl.sdk.fleetplan import FleetPlan, InstancePlan
from pdctl.sdk.pd import PrefillIdentity
from pdctl.sdk.router import tracing
from pdctl.sdk.router.instances import Breaker, Upstream, choose
from pdctl.sdk.router.release import KvReleases
from pdctl.sdk.router.replies import RouteError, RouterMode, mode_of
from pdctl.sdk.router.timeline import RouterMetrics, Timeline
from pdctl.sdk.router.upstream import Pools, UpstreamError
from pdctl.sdk.spec import FleetSpec, RouterSpec

if TYPE_CHECKING:
    from pdctl.sdk.router.cacheaware import CacheAware


UP_GRACE_S = 5.0
"""After the supervisor says an instance is up, failed health checks (other than a refused
connection) do not mark it down for this long."""


class RouterBase:
    """The router's state: its instances and their health, selection, operator control
    and bookkeeping. Single event loop; no locks."""

    def __init__(
        self,
        spec: FleetSpec,
        plan: FleetPlan,
        *,
        mode: RouterMode | None = None,
        history: int = 1000,
        health_interval_s: float = 2.0,
    ) -> None:
        self.spec = spec
        self.settings: RouterSpec = spec.router or RouterSpec()
        self.mode: RouterMode = mode or mode_of(spec)
        self.served_name = spec.model.effective_served_name
        self.pools = Pools()
        self.health_interval_s = health_interval_s
        self.upstreams: list[Upstream] = []
        for inst in plan.instances:
            self.upstreams.append(self._upstream(inst))
        self.prefills = [u for u in self.upstreams if u.role == "prefill"]
        self.decodes = [u for u in self.upstreams if u.role == "decode"]
        self.renders = [u for u in self.upstreams if u.role == "render"]
        if self.mode == "colocated":
            self.prefills = []
            self.decodes = [u for u in self.upstreams if u.role != "render"]
        elif not self.prefills or not self.decodes:
            raise ValueError(f"{self.mode} mode needs at least one prefill and one decode")
        self._rr = itertools.count()
        self.history: deque[Timeline] = deque(maxlen=history)
        self._health_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        """Set (and replaced) whenever an instance's health changes."""
        self._checking: dict[str, asyncio.Task[None]] = {}
        self.metrics = RouterMetrics(self.upstreams)
        self.tracer = tracing.Tracer(
            self.settings.otlp_traces_url, **{"pdctl.fleet": spec.fleet.name}
        )
        self.registry = self.metrics.registry
        self.releases: KvReleases | None = None
        """Set for push fleets on pdctl's connector (router.release_kv_on_failure)."""
        ours = spec.fleet.mode == "push" and spec.fleet.connector == "pdctl"
        if ours and self.settings.release_kv_on_failure:
            self.releases = KvReleases(self.served_name, self.registry)
        self.cache: CacheAware | None = None
        if self.settings.policy == "cache_aware":
            from pdctl.sdk.router.cacheaware import CacheAware

            self.cache = CacheAware(self, plan)

    def _upstream(self, inst: InstancePlan) -> Upstream:
        ident = PrefillIdentity.from_plan(inst) if inst.role == "prefill" else None
        return Upstream(inst.name, inst.role, inst.url, self.pools.get(inst.url), ident)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())
            if self.cache is not None:
                self.cache.start()

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            self._health_task = None
        if self.cache is not None:
            await self.cache.stop()
        if self.releases is not None:
            await self.releases.close()
        self.pools.close()
        self.tracer.shutdown()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(u) for u in self.upstreams))
            await asyncio.sleep(self.health_interval_s)

    async def _check(self, u: Upstream) -> None:
        refused = False
        try:
            async with asyncio.timeout(2.0):
                r = await u.pool.request("GET", "/health")
                await r.read()
            healthy = r.status == 200
        except UpstreamError as e:
            healthy, refused = False, e.connect
        except (TimeoutError, OSError):
            healthy = False
        if not healthy and not refused and time.monotonic() < u.trusted_until:
            # the supervisor said "up" moments ago: a slow answer from a server that has
            # just started does not overrule it (a refused connection does)
            return
        self._set(u, healthy)

    async def _recheck(self, u: Upstream) -> None:
        try:
            await self._check(u)
        finally:
            self._checking.pop(u.name, None)

    def _set(self, u: Upstream, healthy: bool) -> None:
        if u.healthy != healthy:
            u.healthy = healthy
            self._changed.set()
            self._changed = asyncio.Event()

    def health(self) -> tuple[bool, str]:
        roles = [("decode", self.decodes)] + ([("prefill", self.prefills)] if self.prefills else [])
        if self.settings.path == "tokens" and self.settings.render_fallback == "error":
            roles.append(("render", self.renders))
        for role, ups in roles:
            if not any(u.eligible() for u in ups):
                return False, f"no healthy {role} instance"
        return True, "ok"

    # ------------------------------------------------------------------ selection

    @property
    def cache_aware(self) -> bool:
        return self.cache is not None and self.settings.policy == "cache_aware"

    def select(
        self,
        pool: list[Upstream],
        exclude: tuple[Upstream, ...] = (),
        scores: dict[str, float] | None = None,
    ) -> Upstream:
        return choose(pool, self.settings.policy, self._rr, exclude, scores)

    async def acquire(
        self,
        pool: list[Upstream],
        tl: Timeline,
        exclude: tuple[Upstream, ...] = (),
        scores: dict[str, float] | None = None,
    ) -> Upstream:
        """:meth:`select`, but when no instance of the role is available, hold the
        request up to ``router.unavailable_wait_s`` for one to come back (re-checking the
        role's unhealthy instances meanwhile) before answering 503."""
        try:
            return self.select(pool, exclude, scores)
        except RouteError as e:
            wait = self.settings.unavailable_wait_s
            if e.status != 503 or wait <= 0 or all(u.drained for u in pool if u not in exclude):
                raise
            first = e
        t = time.perf_counter()
        deadline = t + wait
        while (left := deadline - time.perf_counter()) > 0:
            changed = self._changed
            for u in pool:
                if not u.healthy and u not in exclude and u.name not in self._checking:
                    self._checking[u.name] = asyncio.create_task(self._recheck(u))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.5)):
                    await changed.wait()
            with contextlib.suppress(RouteError):
                u = self.select(pool, exclude, scores)
                tl.note(f"waited {time.perf_counter() - t:.2f} s for a healthy {u.role}")
                return u
        tl.note(f"no healthy instance within router.unavailable_wait_s = {wait:g} s")
        raise RouteError(
            503, f"{first} (waited {wait:g} s: router.unavailable_wait_s)", "service_unavailable"
        )

    # ------------------------------------------------------------------ entry point

    def new_timeline(self, path: str, stream: bool, traceparent: str | None = None) -> Timeline:
        tl = Timeline(
            id=f"pdctl-{uuid.uuid4().hex}",
            mode=self.mode,
            path=path,
            stream=stream,
            received=time.time(),
            t0=time.perf_counter(),
        )
        tl.trace = self.tracer.begin(traceparent)
        return tl

    # ------------------------------------------------------------------ operator control

    def modes(self) -> tuple[RouterMode, ...]:
        """The modes this fleet's engines support: a push fleet can be dispatched
        concurrently or sequentially (the A/B); pull and colocated fleets have one."""
        if self.spec.fleet.mode == "push":
            return ("push", "push-sequential")
        return (self.mode,)

    def set_mode(self, mode: str) -> RouterMode:
        for m in self.modes():
            if m == mode:
                self.mode = m
                return m
        raise ValueError(
            f"mode {mode!r} is not available for this {self.spec.fleet.mode} fleet "
            f"(choose one of: {', '.join(self.modes())})"
        )

    def policies(self) -> tuple[str, ...]:
        """The selection policies this router can switch to (cache_aware needs the index
        it was started with)."""
        base = ("round_robin", "least_loaded", "power_of_two")
        return (*base, "cache_aware") if self.cache is not None else base

    def set_policy(self, policy: str) -> str:
        if policy not in self.policies():
            raise ValueError(
                f"policy {policy!r} is not available here (choose one of: "
                f"{', '.join(self.policies())}; cache_aware needs router.policy = "
                "'cache_aware' at start)"
            )
        self.settings = self.settings.model_copy(update={"policy": policy})
        return policy

    def upstream(self, name: str) -> Upstream:
        """The instance called ``name``; KeyError when there is none."""
        for u in self.upstreams:
            if u.name == name:
                return u
        raise KeyError(name)

    def set_drained(self, name: str, drained: bool) -> Upstream:
        u = self.upstream(name)
        u.drained = drained
        return u

    def set_health(self, name: str, healthy: bool) -> Upstream:
        """The supervisor says an instance is up (restarted and ready) or down (stopped,
        failed, restarting): take it at its word now instead of at the next health check.
        An instance said to be up also gets a fresh circuit breaker."""
        u = self.upstream(name)
        if healthy:
            u.breaker = Breaker()
        u.trusted_until = time.monotonic() + UP_GRACE_S if healthy else 0.0
        self._set(u, healthy)
        return u

    def control_state(self) -> dict[str, Any]:
        extra = {"kv_index": self.cache.summary()} if self.cache is not None else {}
        return {
            **extra,
            "policy": self.settings.policy,
            "mode": self.mode,
            "modes": list(self.modes()),
            "instances": [
                {
                    "name": u.name,
                    "role": u.role,
                    "url": u.url,
                    "healthy": u.healthy,
                    "drained": u.drained,
                    "in_flight": u.outstanding,
                    "breaker": u.breaker.state,
                }
                for u in self.upstreams
            ],
        }

    # ------------------------------------------------------------------ bookkeeping

    def finish(self, tl: Timeline, outcome: str, status: int, error: str | None = None) -> None:
        if tl.done is not None:
            return
        tl.done = tl.mark()
        tl.outcome = outcome
        tl.status = status
        if error:
            tl.error = error
        self.metrics.finished(tl, self.mode, outcome)
        tracing.finished(tl)
        self.history.append(tl)
        if outcome != "ok" and tl.kv_on is not None and self.releases is not None:
            # decode did not read the KV a prefill may hold for this request: free it now
            prefill, rid = tl.kv_on
            self.releases.ask(prefill, (rid,))
            tl.note(f"asked prefill {prefill.name} to free the request's KV")

    def recent(
        self, limit: int = 100, match: Callable[[Timeline], bool] | None = None
    ) -> list[dict[str, Any]]:
        items = [t for t in reversed(self.history) if match is None or match(t)]
        return [t.as_dict() for t in items[:limit]]
