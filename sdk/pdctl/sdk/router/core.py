"""The router, composed: the instance set, the ledger and the dispatcher over them.

:class:`Router` only builds and starts its parts; each does one job in its own file:

* :class:`~pdctl.sdk.router.instanceset.InstanceSet` — instances, health, breakers,
  selection policy (:mod:`pdctl.sdk.router.policies`), operator control;
* :class:`~pdctl.sdk.router.dispatch.Dispatcher` — the entry of every request, with a
  strategy per router path (:mod:`~pdctl.sdk.router.textpath`,
  :mod:`~pdctl.sdk.router.tokens`), the leg sender (:mod:`~pdctl.sdk.router.legs`),
  the relay (:mod:`~pdctl.sdk.router.relay`) and the retry/migration decisions
  (:mod:`~pdctl.sdk.router.recovery`);
* :class:`~pdctl.sdk.router.ledger.Ledger` — timelines, history, finished metrics;
* :class:`~pdctl.sdk.router.lease.Lease` — an upstream slot, released exactly once.
"""

from __future__ import annotations

from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.router import tracing
from pdctl.sdk.router.dispatch import Dispatcher
from pdctl.sdk.router.instances import Breaker, Upstream
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.ledger import Ledger
from pdctl.sdk.router.release import KvReleases
from pdctl.sdk.router.replies import (
    JSON_HEADERS,
    ROUTER_MODES,
    Reply,
    RouteError,
    RouterMode,
    StreamReply,
    error_body,
    mode_of,
)
from pdctl.sdk.router.timeline import Timeline
from pdctl.sdk.spec import FleetSpec

__all__ = [
    "JSON_HEADERS",
    "ROUTER_MODES",
    "Breaker",
    "Reply",
    "RouteError",
    "Router",
    "RouterMode",
    "StreamReply",
    "Timeline",
    "Upstream",
    "error_body",
    "mode_of",
]


class Router:
    """Routes OpenAI-style requests over a fleet plan. Single event loop; no locks."""

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
        self.plan = plan
        self.instances = InstanceSet(spec, plan, mode=mode, health_interval_s=health_interval_s)
        self.settings = self.instances.settings
        self.served_name = self.instances.served_name
        self.metrics = self.instances.metrics
        self.registry = self.metrics.registry
        self.cache = self.instances.cache
        releases: KvReleases | None = None
        """For push fleets on pdctl's connector (router.release_kv_on_failure)."""
        ours = spec.fleet.mode == "push" and spec.fleet.connector == "pdctl"
        if ours and self.settings.release_kv_on_failure:
            prefills = [u.name for u in self.instances.prefills]
            releases = KvReleases(self.served_name, self.registry, prefills=prefills)
        self.releases = releases
        fleet = {"pdctl.fleet": spec.fleet.name}
        self.tracer = tracing.Tracer(self.settings.otlp_traces_url, **fleet)
        self.ledger = Ledger(
            self.metrics, self.instances, releases, history, self.instances.predictor
        )
        self.dispatcher = Dispatcher(self.instances, self.ledger, self.metrics, self.tracer)
        # what readers of the router look at most, under their own names
        self.upstreams = self.instances.upstreams
        self.prefills = self.instances.prefills
        self.decodes = self.instances.decodes
        self.history = self.ledger.history
        self.recent = self.ledger.recent

    @property
    def mode(self) -> RouterMode:
        return self.instances.mode

    async def start(self) -> None:
        self.instances.start()

    async def stop(self) -> None:
        if self.dispatcher.canary is not None:
            await self.dispatcher.canary.close()  # replays in flight are cancelled
        await self.ledger.close()  # sends the releases still pending first
        await self.instances.stop()
        await self.dispatcher.recovery.link.close()
        self.tracer.shutdown()
