"""Rules PD024-PD031 and PD050: mistakes that only matter on Kubernetes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pdctl.sdk.fleetplan import (
    is_loopback,
    is_wildcard,
)
from pdctl.sdk.jsonpatch import JsonPatchError, apply_patch
from pdctl.sdk.keys import key_sources
from pdctl.sdk.lint.core import (
    Finding,
    LintContext,
    _f,
    rule,
)
from pdctl.sdk.modelinfo import (
    looks_like_local_path,
)
from pdctl.sdk.spec import (
    RDMA_CAPABILITY,
    K8sSpec,
    is_dns_label,
)

# --------------------------------------------------------------------------- Kubernetes


def _k8s(ctx: LintContext) -> K8sSpec | None:
    return ctx.spec.backend.k8s if ctx.spec.backend.kind == "k8s" else None


@rule("PD024", "host or side-channel address pinned on Kubernetes")
def _k8s_hosts(ctx: LintContext) -> Iterator[Finding]:
    if _k8s(ctx) is None:
        return
    for _r, _gi, g, where in ctx.groups():
        for key in ("host", "side_channel_host"):
            value = getattr(g, key)
            if key not in g.model_fields_set or value is None or is_wildcard(value):
                continue
            why = " (a loopback address no other pod can reach)" if is_loopback(value) else ""
            yield _f(
                "PD024",
                "warning",
                f"{where}.{key}",
                f"{key} = {value!r}{why} is ignored on Kubernetes",
                "nothing breaks, but the spec no longer says what runs: each pod binds "
                "0.0.0.0 and advertises its own pod IP as the side channel",
                f"remove {key} from {where} (it describes a machine, not a pod)",
            )


@rule("PD025", "GPU fleet on Kubernetes without a GPU resource")
def _k8s_gpu_resource(ctx: LintContext) -> Iterator[Finding]:
    k8s = _k8s(ctx)
    if k8s is not None and ctx.spec.fleet.platform == "gpu" and not k8s.gpu_resource.strip():
        yield _f(
            "PD025",
            "error",
            "backend.k8s.gpu_resource",
            "the GPU platform with gpu_resource = '': pods request no GPU",
            "the scheduler places vLLM pods on any node and the device plugin gives them no "
            "GPU: every engine exits at start (no CUDA device)",
            "set gpu_resource = 'nvidia.com/gpu' (or your device plugin's resource name)",
        )


def _ignored_pins(
    ctx: LintContext, code: str, key: str, message: str, cost: str, fix: str
) -> Iterator[Finding]:
    """Groups that pin something of this machine (``key``), which pods do not honour."""
    if _k8s(ctx) is None:
        return
    for _r, _gi, g, where in ctx.groups():
        if getattr(g, key) is not None:
            yield _f(code, "warning", f"{where}.{key}", message, cost, fix)


@rule("PD026", "GPU indices pinned on Kubernetes")
def _k8s_devices(ctx: LintContext) -> Iterator[Finding]:
    yield from _ignored_pins(
        ctx,
        "PD026",
        "devices",
        "devices are ignored on Kubernetes: the device plugin picks each pod's GPUs",
        "pinning does not happen, so placement reasoning based on it (NVLink neighbours, "
        "one NUMA node) does not hold",
        "remove devices; constrain placement with backend.k8s.node_selector instead",
    )


@rule("PD027", "CPU cores pinned on Kubernetes")
def _k8s_cores(ctx: LintContext) -> Iterator[Finding]:
    yield from _ignored_pins(
        ctx,
        "PD027",
        "cpu_cores",
        "cpu_cores are ignored on Kubernetes: core numbers of this machine mean nothing in a pod",
        "without a CPU request pods share cores with their neighbours and slow down",
        "remove cpu_cores and set backend.k8s.cpu (with the kubelet's static CPU manager, "
        "whole-core requests get exclusive cores)",
    )


def _rdma_ucx(ctx: LintContext) -> bool:
    ucx = ctx.spec.fleet.ucx
    tls = [t.strip() for t in (ucx.tls or "").split(",")]
    rdma_tls = any(t.startswith(("rc", "ud", "dc", "ib")) for t in tls)
    return "UCX" in ctx.spec.fleet.nixl_backends and (rdma_tls or "mlx5" in (ucx.net_devices or ""))


@rule("PD028", "RDMA/EFA transport without the device resource")
def _k8s_rdma(ctx: LintContext) -> Iterator[Finding]:
    k8s = _k8s(ctx)
    if k8s is None:
        return
    names = list(k8s.rdma_resources)
    if "LIBFABRIC" in ctx.spec.fleet.nixl_backends and not any("efa" in n for n in names):
        yield _f(
            "PD028",
            "error",
            "backend.k8s.rdma_resources",
            "NIXL's LIBFABRIC backend (EFA) but pods request no EFA devices",
            "the pod sees no EFA device: NIXL agent creation fails and the engine exits (or "
            "libfabric falls back to TCP at a small fraction of the bandwidth)",
            "add rdma_resources = { 'vpc.amazonaws.com/efa' = N } (N EFA devices per node)",
        )
    elif _rdma_ucx(ctx) and not names:
        yield _f(
            "PD028",
            "warning",
            "backend.k8s.rdma_resources",
            "UCX is set up for RDMA (fleet.ucx) but pods request no RDMA devices",
            "without the devices UCX quietly uses TCP: KV transfers run many times slower",
            "add the RDMA device plugin's resource, e.g. rdma_resources = { 'rdma/ib' = 1 }",
        )


@rule("PD029", "names too long or not valid for Kubernetes")
def _k8s_names(ctx: LintContext) -> Iterator[Finding]:
    if _k8s(ctx) is None:
        return
    fleet = ctx.spec.fleet.name
    if not is_dns_label(fleet):
        yield _f(
            "PD029",
            "error",
            "fleet.name",
            f"fleet name {fleet!r} is not a valid Kubernetes name",
            "the API server rejects every object (names and labels derive from it)",
            "use lowercase letters, digits and '-' (not at the ends), e.g. 'llama-pd'",
        )
        return
    for inst in ctx.plan.instances:
        name = f"{fleet}-{inst.name}"
        if len(name) > 63:
            yield _f(
                "PD029",
                "error",
                f"{inst.group_role}[{inst.group_index}].name",
                f"object name {name!r} is {len(name)} characters (Services allow 63)",
                "the API server rejects the instance's Service: it cannot be reached",
                "shorten fleet.name or the group name",
            )


@rule("PD030", "instance does not fit the nodes")
def _k8s_node_shape(ctx: LintContext) -> Iterator[Finding]:
    k8s = _k8s(ctx)
    if k8s is None or ctx.spec.fleet.platform != "gpu":
        return
    per = k8s.gpus_per_node
    for _r, _gi, g, where in ctx.groups():
        if k8s.uses_lws(g.ranks) and g.ranks % per:
            yield _f(
                "PD030",
                "error",
                f"{where}.tp",
                f"{g.ranks} GPUs per instance (tp x pp x dp) do not split evenly over nodes of "
                f"{per} (backend.k8s.gpus_per_node)",
                "the group's pods would need different GPU counts; vLLM's multi-node mode "
                "needs the same number of ranks on every node",
                f"use a multiple of {per} GPUs per instance (e.g. tp = {per}, pp = nodes)",
            )
        elif k8s.workload == "deployment" and g.ranks > per:
            yield _f(
                "PD030",
                "error",
                "backend.k8s.workload",
                f"{where} needs {g.ranks} GPUs in one pod; nodes have {per}",
                "no node can take the pod: it stays Pending",
                "set backend.k8s.workload = 'auto' (a LeaderWorkerSet spans the nodes)",
            )


@rule("PD031", "files that exist only on this machine")
def _k8s_files(ctx: LintContext) -> Iterator[Finding]:
    k8s = _k8s(ctx)
    if k8s is None:
        return
    path = ctx.spec.model.path
    if looks_like_local_path(path) and not path.startswith("/"):
        yield _f(
            "PD031",
            "error" if path.startswith("~") else "warning",
            "model.path",
            f"model.path {path!r} is relative to this machine",
            "inside the pod it names nothing: vLLM takes it for a hub model and exits",
            "use a hub model name, or an absolute path baked into the image or mounted",
        )
    for src in key_sources(ctx.spec.router):
        if src.file:
            yield _f(
                "PD031",
                "warning",
                f"{src.field}.file",
                f"{src.file} is a file on this machine; the router pod cannot read it",
                "the router pod does not start",
                "keep the key in a Secret, list it in backend.k8s.router_secret_env and use env",
            )
        elif src.env and not (k8s.secret_env or k8s.router_secret_env):
            yield _f(
                "PD031",
                "warning",
                "backend.k8s.router_secret_env",
                f"{src.field}.env = {src.env!r} but no Secret provides it to the router pod",
                "the router pod does not start (its key variable is unset)",
                f"create a Secret with the key {src.env} and list its name in router_secret_env",
            )


_RDMA_RESOURCE_HINTS = ("rdma", "efa", "infiniband")
_CONTAINER = "/spec/containers/0"
_CHECKED = (f"{_CONTAINER}/resources", f"{_CONTAINER}/securityContext")


def _vllm_container(k8s: K8sSpec) -> dict[str, Any]:
    """The two fields of a vLLM container this rule reads, as pdctl generates them
    (``backends/k8s/pods.py``: resources and security context), with the ``pod_patch``
    operations on those fields applied; other operations are the build's to check."""
    rdma = {name: str(n) for name, n in k8s.rdma_resources.items()}
    container: dict[str, Any] = {"name": "vllm"}
    if rdma:
        container["resources"] = {"limits": dict(rdma), "requests": dict(rdma)}
    if caps := k8s.container_capabilities(rdma=bool(rdma)):
        container["securityContext"] = {"capabilities": {"add": caps}}
    ops = [
        op.as_tuple()
        for op in k8s.pod_patch
        if op.path == _CONTAINER or op.path.startswith(tuple(c for c in _CHECKED))
    ]
    template: dict[str, Any] = {"spec": {"containers": [container]}}
    try:
        template = apply_patch(template, ops)
    except JsonPatchError:
        return container  # the build names the operation that does not apply
    first: dict[str, Any] = (template["spec"].get("containers") or [{}])[0]
    return first


def _locks_memory(container: dict[str, Any]) -> bool:
    sc = container.get("securityContext") or {}
    added = (sc.get("capabilities") or {}).get("add") or []
    return bool(sc.get("privileged")) or RDMA_CAPABILITY in added or "ALL" in added


@rule("PD050", "RDMA/EFA devices without IPC_LOCK")
def _k8s_memlock(ctx: LintContext) -> Iterator[Finding]:
    """A vLLM container, as it will be applied (``pod_patch`` included), that gets RDMA/EFA
    devices but neither IPC_LOCK nor privileged may not be able to pin memory for
    registration (ibv_reg_mr / fi_mr_reg fail once RLIMIT_MEMLOCK is reached)."""
    k8s = _k8s(ctx)
    if k8s is None or not any(
        i.role in ("prefill", "decode", "colocated") for i in ctx.plan.instances
    ):
        return
    c = _vllm_container(k8s)
    res = c.get("resources") or {}
    names = set(res.get("limits") or {}) | set(res.get("requests") or {})
    declared = set(k8s.rdma_resources)
    rdma = sorted(n for n in names if n in declared or any(h in n for h in _RDMA_RESOURCE_HINTS))
    if rdma and not _locks_memory(c):
        yield _f(
            "PD050",
            "warning",
            "backend.k8s.pod_patch" if k8s.pod_patch else "backend.k8s.capabilities",
            f"vLLM containers request {', '.join(rdma)} without the {RDMA_CAPABILITY} capability",
            "where the container's memlock limit is low, registering KV memory with the NIC "
            "fails and NIXL cannot move KV over RDMA/EFA",
            f"keep {RDMA_CAPABILITY} (pdctl adds it; do not remove it in pod_patch), or make "
            "sure the runtime's memlock limit is unlimited",
        )
