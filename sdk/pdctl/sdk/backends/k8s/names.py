"""Names, labels and in-cluster addresses of a fleet's Kubernetes objects.

Everything pdctl creates carries ``app.kubernetes.io/managed-by: pdctl`` and
``pdctl.io/fleet: <fleet name>``, so one label selector finds (and deletes) it all again.
"""

from __future__ import annotations

from pdctl.sdk.fleetplan import InstancePlan
from pdctl.sdk.spec import FleetSpec, K8sSpec

MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
FLEET = "pdctl.io/fleet"
ROLE = "pdctl.io/role"
GROUP = "pdctl.io/group"
INSTANCE = "pdctl.io/instance"
ENGINE_ID = "pdctl.io/engine-id"
SIDE_CHANNEL_PORT = "pdctl.io/side-channel-port"
SPEC_SHA = "pdctl.io/spec-sha256"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_RESOURCE = "leaderworkersets.leaderworkerset.x-k8s.io"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
"""Label LWS puts on every pod of a group: 0 on the leader, 1… on the workers."""
ROUTER = "router"


def k8s_settings(spec: FleetSpec) -> K8sSpec:
    """The spec's ``[backend.k8s]`` table (a :class:`ValueError` naming it when absent)."""
    if spec.backend.k8s is None:
        raise ValueError(
            "backend.k8s: the spec has no [backend.k8s] table; add one with at least "
            "image = '<an image with vLLM and pdctl>'"
        )
    return spec.backend.k8s


def object_name(spec: FleetSpec, instance: str) -> str:
    """Name of an instance's workload and Service: ``<fleet>-<instance>``."""
    return f"{spec.fleet.name}-{instance}"


def spec_config_name(spec: FleetSpec) -> str:
    return f"{spec.fleet.name}-spec"


def fleet_labels(spec: FleetSpec) -> dict[str, str]:
    """The labels every object of the fleet carries (the selector pdctl uses)."""
    return {MANAGED_BY: "pdctl", FLEET: spec.fleet.name}


def fleet_selector(spec: FleetSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(fleet_labels(spec).items()))


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
