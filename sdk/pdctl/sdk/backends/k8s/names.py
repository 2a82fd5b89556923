"""Per-instance labels and in-cluster addresses of a fleet's Kubernetes objects (the label
keys and fleet-wide names are plain data in :mod:`pdctl.sdk.k8slabels`)."""

from __future__ import annotations

from pdctl.sdk.fleetplan import InstancePlan
from pdctl.sdk.k8slabels import (
    COMPONENT,
    FLEET,
    GROUP,
    INSTANCE,
    ROLE,
    fleet_labels,
    k8s_settings,
    object_name,
)
from pdctl.sdk.spec import FleetSpec

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_RESOURCE = "leaderworkersets.leaderworkerset.x-k8s.io"
ROUTER = "router"


def spec_config_name(spec: FleetSpec) -> str:
    return f"{spec.fleet.name}-spec"


def instance_labels(spec: FleetSpec, role: str, group: str, name: str) -> dict[str, str]:
    """User labels, then pdctl's own (which always win)."""
    return {
        **k8s_settings(spec).labels,
        **fleet_labels(spec),
        COMPONENT: role,
        ROLE: role,
        GROUP: group,
        INSTANCE: name,
    }


def plan_labels(spec: FleetSpec, inst: InstancePlan) -> dict[str, str]:
    return instance_labels(spec, inst.role, inst.group, inst.name)


def selector_labels(spec: FleetSpec, name: str) -> dict[str, str]:
    """The immutable part: which pods belong to one instance."""
    return {FLEET: spec.fleet.name, INSTANCE: name}


def service_domain(spec: FleetSpec) -> str:
    k8s = k8s_settings(spec)
    return f"{k8s.namespace}.svc.{k8s.cluster_domain}"


def uses_lws(spec: FleetSpec, inst: InstancePlan) -> bool:
    gpu_ranks = inst.tp * inst.pp * inst.dp if spec.fleet.platform == "gpu" else 1
    return inst.role != ROUTER and k8s_settings(spec).uses_lws(gpu_ranks)


def instance_address(spec: FleetSpec, inst: InstancePlan) -> str:
    """The stable DNS name of the pod that serves an instance.

    A Deployment instance is reached through its headless Service; a LeaderWorkerSet
    instance through its leader pod's name under the headless Service LWS creates.
    """
    name = object_name(spec, inst.name)
    if uses_lws(spec, inst):
        return f"{name}-0.{name}.{service_domain(spec)}"
    return f"{name}.{service_domain(spec)}"


def router_address(spec: FleetSpec) -> str:
    return f"{object_name(spec, ROUTER)}.{service_domain(spec)}"
