"""The instance set: the fleet's instances as the router sees them — their pools, health
checks and circuit breakers, the selection policy, and operator control (mode, drain,
the supervisor's up/down word). Single event loop; no locks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterator
from typing import Any

from pdctl.sdk.fleetplan import FleetPlan, InstancePlan
from pdctl.sdk.pd import PrefillIdentity
from pdctl.sdk.router.httpclient import Pools, UpstreamError
from pdctl.sdk.router.instances import Breaker, Upstream
from pdctl.sdk.router.policies import Policy, make_policy
from pdctl.sdk.router.policies.cache_aware import CacheAware
from pdctl.sdk.router.predictor import Predictor
from pdctl.sdk.router.replies import RouteError, RouterMode, mode_of
from pdctl.sdk.router.sidechannel import SideChannels
from pdctl.sdk.router.timeline import RouterMetrics, Timeline
from pdctl.sdk.spec import FleetSpec, RouterSpec

UP_GRACE_S = 5.0
"""After the supervisor says an instance is up, failed health checks (other than a refused
connection) do not mark it down for this long."""
PROBE_TIMEOUT_S = 2.0
"""How long a health check waits for ``/health`` to answer."""


class InstanceSet:
    """The instances, their health and selection, and operator control."""

    def __init__(
        self,
        spec: FleetSpec,
        plan: FleetPlan,
        *,
        mode: RouterMode | None = None,
        health_interval_s: float = 2.0,
    ) -> None:
        self.spec = spec
        self.settings: RouterSpec = spec.router or RouterSpec()
        self.mode: RouterMode = mode or mode_of(spec)
        self.served_name = spec.model.effective_served_name
        self.pools = Pools()
        self.health_interval_s = health_interval_s
        self.upstreams = [self._upstream(inst) for inst in plan.instances]
        self.tp = {inst.name: inst.tp for inst in plan.instances}
        """Instance name → tensor-parallel size (the canary compares by it)."""
        self.prefills = [u for u in self.upstreams if u.role == "prefill"]
        self.decodes = [u for u in self.upstreams if u.role == "decode"]
        self.renders = [u for u in self.upstreams if u.role == "render"]
        if self.mode == "colocated":
            self.prefills = []
            self.decodes = [u for u in self.upstreams if u.role != "render"]
        elif not self.prefills or not self.decodes:
            raise ValueError(f"{self.mode} mode needs at least one prefill and one decode")
        self.metrics = RouterMetrics(self.upstreams)
        """The router's metrics (per instance, and the decisions this set makes)."""
        colocated = self.mode == "colocated"
        self.metrics.prime(
            self.modes(),
            ("colocated",) if colocated else ("disaggregated", "decode-only"),
            ("tokens", "text-fallback") if self.settings.path == "tokens" else ("text",),
        )
        self.policy: Policy = make_policy(self.settings.policy)
        self.predictor = Predictor(self.settings.admission, self.metrics.registry)
        """Each P->D pair's TTFT model, and SLO routing (:mod:`.predictor`)."""
        self.cache: CacheAware | None = None
        """The prefix index, made when the router starts with ``cache_aware``."""
        if self.settings.policy == "cache_aware":
            self.cache = CacheAware(self, plan, self.metrics.registry)
        self.cache_aware = self.cache
        """The prefix index while the policy scores by it (None otherwise)."""
        self._health_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        """Set (and replaced) whenever an instance's health changes."""
        self._checking: dict[str, asyncio.Task[None]] = {}
        self.side_channels = SideChannels()
        """Which prefills' NIXL side channels were seen accepting (:mod:`.sidechannel`)."""
        self.check_rounds = 0
        """Health-check rounds over every instance finished since start."""
        self._ready = False

    def _upstream(self, inst: InstancePlan) -> Upstream:
        ident = PrefillIdentity.from_plan(inst) if inst.role == "prefill" else None
        return Upstream(inst.name, inst.role, inst.url, self.pools.get(inst.url), ident)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
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
        self.pools.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check(u) for u in self.upstreams))
            self.check_rounds += 1
            await asyncio.sleep(self.health_interval_s)

    async def probe(self, u: Upstream) -> tuple[bool, bool]:
        """``u``'s ``GET /health`` now: (healthy, decisive). Decisive is an answer or a
        refused connection (vLLM answers 503 once its engine is dead); no answer within
        :data:`PROBE_TIMEOUT_S` (a busy server) is not. A prefill whose API server still
        answers 200 while its NIXL side channel, seen accepting before, now refuses is
        down, decisively: its engine is gone and the server has not noticed yet
        (:mod:`.sidechannel`)."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                r = await u.pool.request("GET", "/health")
                await r.read()
            if r.status == 200 and await self.side_channels.gone(u):
                return False, True
            return r.status == 200, True
        except UpstreamError as e:
            return False, e.connect
        except (TimeoutError, OSError):
            return False, False

    async def check(self, u: Upstream) -> None:
        """One health check of ``u`` (``GET /health``), recorded."""
        healthy, decisive = await self.probe(u)
        if not healthy and not decisive and time.monotonic() < u.trusted_until:
            # the supervisor said "up" moments ago: a slow answer from a server that has
            # just started does not overrule it; a refused connection does, and so does
            # an answer (vLLM's 503: its engine died, e.g. right after its restart)
            return
        self.mark(u, healthy)

    def recheck(self, u: Upstream) -> None:
        """Check ``u``'s health now, in the background (one check at a time per instance)."""
        if u.name not in self._checking:
            self._checking[u.name] = asyncio.create_task(self._recheck(u))

    async def _recheck(self, u: Upstream) -> None:
        try:
            await self.check(u)
        finally:
            self._checking.pop(u.name, None)

    def mark(self, u: Upstream, healthy: bool) -> None:
        """Record ``u``'s health (down after a failed leg, up or down after a check)."""
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

    def ready(self) -> tuple[bool, str]:
        """``/ready``: whether the router has checked every instance and found each role it
        needs healthy, once since it started; from then on it stays ready (an instance
        restarting later is the fleet's state, which ``/health`` reports: taking every
        router out of its Service then would only turn waits into refused connections)."""
        if self._ready:
            return True, "ok"
        if self.check_rounds == 0:
            return False, "waiting for the first health check of the instances"
        ok, why = self.health()
        if ok:
            self._ready = True
            return True, "ok"
        return False, f"waiting for instances: {why}"

    # ------------------------------------------------------------------ selection

    def select(
        self,
        pool: list[Upstream],
        exclude: tuple[Upstream, ...] = (),
        scores: dict[str, float] | None = None,
    ) -> Upstream:
        return self.policy.choose(pool, exclude, scores)

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
                if not u.healthy and u not in exclude:
                    self.recheck(u)
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

    async def place(
        self, tl: Timeline, keys: list[int] | None, prompt_len: int, decode_only: bool = False
    ) -> tuple[Upstream, Upstream | None]:
        """The request's decode and prefill (None: decode alone) by the policy, and the
        decision recorded on ``tl``. ``keys``, the prompt's block keys (cache-aware with
        the prompt's token ids only; ``prompt_len`` tokens long), score the instances by
        prefix; a prompt with at most ``router.disaggregate_min_uncached_tokens`` tokens
        not cached on the chosen decode goes to decode alone."""
        cache = self.cache_aware if keys is not None else None
        blocks = prompt_len // cache.block_size if cache is not None else 0
        ks = keys or []
        alone = self.mode == "colocated" or decode_only
        d_scores = p_scores = None
        uncached: dict[str, int] = {}
        if cache is not None:
            held_by = cache.overlaps(self.decodes, ks)  # once: the scores and the threshold
            d_scores = cache.scores(self.decodes, ks, blocks, held_by)
            limit = self.settings.disaggregate_min_uncached_tokens
            if not alone:
                p_scores = cache.scores(self.prefills, ks, blocks)
                if limit:
                    for n, held in held_by.items():
                        if (left := prompt_len - held * cache.block_size) <= limit:
                            uncached[n] = left
        try:
            d, p = self.policy.place(
                self.decodes, None if alone else self.prefills, d_scores, p_scores, uncached
            )
        except RouteError:  # a role has no instance now: wait for one, role by role
            d = await self.acquire(self.decodes, tl, scores=d_scores)
            p = None
            if not alone and d.name not in uncached:
                p = await self.acquire(self.prefills, tl, scores=p_scores)
        if tl.ttft_due is not None and (alone or p is not None):
            d, p = self.predictor.steer(tl, (d, p), self.pairs(alone, uncached))
        self.predictor.record(tl, d, p)
        tl.decode = d.name
        if self.mode == "colocated":
            tl.decision = "colocated"
        elif decode_only:
            tl.decision = "decode-only"
        elif d.name in uncached:
            tl.decision = "decode-only"
            tl.note(f"{uncached[d.name]} uncached tokens on {d.name}: decode alone")
        elif tl.decision is None:
            tl.decision = "disaggregated"
        self.metrics.decisions.inc(tl.decision, tl.route_path)
        if p is not None:
            tl.prefill = p.name
        if cache is not None and keys is not None:
            cache.routed(d if p is None else p, keys, tl)  # where the prompt is computed
        return d, p

    def pairs(
        self, alone: bool = False, skip: Collection[str] = ()
    ) -> Iterator[tuple[Upstream, Upstream | None]]:
        """The (decode, prefill) pairs a request could be placed on now: every eligible,
        undrained decode (not in ``skip``) with every such prefill, or alone."""
        decodes = [u for u in self.decodes if u.eligible() and not u.drained and u.name not in skip]
        if alone or self.mode == "colocated":
            yield from ((d, None) for d in decodes)
            return
        prefills = [u for u in self.prefills if u.eligible() and not u.drained]
        yield from ((d, p) for d in decodes for p in prefills)

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
        self.policy = make_policy(policy, self.policy.turns)
        self.cache_aware = self.cache if self.policy.uses_scores else None
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
        self.mark(u, healthy)
        return u

    def apply(self, setting: str, req: dict[str, Any]) -> tuple[int, str, str] | None:
        """Apply one control request (``setting``: the endpoint's last part: mode, policy,
        instance, drain; ``req``: its JSON body); None when done, else the refusal (HTTP
        status, message, error type). Every worker of a router applies the same request
        through here."""
        setter = {"policy": self.set_policy, "mode": self.set_mode}.get(setting)
        if setter is not None:
            try:
                setter(str(req.get(setting)))
            except ValueError as e:
                return 400, str(e), "invalid_request_error"
            return None
        name = req.get("instance")
        try:
            if setting == "instance":
                event = req.get("event")
                if event not in ("up", "down"):
                    return 400, '\'event\' must be "up" or "down"', "invalid_request_error"
                self.set_health(str(name), event == "up")
            elif setting == "drain":
                drain = req.get("drain", True)
                if not isinstance(drain, bool):
                    return 400, "'drain' must be true or false", "invalid_request_error"
                self.set_drained(str(name), drain)
            else:
                return 404, f"no control setting {setting!r}", "not_found_error"
        except KeyError:
            names = ", ".join(u.name for u in self.upstreams)
            return 404, f"no instance named {name!r} (have: {names})", "not_found_error"
        return None

    def control_state(self) -> dict[str, Any]:
        extra = {"kv_index": self.cache.summary()} if self.cache is not None else {}
        return {
            **extra,
            "policy": self.policy.name,
            "mode": self.mode,
            "predictor": self.predictor.state(),
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
