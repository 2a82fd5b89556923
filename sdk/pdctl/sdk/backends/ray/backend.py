"""The Ray backend: each instance (and the router) as a detached Ray actor on a chosen node.

``up`` places every group on a live node that has what it asks for
(:mod:`~pdctl.sdk.backends.ray.placement`), rewrites loopback hosts to the node's address,
and creates one actor per instance pinned to its node; each actor starts its instance under
the shepherd (:mod:`~pdctl.sdk.backends.ray.actor`). The fleet then belongs to the cluster:
``pdctl`` may exit, and ``status``/``down`` find the actors again by name.

An instance whose actor is gone — its node died, its worker was killed — is reported
``gone`` with the reason; its server no longer answers, so the monitor shows it DOWN.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, ClassVar

from pdctl.sdk.backends.base import DEFAULT_GRACE, DEFAULT_READY_TIMEOUT, BackendStatus
from pdctl.sdk.backends.ray.actor import ActorRecord
from pdctl.sdk.backends.ray.cluster import CALL_TIMEOUT_S, RayCluster
from pdctl.sdk.backends.ray.placement import (
    ROUTER,
    Node,
    Placement,
    demands,
    place,
    ray_settings,
    resolve,
)
from pdctl.sdk.errors import FleetRunningError, LaunchError, NotRunningError
from pdctl.sdk.fleet.events import InstanceStatus
from pdctl.sdk.fleetplan import FleetPlan, build_plan, router_plan
from pdctl.sdk.lint import lint, require_clean
from pdctl.sdk.spec import FleetSpec

POLL_S = 1.0


class RayBackend:
    """A fleet as named, detached actors in one namespace of a Ray cluster."""

    kind: ClassVar[str] = "ray"

    def __init__(
        self,
        spec: FleetSpec,
        *,
        source: str = "<spec>",
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        cluster: RayCluster | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.spec = spec
        self.source = source
        self.settings = ray_settings(spec)
        self.ready_timeout = ready_timeout
        self.grace = grace
        self.cluster = cluster or RayCluster(self.settings.address, self.settings.namespace)
        self.poll_s = poll_s
        self.fleet = spec.fleet.name
        self._record: ActorRecord | None = None
        self._answered: set[str] = set()

    @property
    def where(self) -> str:
        return f"{self.cluster.address} (namespace {self.settings.namespace})"

    # ------------------------------------------------------------------ up

    async def up(self, *, wait: bool = True) -> None:
        require_clean(lint(self.spec, check_bound_ports=False))
        await asyncio.to_thread(self._refuse_if_running)
        try:
            await asyncio.to_thread(self._start)
            if wait:
                await self.wait_ready()
        except BaseException:
            # no controller would ever retry: leave nothing half-started behind
            with contextlib.suppress(Exception):
                await asyncio.shield(self.down())
            raise

    def _refuse_if_running(self) -> None:
        running = self.cluster.actor_names(self.fleet)
        if running:
            raise FleetRunningError(
                f"fleet {self.fleet!r} is already running on Ray {self.where} "
                f"({', '.join(running)}); see `pdctl status --backend ray`, or stop it with "
                "`pdctl down --backend ray`"
            )

    def plan_for(self, nodes: list[Node]) -> tuple[Placement, FleetSpec, FleetPlan]:
        """Placement, resolved spec and its launch plan for these nodes (lint errors of the
        resolved spec, e.g. two groups on one node with the same ports, refuse)."""
        placement = place(self.spec, nodes)
        resolved = resolve(self.spec, placement)
        return placement, resolved, require_clean(lint(resolved, check_bound_ports=False))

    def _start(self) -> None:
        placement, resolved, _plan = self.plan_for(self.cluster.nodes())
        groups = demands(self.spec)
        where = {i: placement.node_of(d.group).node_id for d in groups for i in d.instances}
        spec_json = resolved.model_dump_json()
        handles: dict[str, Any] = {}
        for d in groups:
            node = placement.node_of(d.group)
            for name in d.instances:
                rec = ActorRecord(
                    self.fleet, name, spec_json, node.node_id, node.ip, self.grace, where
                )
                self._record = self._record or rec
                handles[name] = self.cluster.create(
                    self.fleet, name, rec.as_dict(), dict(d.per_instance)
                )
        answers = self.cluster.call(
            {n: h.start.remote() for n, h in handles.items()}, self.settings.start_timeout_s
        )
        problems = []
        for name, a in answers.items():
            if isinstance(a, BaseException):
                problems.append(f"{name} on {_node_ip(where[name], placement)}: {_short(a)}")
            elif a.get("error"):
                problems.append(f"{name}: {a['error']}")
            else:
                self._answered.add(name)
        if problems:
            raise LaunchError(
                f"fleet {self.fleet!r} could not start on Ray {self.where}: "
                + "; ".join(problems)
                + f". An actor that Ray cannot schedule within backend.ray.start_timeout_s "
                f"({self.settings.start_timeout_s:g} s) means its node lacks free resources"
            )

    async def wait_ready(self, limit_s: float | None = None) -> BackendStatus:
        """Poll until every instance is ready; :class:`LaunchError` with the log tail when
        one exits first, or naming the others when ``limit_s`` passes."""
        limit = self.ready_timeout if limit_s is None else limit_s
        deadline = time.monotonic() + limit
        while True:
            st = await self.status()
            if st.all_ready:
                return st
            for i in st.instances:
                if i.state in ("exited", "gone"):
                    lines = "\n".join("  " + ln for ln in i.log_tail)
                    raise LaunchError(
                        f"{i.name} {i.state} during start-up (code {i.exit_code}); "
                        f"log {i.log}:\n{lines}"
                    )
            if time.monotonic() >= deadline:
                waiting = "; ".join(
                    f"{i.name} {i.state}" + (f" ({i.log_tail[-1]})" if i.log_tail else "")
                    for i in st.not_ready()
                )
                raise LaunchError(
                    f"fleet {self.fleet!r} not ready after {limit:g} s on Ray {self.where}: "
                    f"{waiting}; raise --timeout if the nodes are slow"
                )
            await asyncio.sleep(self.poll_s)

    # ------------------------------------------------------------------ down

    async def down(self) -> str:
        return await asyncio.to_thread(self._down)

    def _down(self) -> str:
        c = self.cluster
        handles = {n: c.actor(self.fleet, n) for n in c.actor_names(self.fleet)}
        live = {n: h for n, h in handles.items() if h is not None}
        self._record = None
        if not live:
            return f"nothing of fleet {self.fleet!r} on Ray {self.where}"
        c.call({n: h.stop.remote() for n, h in live.items()}, self.grace + 15)
        for h in live.values():
            c.kill(h)
        return f"stopped {len(live)} actor(s) on Ray {self.where}"

    # ------------------------------------------------------------------ status / endpoints

    def record(self) -> ActorRecord | None:
        """The fleet's record (resolved spec, placement) from any live actor, or None."""
        if self._record is not None:
            return self._record
        c = self.cluster
        handles = [c.actor(self.fleet, n) for n in c.actor_names(self.fleet)]
        live = {str(i): h for i, h in enumerate(handles) if h is not None}
        answers = c.call({k: h.describe.remote() for k, h in live.items()}, CALL_TIMEOUT_S)
        for a in answers.values():
            if isinstance(a, dict):
                self._record = ActorRecord(**a)
                break
        return self._record

    def resolved(self) -> FleetSpec:
        """The spec as it runs: hosts are node addresses (the spec itself when the fleet
        cannot be found on the cluster). Monitor a Ray fleet with this spec."""
        with contextlib.suppress(Exception):
            rec = self.record()
            if rec is not None:
                return FleetSpec.model_validate_json(rec.spec_json)
        return self.spec

    def endpoints(self) -> FleetPlan:
        """The plan with each instance at its node's address."""
        return build_plan(self.resolved())

    async def status(self) -> BackendStatus:
        return await asyncio.to_thread(self._status)

    def _status(self) -> BackendStatus:
        c = self.cluster
        rec = self.record()
        if rec is None:
            raise NotRunningError(
                f"no fleet named {self.fleet!r} on Ray {self.where}; start it with "
                "`pdctl up --backend ray`"
            )
        resolved = FleetSpec.model_validate_json(rec.spec_json)
        rows: list[tuple[str, str, str]] = [
            (i.name, i.role, i.url) for i in build_plan(resolved).instances
        ]
        router = router_plan(resolved, ())
        if router is not None:
            rows.append((ROUTER, ROUTER, router.url))
        handles = {name: c.actor(self.fleet, name) for name, _r, _u in rows}
        answers = c.call(
            {n: h.info.remote() for n, h in handles.items() if h is not None}, CALL_TIMEOUT_S
        )
        nodes = {n.node_id: n for n in c.nodes()}
        now = time.time()
        out = []
        for name, role, url in rows:
            a = answers.get(name)
            if isinstance(a, dict):
                self._answered.add(name)
                out.append(_from_info(name, role, url, a, now))
                continue
            node = nodes.get(rec.nodes.get(name, ""))
            out.append(self._missing(name, role, url, a, node))
        return BackendStatus(self.fleet, self.kind, self.where, out)

    def _missing(
        self, name: str, role: str, url: str, err: object, node: Node | None
    ) -> InstanceStatus:
        """An instance whose actor did not answer: gone (and why), or not answering."""
        if node is not None and not node.alive:
            state = "gone"
            why = f"its node {node.label} died" + (f": {node.death}" if node.death else "")
        elif isinstance(err, TimeoutError) or type(err).__name__ == "ActorUnavailableError":
            # not answering is not dead yet: its node may be back, or about to be declared dead
            state = "unhealthy" if name in self._answered else "starting"
            why = f"its Ray actor does not answer ({_short(err)})"
        else:
            state = "gone"
            why = f"its Ray actor is gone ({_short(err) if err else 'killed or never started'})"
        return InstanceStatus(
            name=name,
            role=role,
            url=url,
            state=state,
            pid=None,
            exit_code=None,
            uptime_s=None,
            restarts=0,
            log=f"ray actor {name!r} in namespace {self.settings.namespace}",
            log_tail=(why,),
        )


def _from_info(name: str, role: str, url: str, info: dict[str, Any], now: float) -> InstanceStatus:
    state = str(info.get("state", "starting"))
    started = info.get("started_at")
    tail = tuple(info.get("log_tail") or ())
    why = str(info.get("why") or "")
    if not tail and why and state != "ready":
        tail = (why,)
    running = state not in ("exited", "stopped", "backoff", "failed")
    nxt = info.get("next_restart_at")
    return InstanceStatus(
        name=name,
        role=role,
        url=url,
        state=state,
        pid=info.get("pid"),
        exit_code=info.get("exit_code"),
        uptime_s=now - float(started) if running and started else None,
        restarts=int(info.get("restarts") or 0),
        log=str(info.get("log", "")),
        log_tail=tail,
        restart_policy=str(info.get("restart_policy") or ""),
        last_restart_at=info.get("last_restart_at"),
        next_restart_in_s=None if nxt is None else max(0.0, float(nxt) - now),
        last_failure=info.get("last_failure"),
    )


def _node_ip(node_id: str, placement: Placement) -> str:
    for n in placement.nodes.values():
        if n.node_id == node_id:
            return n.label
    return node_id[:8]


def _short(e: object) -> str:
    """The first line of an error (Ray's carry tracebacks)."""
    e = getattr(e, "cause", None) or e  # a RayTaskError wraps what the actor raised
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
