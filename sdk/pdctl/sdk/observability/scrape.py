"""Prometheus scrape configuration for a fleet: every instance and the router.

Every target carries the labels ``fleet``, ``role``, ``group`` and ``instance`` (the
pdctl instance name, replacing Prometheus' default ``host:port``), so dashboards and
alert rules select by role and name what the terminal UI names.

The router's own series label their upstream with ``instance``/``role``; Prometheus
keeps the target's labels and renames those to ``exported_instance``/``exported_role``
(``honor_labels`` stays false), which is what the router dashboard queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdctl.sdk import k8slabels
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.spec import FleetSpec

LABELS = ("fleet", "role", "group", "instance")
DEFAULT_INTERVAL = "5s"


@dataclass(frozen=True)
class ScrapeTarget:
    address: str
    """host:port"""
    fleet: str
    role: str
    group: str
    instance: str

    @property
    def labels(self) -> dict[str, str]:
        return {
            "fleet": self.fleet,
            "role": self.role,
            "group": self.group,
            "instance": self.instance,
        }


def _address(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


def scrape_targets(spec: FleetSpec, plan: FleetPlan) -> list[ScrapeTarget]:
    """Every instance of the plan (prefill, decode, render servers), then the router."""
    fleet = spec.fleet.name
    out = [
        ScrapeTarget(_address(i.host, i.http_port), fleet, i.role, i.group, i.name)
        for i in plan.instances
    ]
    if spec.router is not None:
        out.append(
            ScrapeTarget(
                _address(spec.router.host, spec.router.port), fleet, "router", "router", "router"
            )
        )
    return out


def job_name(spec: FleetSpec) -> str:
    return f"pdctl-{spec.fleet.name}"


def file_sd(targets: list[ScrapeTarget]) -> list[dict[str, Any]]:
    """Prometheus ``file_sd_configs`` content: one group per target."""
    return [{"targets": [t.address], "labels": t.labels} for t in targets]


def scrape_config(
    spec: FleetSpec,
    plan: FleetPlan,
    *,
    interval: str = DEFAULT_INTERVAL,
    rule_files: list[str] | None = None,
) -> dict[str, Any]:
    """A whole ``prometheus.yml``: global intervals, the rule files, one job per fleet."""
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
    }
    if rule_files:
        cfg["rule_files"] = list(rule_files)
    cfg["scrape_configs"] = [
        {
            "job_name": job_name(spec),
            "metrics_path": "/metrics",
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": file_sd(scrape_targets(spec, plan)),
        }
    ]
    return cfg


def pod_monitor(spec: FleetSpec) -> dict[str, Any]:
    """A Prometheus Operator ``PodMonitor`` for a fleet the k8s backend deploys: it
    selects the fleet's pods by pdctl's labels and maps them to the same four labels."""
    k8s = k8slabels.k8s_settings(spec)

    def label(key: str) -> str:
        return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in key)

    relabel = [
        {"sourceLabels": [label(src)], "targetLabel": dst, "action": "replace"}
        for src, dst in (
            (k8slabels.FLEET, "fleet"),
            (k8slabels.ROLE, "role"),
            (k8slabels.GROUP, "group"),
            (k8slabels.INSTANCE, "instance"),
        )
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": k8slabels.object_name(spec, "metrics"),
            "namespace": k8s.namespace,
            "labels": {**k8s.labels, **k8slabels.fleet_labels(spec)},
        },
        "spec": {
            "selector": {"matchLabels": k8slabels.fleet_labels(spec)},
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": DEFAULT_INTERVAL,
                    "relabelings": relabel,
                }
            ],
        },
    }
