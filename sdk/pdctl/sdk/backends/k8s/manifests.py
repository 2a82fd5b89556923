"""Spec → Kubernetes manifests (pure; deterministic output for golden tests).

One workload per instance, so each keeps the engine id, ports and command that
:func:`~pdctl.sdk.fleetplan.build_plan` gave it: a Deployment (one replica, recreated
rather than rolled, so two engines never hold one instance's GPUs) or, when the instance
spans nodes, a LeaderWorkerSet of one group. Each Deployment instance gets a headless
Service (a stable DNS name that resolves to the pod IP even before the pod is ready, so
side-channel handshakes can start early); a LeaderWorkerSet brings its own. The router
runs as a Deployment behind a Service and reads the spec from a ConfigMap.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdctl.sdk import k8slabels
from pdctl.sdk.backends.k8s import names
from pdctl.sdk.backends.k8s.netpol import network_policies
from pdctl.sdk.backends.k8s.pods import (
    env_from,
    pod_spec,
    router_health_checks,
    service_ports,
    vllm_container,
)
from pdctl.sdk.errors import SpecError, SpecProblem
from pdctl.sdk.fleetplan import FleetPlan, InstancePlan, RouterPlan, build_plan
from pdctl.sdk.jsonpatch import JsonPatchError, apply_patch
from pdctl.sdk.spec import FleetSpec, RouterSpec

Obj = dict[str, Any]
ROUTER_MODULE = "pdctl.sdk.backends.k8s.router"
SPEC_MOUNT = "/etc/pdctl"
SPEC_FILE = "spec.json"


def spec_json(spec: FleetSpec) -> str:
    """The spec as the router pod reads it (stable text: same spec, same ConfigMap)."""
    return json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def _meta(spec: FleetSpec, name: str, labels: dict[str, str], **extra: Any) -> Obj:
    meta: Obj = {"name": name, "namespace": k8slabels.k8s_settings(spec).namespace}
    meta["labels"] = labels
    meta.update({k: v for k, v in extra.items() if v})
    return meta


def _identity(inst: InstancePlan) -> dict[str, str]:
    """Annotations that let anyone read an instance's KV-transfer identity off the API."""
    out: dict[str, str] = {}
    if inst.engine_id is not None:
        out[k8slabels.ENGINE_ID] = inst.engine_id
    if inst.side_channel_port is not None:
        out[k8slabels.SIDE_CHANNEL_PORT] = str(inst.side_channel_port)
    return out


def _template(spec: FleetSpec, inst: InstancePlan, pod: Obj) -> Obj:
    """A vLLM pod template, with the spec's ``pod_patch`` applied (the escape hatch for
    whatever pdctl does not generate: hostIPC, a sidecar, a volume, a dropped capability)."""
    k8s = k8slabels.k8s_settings(spec)
    annotations = {**k8s.annotations, **_identity(inst)}
    meta: Obj = {"labels": names.plan_labels(spec, inst)}
    if annotations:
        meta["annotations"] = annotations
    template: Obj = {"metadata": meta, "spec": pod}
    if not k8s.pod_patch:
        return template
    try:
        patched: Obj = apply_patch(template, [op.as_tuple() for op in k8s.pod_patch])
    except JsonPatchError as e:
        problem = SpecProblem(
            "backend.k8s.pod_patch",
            f"{e} (in the pod template of {inst.name})",
            "fix the path; `pdctl config -o yaml` without the patch shows the template",
        )
        raise SpecError("(backend.k8s.pod_patch)", [problem]) from None
    return patched


def deployment(spec: FleetSpec, inst: InstancePlan) -> Obj:
    labels = names.plan_labels(spec, inst)
    pod = pod_spec(spec, [vllm_container(spec, inst)], shm=True)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, k8slabels.object_name(spec, inst.name), labels),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": names.selector_labels(spec, inst.name)},
            "template": _template(spec, inst, pod),
        },
    }


def leader_worker_set(spec: FleetSpec, inst: InstancePlan) -> Obj:
    k8s = k8slabels.k8s_settings(spec)
    nodes = k8s.nodes_for(inst.tp * inst.pp * inst.dp)
    leader = pod_spec(spec, [vllm_container(spec, inst, nodes=nodes)], shm=True)
    worker = pod_spec(spec, [vllm_container(spec, inst, nodes=nodes, leader=False)], shm=True)
    labels = names.plan_labels(spec, inst)
    return {
        "apiVersion": names.LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": _meta(spec, k8slabels.object_name(spec, inst.name), labels),
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": nodes,
                # one engine spans the group: any pod restarting means all of them must
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _template(spec, inst, leader),
                "workerTemplate": _template(spec, inst, worker),
            },
        },
    }


def instance_service(spec: FleetSpec, inst: InstancePlan) -> Obj:
    labels = names.plan_labels(spec, inst)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(
            spec, k8slabels.object_name(spec, inst.name), labels, annotations=_identity(inst)
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector_labels(spec, inst.name),
            "ports": service_ports(inst),
        },
    }


def router_objects(spec: FleetSpec, rp: RouterPlan) -> list[Obj]:
    """ConfigMap with the spec, the router Deployment and its Service (and, with more than
    one replica, its PodDisruptionBudget)."""
    k8s = k8slabels.k8s_settings(spec)
    rs = spec.router or RouterSpec()
    text = spec_json(spec)
    labels = names.instance_labels(spec, names.ROUTER, names.ROUTER, names.ROUTER)
    config = names.spec_config_name(spec)
    container: Obj = {
        "name": "router",
        "image": k8s.router_image or k8s.image,
        "imagePullPolicy": k8s.image_pull_policy,
        "command": ["python3", "-m", ROUTER_MODULE, "--spec-json", f"{SPEC_MOUNT}/{SPEC_FILE}"],
        "ports": [{"name": "http", "containerPort": rp.port}],
        "volumeMounts": [{"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True}],
        **router_health_checks("http", "HTTPS" if rs.tls is not None else "HTTP"),
    }
    if k8s.router_cpu:
        cpu = {"cpu": k8s.router_cpu}
        container["resources"] = {"requests": dict(cpu), "limits": dict(cpu)}
    if secrets := env_from(spec, router=True):
        container["envFrom"] = secrets
    pod = pod_spec(spec, [container], shm=False)
    pod["volumes"] = [{"name": "spec", "configMap": {"name": config}}]
    annotations = {**k8s.annotations, k8slabels.SPEC_SHA: hashlib.sha256(text.encode()).hexdigest()}
    selector = names.selector_labels(spec, names.ROUTER)
    name = k8slabels.object_name(spec, names.ROUTER)
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(spec, config, k8slabels.fleet_labels(spec) | dict(k8s.labels)),
            "data": {SPEC_FILE: text},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(spec, name, labels),
            "spec": {
                "type": k8s.router_service_type,
                "selector": selector,
                "ports": [{"name": "http", "port": rp.port, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(spec, name, labels),
            "spec": {
                "replicas": k8s.router_replicas,
                "selector": {"matchLabels": selector},
                **(_ONE_AT_A_TIME if k8s.router_replicas > 1 else {}),
                "template": {
                    "metadata": {"labels": labels, "annotations": annotations},
                    "spec": pod,
                },
            },
        },
        *_router_budget(spec, name, labels, selector),
    ]


_ONE_AT_A_TIME: Obj = {
    # a new router pod is ready before an old one goes: the Service never has fewer
    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
}


def _router_budget(spec: FleetSpec, name: str, labels: Obj, selector: Obj) -> list[Obj]:
    """At most one router replica evicted at a time (node drains, upgrades); none for a
    single replica, whose budget could only block a drain for ever."""
    if k8slabels.k8s_settings(spec).router_replicas < 2:
        return []
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(spec, name, labels),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        }
    ]


def build_manifests(spec: FleetSpec, plan: FleetPlan | None = None) -> list[Obj]:
    """Every object of the fleet, in apply order: per instance its Service and workload,
    then the router's ConfigMap, Service and Deployment, then the NetworkPolicies."""
    plan = plan if plan is not None else build_plan(spec)
    docs: list[Obj] = []
    for inst in plan.instances:
        if names.uses_lws(spec, inst):
            docs.append(leader_worker_set(spec, inst))
        else:
            docs.append(instance_service(spec, inst))
            docs.append(deployment(spec, inst))
    if plan.router is not None:
        docs.extend(router_objects(spec, plan.router))
    docs.extend(network_policies(spec, plan))
    return docs


def cluster_plan(spec: FleetSpec, plan: FleetPlan | None = None) -> FleetPlan:
    """The plan as seen from inside the cluster: every instance (and the router) at its
    stable DNS name, which is also the side-channel address the router first gives decode.

    Ports, engine ids and argv stay as planned, so the router's prefill identities (engine
    id, side channel, TP, PP) are known before any prefill answers.
    """
    plan = plan if plan is not None else build_plan(spec)
    instances = []
    for inst in plan.instances:
        addr = names.instance_address(spec, inst)
        sc = addr if inst.side_channel_port is not None else None
        instances.append(inst.model_copy(update={"host": addr, "side_channel_host": sc}))
    router = None
    if plan.router is not None:
        router = RouterPlan(host=names.router_address(spec), port=plan.router.port)
    return FleetPlan(instances=tuple(instances), router=router)


def as_list(docs: list[Obj]) -> Obj:
    """One ``v1/List`` object (what ``kubectl apply -f -`` takes as JSON)."""
    return {"apiVersion": "v1", "kind": "List", "items": docs}


def to_json(docs: list[Obj]) -> str:
    return json.dumps(as_list(docs), indent=2, sort_keys=True) + "\n"


def to_yaml(docs: list[Obj]) -> str:
    """Multi-document YAML with sorted keys (needs PyYAML: the ``k8s`` extra)."""
    try:
        import yaml  # type: ignore[import-untyped, unused-ignore]
    except ImportError:  # pragma: no cover - PyYAML comes with the k8s and cpu extras
        from pdctl.sdk.errors import PdctlError

        raise PdctlError(
            "YAML output needs PyYAML: pip install 'pdctl[k8s]' (or use -o json)"
        ) from None

    class _Plain(yaml.SafeDumper):  # type: ignore[misc, unused-ignore]
        def ignore_aliases(self, data: Any) -> bool:
            return True  # no &id001 anchors: each object reads on its own

    return str(
        yaml.dump_all(docs, Dumper=_Plain, sort_keys=True, default_flow_style=False, width=100)
    )
