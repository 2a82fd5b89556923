"""NetworkPolicies of a fleet: who may open which port of which pod.

* prefill and decode pods: ``http`` (vLLM's OpenAI server, whose ``--api-key`` guards only
  ``/v1``, ``/v2``, ``/inference`` and ``/cohere``: ``GUARDED_PREFIX`` in vLLM's
  ``vllm/entrypoints/serve/middleware/authenticate.py``) and the KV-event ports only from
  the router (and ``/metrics`` scrapers named by ``prometheus_pod_labels``); every port
  from the fleet's other prefill and decode pods (NIXL side channels, UCX's data
  connections on ports it picks itself, the pods of one multi-node instance);
* render pods: ``http`` only from the router (and the scrapers);
* the router pod: ``http`` from anywhere (it checks keys itself).

Egress is not restricted. Health probes come from the kubelet on the node, which common
CNIs (Calico, Cilium) let through whatever the policy says.
"""

from __future__ import annotations

from typing import Any

from pdctl.sdk import k8slabels
from pdctl.sdk.backends.k8s import names
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.spec import FleetSpec

Obj = dict[str, Any]
API = "networking.k8s.io/v1"
ENGINE_ROLES = ("prefill", "decode")


def _pods(spec: FleetSpec, *roles: str) -> Obj:
    """A pod selector for the fleet's pods of ``roles``."""
    return {
        "matchLabels": {k8slabels.FLEET: spec.fleet.name},
        "matchExpressions": [{"key": k8slabels.ROLE, "operator": "In", "values": list(roles)}],
    }


def _ports(*port_names: str) -> list[Obj]:
    return [{"port": n, "protocol": "TCP"} for n in port_names]


def _scrapers(spec: FleetSpec) -> list[Obj]:
    k8s = k8slabels.k8s_settings(spec)
    if not k8s.prometheus_pod_labels:
        return []
    peer: Obj = {"podSelector": {"matchLabels": dict(k8s.prometheus_pod_labels)}}
    if k8s.prometheus_namespace:
        peer["namespaceSelector"] = {
            "matchLabels": {"kubernetes.io/metadata.name": k8s.prometheus_namespace}
        }
    return [{"from": [peer], "ports": _ports("http")}]


def _policy(spec: FleetSpec, suffix: str, selector: Obj, ingress: list[Obj]) -> Obj:
    k8s = k8slabels.k8s_settings(spec)
    return {
        "apiVersion": API,
        "kind": "NetworkPolicy",
        "metadata": {
            "name": k8slabels.object_name(spec, suffix),
            "namespace": k8s.namespace,
            "labels": k8slabels.fleet_labels(spec) | dict(k8s.labels),
        },
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def network_policies(spec: FleetSpec, plan: FleetPlan) -> list[Obj]:
    """The fleet's NetworkPolicies ([] when ``backend.k8s.network_policies`` is off)."""
    if not k8slabels.k8s_settings(spec).network_policies:
        return []
    router = {"podSelector": _pods(spec, names.ROUTER)}
    engines = {"podSelector": _pods(spec, *ENGINE_ROLES)}
    kv_events = any(i.kv_events_ports for i in plan.instances)
    from_router = _ports("http", *(("kv-events", "kv-replay") if kv_events else ()))
    out = [
        _policy(
            spec,
            "engines",
            _pods(spec, *ENGINE_ROLES),
            [
                {"from": [router], "ports": from_router},
                {"from": [engines]},
                *_scrapers(spec),
            ],
        )
    ]
    if any(i.role == "render" for i in plan.instances):
        out.append(
            _policy(
                spec,
                "render",
                _pods(spec, "render"),
                [{"from": [router], "ports": _ports("http")}, *_scrapers(spec)],
            )
        )
    if plan.router is not None:
        out.append(
            _policy(spec, "router-ingress", _pods(spec, names.ROUTER), [{"ports": _ports("http")}])
        )
    return out
