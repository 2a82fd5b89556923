"""The Kubernetes backend: apply, read and delete a fleet's objects with ``kubectl``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import ClassVar

from pdctl.sdk import k8slabels
from pdctl.sdk.backends.base import DEFAULT_READY_TIMEOUT, BackendError, BackendStatus
from pdctl.sdk.backends.k8s import names
from pdctl.sdk.backends.k8s.kubectl import Kubectl, KubectlError
from pdctl.sdk.backends.k8s.manifests import Obj, build_manifests, cluster_plan, to_json
from pdctl.sdk.backends.k8s.status import by_instance, instance_status
from pdctl.sdk.errors import LaunchError, NotRunningError
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.lint import lint, require_clean
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import http_url

LWS_RELEASES = "https://github.com/kubernetes-sigs/lws/releases"
BASE_KINDS = (
    "deployments.apps",
    "services",
    "configmaps",
    "networkpolicies.networking.k8s.io",
    "poddisruptionbudgets.policy",
)
POLL_S = 5.0


class K8sBackend:
    """A fleet as Deployments/LeaderWorkerSets, Services and a router in one namespace."""

    kind: ClassVar[str] = "k8s"

    def __init__(
        self,
        spec: FleetSpec,
        *,
        source: str = "<spec>",
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        kubectl: Kubectl | None = None,
        clock: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
    ) -> None:
        self.spec = spec
        self.source = source
        self.settings = k8slabels.k8s_settings(spec)
        self.ready_timeout = ready_timeout
        self.kubectl = kubectl or Kubectl(self.settings.namespace, self.settings.context)
        self.clock = clock
        self.poll_s = poll_s
        self.selector = k8slabels.fleet_selector(spec)

    @property
    def where(self) -> str:
        return f"{self.kubectl.context or 'current context'}/{self.settings.namespace}"

    # ------------------------------------------------------------------ up

    def manifests(self) -> list[Obj]:
        """What :meth:`up` applies (lint errors refuse, as the local launcher does)."""
        plan = require_clean(lint(self.spec, check_bound_ports=False))
        return build_manifests(self.spec, plan)

    async def up(self, *, wait: bool = True) -> None:
        docs = self.manifests()
        await asyncio.to_thread(self._apply, docs)
        if wait:
            await self.wait_ready()

    def _apply(self, docs: list[Obj]) -> None:
        context = self.kubectl.current_context()
        lws = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "LeaderWorkerSet")
        has_lws = self.kubectl.has_api(names.LWS_RESOURCE)
        if lws and not has_lws:
            raise BackendError(
                f"{', '.join(lws)} span nodes and need LeaderWorkerSet, which context "
                f"{context!r} does not serve: install it ({LWS_RELEASES}, `kubectl apply "
                "--server-side -f .../manifests.yaml`), or raise backend.k8s.gpus_per_node"
            )
        self.kubectl.apply(to_json(docs))
        # objects of an earlier, larger version of the spec would keep running: remove them
        wanted = {(d["kind"], d["metadata"]["name"]) for d in docs}
        stale = [
            f"{o['kind'].lower()}/{o['metadata']['name']}"
            for o in self.kubectl.get(self._kinds(has_lws), self.selector)
            if (o.get("kind"), o.get("metadata", {}).get("name")) not in wanted
        ]
        if stale:
            self.kubectl.delete(sorted(stale))

    def _kinds(self, has_lws: bool) -> list[str]:
        return [*BASE_KINDS, *([names.LWS_RESOURCE] if has_lws else [])]

    async def wait_ready(self, limit_s: float | None = None) -> BackendStatus:
        """Poll until every instance is ready; a :class:`LaunchError` naming the others
        when ``limit_s`` passes (the cluster keeps trying: nothing is torn down)."""
        deadline = self.clock() + (self.ready_timeout if limit_s is None else limit_s)
        while True:
            st = await self.status()
            if st.all_ready:
                return st
            if self.clock() >= deadline:
                waiting = "; ".join(
                    f"{i.name} {i.state}" + (f" ({i.log_tail[0]})" if i.log_tail else "")
                    for i in st.not_ready()
                )
                raise LaunchError(
                    f"fleet {self.spec.fleet.name!r} is not ready in {self.where}: {waiting}. "
                    "The cluster keeps trying; follow it with `pdctl status --backend k8s`, "
                    "remove it with `pdctl down --backend k8s`"
                )
            await asyncio.sleep(self.poll_s)

    # ------------------------------------------------------------------ down / status

    async def down(self) -> str:
        def delete() -> list[str]:
            self.kubectl.current_context()
            kinds = self._kinds(self.kubectl.has_api(names.LWS_RESOURCE))
            return self.kubectl.delete(kinds, self.selector)

        gone = await asyncio.to_thread(delete)
        if not gone:
            return f"nothing of fleet {self.spec.fleet.name!r} in {self.where}"
        return f"deleted {len(gone)} object(s) in {self.where}"

    async def status(self) -> BackendStatus:
        def read() -> list[Obj]:
            self.kubectl.current_context()
            kinds = ["pods", *self._kinds(self.kubectl.has_api(names.LWS_RESOURCE))]
            return self.kubectl.get(kinds, self.selector)

        objects = await asyncio.to_thread(read)
        if not objects:
            raise NotRunningError(
                f"no fleet named {self.spec.fleet.name!r} in {self.where} "
                f"(nothing labelled {self.selector}); start it with `pdctl up --backend k8s`"
            )
        grouped = by_instance(objects)
        now = self.clock()
        plan = self.endpoints()
        rows: list[tuple[str, str, str]] = [(i.name, i.role, i.url) for i in plan.instances]
        if plan.router is not None:
            r = plan.router
            rows.append((names.ROUTER, names.ROUTER, http_url(r.host, r.port)))
        return BackendStatus(
            self.spec.fleet.name,
            self.kind,
            self.where,
            [
                instance_status(
                    name, role, url, grouped.get(name, []), now=now, log_hint=self._logs(name)
                )
                for name, role, url in rows
            ],
        )

    def _logs(self, instance: str) -> str:
        """The command that shows an instance's log (the leader's, for a group)."""
        ns = self.settings.namespace
        ctx = f" --context {self.kubectl.context}" if self.kubectl.context else ""
        sel = f"{k8slabels.FLEET}={self.spec.fleet.name},{k8slabels.INSTANCE}={instance}"
        return f"kubectl{ctx} -n {ns} logs -l {sel} --tail=100"

    def endpoints(self) -> FleetPlan:
        return cluster_plan(self.spec)


__all__ = ["K8sBackend", "KubectlError"]
