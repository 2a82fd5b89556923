"""The label keys and object names pdctl gives a fleet's Kubernetes objects, as plain data.

Everything pdctl creates carries ``app.kubernetes.io/managed-by: pdctl`` and
``pdctl.io/fleet: <fleet name>``, so one label selector finds (and deletes) it all again.
The k8s backend puts these labels on what it creates; the observability files (the
Prometheus Operator ``PodMonitor``) select by them. Both read them from here, below both.
"""

from __future__ import annotations

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
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
"""Label LWS puts on every pod of a group: 0 on the leader, 1… on the workers."""


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


def fleet_labels(spec: FleetSpec) -> dict[str, str]:
    """The labels every object of the fleet carries (the selector pdctl uses)."""
    return {MANAGED_BY: "pdctl", FLEET: spec.fleet.name}


def fleet_selector(spec: FleetSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(fleet_labels(spec).items()))
