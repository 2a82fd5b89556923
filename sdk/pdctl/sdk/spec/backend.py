"""What runs the fleet: ``[backend]`` with its Kubernetes and Ray settings."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pdctl.sdk.jsonpatch import PatchOpName, split_pointer
from pdctl.sdk.spec.base import BackendKind, _Strict, is_dns_label

_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_QUALIFIED_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
RESERVED_LABEL_PREFIXES = ("pdctl.io/", "app.kubernetes.io/managed-by")
_CAPABILITY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
RDMA_CAPABILITY = "IPC_LOCK"
"""Pinning (registering) RDMA/EFA memory is bounded by RLIMIT_MEMLOCK; a container may raise
it only with CAP_IPC_LOCK (llm-d's AWS EFA overlay adds it for the same reason)."""


class Toleration(_Strict):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class PodPatchOp(_Strict):
    """One RFC 6902 operation of ``pod_patch``; ``path`` is a JSON Pointer into the pod
    template (``/metadata/...`` or ``/spec/...``)."""

    op: PatchOpName
    path: str
    value: Any = None

    @field_validator("path")
    @classmethod
    def _pointer(cls, v: str) -> str:
        split_pointer(v)
        if not v.startswith(("/metadata", "/spec")):
            raise ValueError(f"{v!r}: point into the pod template, e.g. '/spec/hostIPC'")
        return v

    @model_validator(mode="after")
    def _value(self) -> PodPatchOp:
        if self.op != "remove" and "value" not in self.model_fields_set:
            raise ValueError(f"{self.op} {self.path}: give a value")
        return self

    def as_tuple(self) -> tuple[PatchOpName, str, Any]:
        return (self.op, self.path, self.value)


class K8sSpec(_Strict):
    """Where and how the fleet runs on Kubernetes (in the current kube context by default)."""

    image: str = Field(description="Container image with vLLM and pdctl installed.")
    router_image: str | None = Field(
        default=None, description="Image of the router pod (pdctl is enough); default: image."
    )
    namespace: str = "default"
    context: str | None = Field(default=None, description="kube context; default: the current.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    service_account: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    gpu_resource: str = Field(
        default="nvidia.com/gpu", description="Extended resource that grants GPUs ('' for none)."
    )
    gpus_per_node: int = Field(
        default=8, ge=1, description="An instance needing more GPUs spans nodes (LeaderWorkerSet)."
    )
    rdma_resources: dict[str, int] = Field(
        default_factory=dict,
        description="RDMA/EFA devices per vLLM pod, e.g. {'vpc.amazonaws.com/efa' = 32}.",
    )
    capabilities: list[str] = Field(
        default_factory=list,
        description="Linux capabilities added to every vLLM container, e.g. ['SYS_PTRACE'] "
        "(IPC_LOCK is added by itself wherever rdma_resources are requested).",
    )
    pod_patch: list[PodPatchOp] = Field(
        default_factory=list,
        description="RFC 6902 JSON patch applied to every generated vLLM pod template, e.g. "
        "[{op = 'add', path = '/spec/hostIPC', value = true}] (docs/kubernetes.md).",
    )
    cpu: str | None = Field(default=None, description="CPU request of each vLLM pod, e.g. '8'.")
    memory: str | None = Field(default=None, description="Memory request and limit, e.g. '64Gi'.")
    shm_size: str = Field(default="16Gi", description="Size of the /dev/shm memory volume.")
    workload: Literal["auto", "deployment", "leaderworkerset"] = Field(
        default="auto",
        description="'auto': a Deployment per instance, a LeaderWorkerSet when it spans nodes.",
    )
    startup_timeout_s: int = Field(
        default=1800, ge=60, description="How long a pod may load the model before it restarts."
    )
    secret_env: list[str] = Field(
        default_factory=list, description="Secrets whose keys become env (e.g. HF_TOKEN)."
    )
    router_secret_env: list[str] = Field(
        default_factory=list,
        description="Secrets whose keys become env in the router pod only (its API keys: "
        "the vLLM pods never see them).",
    )
    network_policies: bool = Field(
        default=True,
        description="Emit NetworkPolicies: vLLM HTTP and KV-event ports only from the router "
        "(and prometheus_pod_labels for /metrics), side channels and NIXL only between the "
        "fleet's prefill and decode pods. Off: every pod reaches every port (lint PD047).",
    )
    prometheus_pod_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the Prometheus pods allowed to scrape the vLLM and router "
        "HTTP ports, e.g. {'app.kubernetes.io/name' = 'prometheus'}; none: no scraper.",
    )
    prometheus_namespace: str | None = Field(
        default=None, description="Namespace of those Prometheus pods; default: the fleet's."
    )
    router_service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    router_replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Router pods behind the router Service. Each is a whole router with its "
        "own view (docs/kubernetes.md, 'Router replicas'); above 1 they get a "
        "PodDisruptionBudget (at most one down at a time) and roll one at a time.",
    )
    router_cpu: str | None = Field(
        default=None,
        description="CPU request and limit of each router pod, e.g. '4': the default "
        "router.workers follows the limit (one worker per CPU).",
    )
    cluster_domain: str = "cluster.local"
    labels: dict[str, str] = Field(default_factory=dict, description="Added to every object.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to every pod.")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not is_dns_label(v):
            raise ValueError("use lowercase letters, digits and '-' (at most 63), e.g. 'llm'")
        return v

    @field_validator("cpu", "memory", "shm_size", "router_cpu")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None and not _QUANTITY_RE.match(v):
            raise ValueError("not a Kubernetes quantity; write e.g. '8', '500m', '64Gi'")
        return v

    @field_validator("rdma_resources")
    @classmethod
    def _resources(cls, v: dict[str, int]) -> dict[str, int]:
        for name, n in v.items():
            if "/" not in name or not _QUALIFIED_RE.match(name):
                raise ValueError(f"{name!r} is not a resource name such as 'rdma/ib'")
            if n < 1:
                raise ValueError(f"{name} = {n}: request at least 1 (or remove it)")
        return v

    @field_validator("capabilities")
    @classmethod
    def _capabilities(cls, v: list[str]) -> list[str]:
        for cap in v:
            if cap.startswith("CAP_"):
                raise ValueError(f"{cap!r}: Kubernetes names it without CAP_, write {cap[4:]!r}")
            if not _CAPABILITY_RE.match(cap):
                raise ValueError(f"{cap!r} is not a capability name such as 'IPC_LOCK'")
        return v

    @field_validator("labels", "annotations")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _QUALIFIED_RE.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
                raise ValueError(f"{key!r} is not a valid key; use e.g. 'team' or 'example.com/x'")
            if key.startswith(RESERVED_LABEL_PREFIXES):
                raise ValueError(f"{key!r} is set by pdctl (it finds its objects by it)")
        return v

    def uses_lws(self, ranks: int) -> bool:
        """Does an instance with ``ranks`` GPU workers run as a LeaderWorkerSet?"""
        return self.workload == "leaderworkerset" or (
            self.workload == "auto" and ranks > self.gpus_per_node
        )

    def container_capabilities(self, *, rdma: bool) -> list[str]:
        """Capabilities a vLLM container adds: the spec's, and IPC_LOCK when it requests
        RDMA/EFA devices."""
        return sorted(set(self.capabilities) | ({RDMA_CAPABILITY} if rdma else set()))

    def nodes_for(self, ranks: int) -> int:
        """Pods (one per node) an instance with ``ranks`` GPU workers occupies."""
        return max(1, -(-ranks // self.gpus_per_node)) if self.uses_lws(ranks) else 1


RAY_MANAGED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


class RayGroup(_Strict):
    """Where the instances of one group (or the router) go on a Ray cluster."""

    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources each instance needs, e.g. {node_a = 1} to pick "
        "the node started with `ray start --resources '{\"node_a\": 1}'`.",
    )
    num_cpus: float | None = Field(
        default=None, ge=0, description="CPUs Ray reserves per instance; default backend.ray's."
    )
    num_gpus: float | None = Field(
        default=None,
        ge=0,
        description="GPUs per instance; default tp*pp*dp on the GPU platform, 0 on CPU.",
    )

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, v: dict[str, float]) -> dict[str, float]:
        for name, n in v.items():
            if name in RAY_MANAGED_RESOURCES:
                knob = {"CPU": "num_cpus", "GPU": "num_gpus"}.get(name)
                how = f"set {knob} instead" if knob else "pdctl does not reserve it"
                raise ValueError(f"{name!r} is not a custom resource: {how}")
            if not name.strip() or n < 0:
                raise ValueError(f"{name!r} = {n}: name a resource and ask for >= 0 of it")
        return v


class RaySpec(_Strict):
    """Ray cluster settings (the Ray backend): every instance and the router become a
    detached Ray actor on a node that has what its group asks for."""

    address: str | None = Field(
        default=None,
        description="Ray address (GCS host:port or 'auto'); default: RAY_ADDRESS, else auto.",
    )
    namespace: str = Field(
        default="pdctl", min_length=1, description="Ray namespace of the fleet's actors."
    )
    num_cpus: float = Field(default=1.0, ge=0, description="CPUs Ray reserves per instance.")
    groups: dict[str, RayGroup] = Field(
        default_factory=dict,
        description="Placement per group name ('prefill', 'decode-a', … or 'router').",
    )
    start_timeout_s: float = Field(
        default=120.0, gt=0, description="How long Ray may take to place and start an actor."
    )


class BackendSpec(_Strict):
    """What runs the fleet: this machine, a Kubernetes cluster or a Ray cluster."""

    kind: BackendKind = "local"
    k8s: K8sSpec | None = None
    ray: RaySpec | None = None

    @model_validator(mode="after")
    def _settings_present(self) -> BackendSpec:
        if self.kind == "k8s" and self.k8s is None:
            raise ValueError(
                "k8s: backend.kind is 'k8s' but there is no [backend.k8s] table; add one with "
                "at least image = '<an image with vLLM and pdctl>'"
            )
        return self
