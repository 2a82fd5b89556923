"""Pod templates: the vLLM and router containers with their env, ports, health checks and
resources (pure functions over the spec and one instance's launch plan)."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from pdctl.sdk import k8slabels
from pdctl.sdk.fleetplan import InstancePlan
from pdctl.sdk.spec import FleetSpec

Obj = dict[str, Any]

HEALTH_ENDPOINT = "/health"
SHM_VOLUME = "dshm"
POD_IP = {"fieldRef": {"fieldPath": "status.podIP"}}
NODE_RANK_ENV = "PDCTL_NODE_RANK"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
"""Injected by LWS into every pod of a group."""
KUBELET_MANAGED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND"})
"""Device and core pinning of the local launcher: in a pod the device plugin and the
kubelet decide, so these are left out."""
GPU_ROLES = frozenset({"prefill", "decode", "colocated"})


def escape(arg: str) -> str:
    """Keep Kubernetes from expanding ``$(NAME)`` inside a planned argument."""
    return arg.replace("$(", "$$(")


def pod_argv(spec: FleetSpec, inst: InstancePlan) -> list[str]:
    """The instance's planned argv, made to fit a pod.

    The server binds every address of the pod (the kubelet's health checks and peers come
    from outside it); the model path is the spec's (``~`` means nothing on the operator's
    disk here); the interpreter of the CPU platform is the image's ``python3``, not the
    local one.
    """
    argv = [escape(a) for a in inst.argv]
    if argv and argv[0] == sys.executable:
        argv[0] = spec.fleet.python or "python3"
    local_model = os.path.expanduser(spec.model.path)
    argv = [spec.model.path if a == local_model else a for a in argv]
    if "--host" in argv:
        argv[argv.index("--host") + 1] = "0.0.0.0"
    return argv


def multinode_argv(argv: list[str], nodes: int, *, leader: bool) -> list[str]:
    """vLLM's own multi-node mode: rank 0 serves HTTP, the others run headless."""
    rank = "0" if leader else f"$({NODE_RANK_ENV})"
    extra = ["--nnodes", str(nodes), "--node-rank", rank, "--master-addr", LEADER_ADDRESS]
    extra += ["--distributed-executor-backend", "mp"]
    return argv + extra + ([] if leader else ["--headless"])


def env_list(inst: InstancePlan, *, multinode: bool, leader: bool) -> list[Obj]:
    env: list[Obj] = [
        {"name": k, "value": v}
        for k, v in sorted(inst.env.items())
        if k not in KUBELET_MANAGED_ENV and k != "VLLM_NIXL_SIDE_CHANNEL_HOST"
    ]
    if inst.side_channel_port is not None:
        # peers handshake with the side channel in both directions: advertise the pod IP
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": POD_IP})
    if multinode:
        env.append({"name": "VLLM_HOST_IP", "valueFrom": POD_IP})
        if not leader:
            label = f"metadata.labels['{k8slabels.LWS_WORKER_INDEX}']"
            env.append({"name": NODE_RANK_ENV, "valueFrom": {"fieldRef": {"fieldPath": label}}})
    return sorted(env, key=lambda e: str(e["name"]))


def container_ports(inst: InstancePlan) -> list[Obj]:
    ports: list[Obj] = [{"name": "http", "containerPort": inst.http_port}]
    for r, port in enumerate(inst.side_channel_ports):
        ports.append({"name": "nixl" if r == 0 else f"nixl-{r}", "containerPort": port})
    # vLLM's KV-event publisher and its replay socket (cache_aware): the router in its pod
    # subscribes to them at the instance's DNS name
    for name, port in zip(("kv-events", "kv-replay"), inst.kv_events_ports, strict=False):
        ports.append({"name": name, "containerPort": port})
    return ports


def service_ports(inst: InstancePlan) -> list[Obj]:
    return [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
        for p in container_ports(inst)
    ]


def health_checks(spec: FleetSpec, port: str | int) -> Obj:
    """Kubernetes' startup (model loading may take many minutes), readiness and liveness
    probes on /health."""

    def check() -> Obj:
        return {"httpGet": {"path": HEALTH_ENDPOINT, "port": port}}

    startup_period = 10
    k8s = k8slabels.k8s_settings(spec)
    return {
        "startupProbe": {
            **check(),
            "periodSeconds": startup_period,
            "failureThreshold": math.ceil(k8s.startup_timeout_s / startup_period),
        },
        "readinessProbe": {**check(), "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {
            **check(),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
    }


def router_health_checks(port: str | int, scheme: str = "HTTP") -> Obj:
    """The router's Kubernetes probes. Started and alive: it listens. Ready: ``/ready``,
    200 once the router has found every role it needs healthy after it started, and from
    then on (its ``/health`` answers 503 while no prefill or decode is healthy, which is the
    fleet's state, not the router's: probing that would pull every replica out of the
    Service, or restart it, just while an instance restarts)."""
    tcp = {"tcpSocket": {"port": port}}
    ready = {"httpGet": {"path": "/ready", "port": port, "scheme": scheme}}
    return {
        "startupProbe": {**tcp, "periodSeconds": 2, "failureThreshold": 60},
        "readinessProbe": {**ready, "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**tcp, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def gpus_per_pod(spec: FleetSpec, inst: InstancePlan) -> int:
    if spec.fleet.platform != "gpu" or inst.role not in GPU_ROLES:
        return 0
    ranks = inst.tp * inst.pp * inst.dp
    return -(-ranks // k8slabels.k8s_settings(spec).nodes_for(ranks))


def resources(spec: FleetSpec, inst: InstancePlan) -> Obj:
    k8s = k8slabels.k8s_settings(spec)
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    gpus = gpus_per_pod(spec, inst)
    if gpus and k8s.gpu_resource:
        limits[k8s.gpu_resource] = requests[k8s.gpu_resource] = str(gpus)
    if requests_rdma(spec, inst):
        for name, n in k8s.rdma_resources.items():
            limits[name] = requests[name] = str(n)
    if k8s.cpu is not None:
        requests["cpu"] = k8s.cpu
    if k8s.memory is not None:
        requests["memory"] = limits["memory"] = k8s.memory
    out: Obj = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def pod_spec(spec: FleetSpec, containers: list[Obj], *, shm: bool) -> Obj:
    k8s = k8slabels.k8s_settings(spec)
    pod: Obj = {
        "containers": containers,
        # a Service named e.g. 'vllm' would otherwise inject VLLM_PORT=tcp://… into vLLM
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
    }
    if shm:
        pod["volumes"] = [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}}
        ]
    if k8s.service_account:
        pod["serviceAccountName"] = k8s.service_account
    if k8s.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in k8s.image_pull_secrets]
    if k8s.node_selector:
        pod["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        pod["tolerations"] = [
            {_camel(k): v for k, v in t.model_dump(exclude_none=True).items()}
            for t in k8s.tolerations
        ]
    return pod


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


def env_from(spec: FleetSpec, *, router: bool = False) -> list[Obj]:
    """The Secrets a pod reads as env; the router's pod also gets ``router_secret_env``."""
    k8s = k8slabels.k8s_settings(spec)
    secrets = [*k8s.secret_env, *(k8s.router_secret_env if router else [])]
    return [{"secretRef": {"name": s}} for s in secrets]


def vllm_container(
    spec: FleetSpec, inst: InstancePlan, *, nodes: int = 1, leader: bool = True
) -> Obj:
    """One vLLM container: the whole instance, or one node of a multi-node instance."""
    k8s = k8slabels.k8s_settings(spec)
    multinode = nodes > 1
    argv = pod_argv(spec, inst)
    if multinode:
        argv = multinode_argv(argv, nodes, leader=leader)
    c: Obj = {
        "name": "vllm",
        "image": k8s.image,
        "imagePullPolicy": k8s.image_pull_policy,
        "command": argv,
        "env": env_list(inst, multinode=multinode, leader=leader),
        "ports": container_ports(inst) if leader else [],
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
    }
    if leader:
        c.update(health_checks(spec, "http"))
    if secrets := env_from(spec):
        c["envFrom"] = secrets
    if res := resources(spec, inst):
        c["resources"] = res
    if caps := k8s.container_capabilities(rdma=requests_rdma(spec, inst)):
        c["securityContext"] = {"capabilities": {"add": caps}}
    return {k: v for k, v in c.items() if v != []}


def requests_rdma(spec: FleetSpec, inst: InstancePlan) -> bool:
    """Does the instance's container get RDMA/EFA devices (``rdma_resources``)?"""
    return inst.role in GPU_ROLES and bool(k8slabels.k8s_settings(spec).rdma_resources)
