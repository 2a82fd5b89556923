"""The targets a :class:`~pdctl.sdk.metrics.monitor.FleetMonitor` scrapes: from a spec's
plan, or from bare endpoint URLs (a fleet pdctl did not launch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.kube import PodDiscovery, discovery
from pdctl.sdk.metrics.snapshot import Target
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import http_url

__all__ = ["base_url", "discovered", "discovery_of", "targets_for", "targets_from_urls"]


def targets_for(spec: FleetSpec, plan: FleetPlan) -> list[Target]:
    out = [Target(i.name, i.role, i.url, i.tp) for i in plan.instances]
    if spec.router is not None:
        out.append(Target("router", "router", http_url(spec.router.host, spec.router.port)))
    return out


def targets_from_urls(
    prefill: Iterable[str] = (),
    decode: Iterable[str] = (),
    router: str | None = None,
    colocated: Iterable[str] = (),
) -> list[Target]:
    """Targets for a fleet given by its endpoints alone (no spec): ``prefill-0``,
    ``prefill-1``, … in the order given, then ``router``."""
    out: list[Target] = []
    for role, urls in (("prefill", prefill), ("decode", decode), ("colocated", colocated)):
        out.extend(Target(f"{role}-{n}", role, base_url(u)) for n, u in enumerate(urls))
    if router:
        out.append(Target("router", "router", base_url(router)))
    if not out:
        raise PdctlError("no endpoints: give at least one --prefill, --decode or --router URL")
    return out


def base_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if u.endswith("/metrics"):
        u = u[: -len("/metrics")]
    if "://" not in u:
        u = "http://" + u
    return u


DISCOVERY_KEYWORDS = (
    "port",
    "kubeconfig",
    "context",
    "config",
    "transport_k8s",
    "watch_timeout_s",
    "backoff_s",
    "max_backoff_s",
)
"""What of ``FleetMonitor.from_kubernetes``'s keywords belongs to the discovery."""


def discovery_of(
    namespace: str | None,
    prefill: str | None,
    decode: str | None,
    router: str | None,
    preset: str | None,
    kw: dict[str, Any],
) -> PodDiscovery:
    """The discovery of ``from_kubernetes``: takes its keywords out of ``kw``."""
    mine = {k: kw.pop(k) for k in DISCOVERY_KEYWORDS if k in kw}
    if "transport_k8s" in mine:
        mine["transport"] = mine.pop("transport_k8s")
    return discovery(namespace, prefill, decode, router, preset, **mine)


def discovered(found: PodDiscovery, static: Iterable[Target] = ()) -> list[Target]:
    """The discovery's Ready pods as targets, then the ``static`` ones not among them."""
    out = [Target(e.name, e.role, e.url) for e in found.endpoints()]
    names = {t.name for t in out}
    return out + [t for t in static if t.name not in names]
