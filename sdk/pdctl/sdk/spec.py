"""The fleet spec: one description of a P/D fleet, from which everything else is derived.

The models here only describe and validate *shapes* (types, ranges, names). Whether a
valid-looking spec is a good idea (port clashes, TP mismatches, loopback side channels…)
is the linter's job (:mod:`pdctl.sdk.lint`), so that each problem gets a code, a cost
and a fix instead of a bare validation error.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

Mode = Literal["push", "pull", "colocated"]
Platform = Literal["gpu", "cpu"]
Role = Literal["prefill", "decode"]
FailurePolicy = Literal["fail", "recompute"]
ConnectorChoice = Literal["pdctl", "stock"]
RouterPath = Literal["text", "tokens"]
RenderFallback = Literal["error", "text"]
RouterPolicy = Literal["round_robin", "least_loaded", "power_of_two", "cache_aware"]
RestartMode = Literal["never", "on-failure"]
HashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]

Port = Annotated[int, Field(ge=1, le=65535)]
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENGINE_ID_FIELDS = ("name", "role", "group", "index", "host")


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelSpec(_Strict):
    """What every instance serves."""

    path: str = Field(description="Local directory (``~`` is expanded) or a model name.")
    served_name: str | None = Field(
        default=None, description="Name clients ask for; defaults to the path's last part."
    )
    dtype: str = Field(default="auto", description="vLLM ``--dtype``.")
    kv_cache_dtype: str = Field(default="auto", description="vLLM ``--kv-cache-dtype``.")
    max_model_len: int | None = Field(default=None, ge=16)
    trust_remote_code: bool = False

    @field_validator("path")
    @classmethod
    def _path_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a local model directory or a model name")
        return v

    @property
    def effective_served_name(self) -> str:
        if self.served_name:
            return self.served_name
        return self.path.rstrip("/").rsplit("/", 1)[-1]


class UcxSpec(_Strict):
    """UCX transport settings, passed to every instance as environment variables."""

    tls: str | None = Field(default=None, description="``UCX_TLS``; unset lets UCX choose.")
    net_devices: str | None = Field(default=None, description="``UCX_NET_DEVICES``.")
    env: dict[str, str] = Field(default_factory=dict, description="Other ``UCX_*`` variables.")

    @field_validator("env")
    @classmethod
    def _ucx_prefix(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not k.startswith("UCX_")]
        if bad:
            raise ValueError(f"keys must start with UCX_ (got {', '.join(sorted(bad))})")
        return v


class FleetSettings(_Strict):
    """Fleet-wide transfer settings; the same on every instance by construction."""

    name: str = Field(default="pdctl", description="Prefix for state and default engine ids.")
    mode: Mode = "push"
    platform: Platform = "gpu"
    block_size: int | None = Field(
        default=None, ge=1, description="KV block size in tokens; default 128 (GPU), 32 (CPU)."
    )
    kv_buffer_device: Literal["cuda", "cpu"] | None = Field(
        default=None, description="Where NIXL registers KV; default cuda (GPU), cpu (CPU)."
    )
    kv_lease_duration_s: int = Field(
        default=120,
        ge=6,
        description="Whole seconds P keeps finished blocks for D (same on both sides; "
        "vLLM heartbeats every lease/6 s, so at least 6).",
    )
    push_registration_timeout_s: float = Field(
        default=120.0, gt=0, description="D's watchdog for a push that never arrives."
    )
    failure_policy: FailurePolicy = Field(
        default="fail", description="kv_load_failure_policy: 'fail' (HTTP 500) or 'recompute'."
    )
    nixl_backends: list[str] = Field(default_factory=lambda: ["UCX"], min_length=1)
    nixl_num_threads: int = Field(default=4, ge=1)
    ucx: UcxSpec = Field(default_factory=UcxSpec)
    enable_prefix_caching: bool | None = Field(
        default=None, description="None keeps vLLM's default; false for honest benchmarks."
    )
    kv_events: bool | None = Field(
        default=None,
        description="Every instance publishes its KV cache events (vLLM's "
        "--kv-events-config, a ZMQ publisher and replay socket per instance) for the "
        "router's prefix index; default: on when router.policy is 'cache_aware'.",
    )
    kv_events_port_base: Port = Field(
        default=5557,
        description="First port tried for the KV event publishers; each instance takes "
        "two (publisher, replay), planned per host like the other ports.",
    )
    prefix_caching_hash_algo: HashAlgo = Field(
        default="sha256",
        description="vLLM's --prefix-caching-hash-algo on every instance; the router "
        "hashes prompts the same way to look them up in the instances' caches.",
    )
    python: str | None = Field(
        default=None,
        description="Interpreter for the CPU entry point; default: the one running pdctl.",
    )
    connector: ConnectorChoice = Field(
        default="pdctl",
        description="'pdctl': vLLM's NIXL connector extended by pdctl.connector (rendezvous "
        "metrics on /metrics, the CPU knobs); 'stock': vLLM's own, unchanged.",
    )
    cpu_tuning: bool = Field(
        default=True,
        description="On CPU: no NIXL progress-thread spinning, no KV core re-pinning "
        "(kv_connector_extra_config knobs of the pdctl connector).",
    )
    connector_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="More kv_connector_extra_config keys for pdctl's connector, merged "
        "last, e.g. pdctl_flight_records = 1024 or pdctl_nixl_sync_mode = 'strict' "
        "(docs/connector.md); pdctl_failpoint_* keys are for tests only.",
    )
    cpu_kvcache_gib: int | None = Field(
        default=None, ge=1, description="VLLM_CPU_KVCACHE_SPACE (GiB) on the CPU platform."
    )
    vllm_args: list[str] = Field(default_factory=list, description="Extra args, every instance.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra env, every instance.")

    @field_validator("nixl_backends")
    @classmethod
    def _backends_upper(cls, v: list[str]) -> list[str]:
        return [b.strip().upper() for b in v]

    @property
    def effective_block_size(self) -> int:
        if self.block_size is not None:
            return self.block_size
        return 32 if self.platform == "cpu" else 128

    @property
    def effective_kv_buffer_device(self) -> str:
        if self.kv_buffer_device is not None:
            return self.kv_buffer_device
        return "cpu" if self.platform == "cpu" else "cuda"


def _group_name_shape(v: str | None) -> str | None:
    if v is not None and not _NAME_RE.match(v):
        raise ValueError(
            "use lowercase letters, digits and '-' (not at the ends), e.g. 'prefill-a'"
        )
    return v


def _non_negative_unique(v: list[int] | None) -> list[int] | None:
    if v is None:
        return v
    if any(d < 0 for d in v):
        raise ValueError("indices must be >= 0")
    if len(set(v)) != len(v):
        raise ValueError("indices must not repeat")
    return v


class _Restartable(_Strict):
    """What the supervisor does when an instance of the group fails after it was ready:
    it exits (with any code, 0 included: the supervisor did not ask it to), or its API
    server stays up with a dead engine. Restarts wait ``restart_backoff_s``, doubling
    with each restart still inside the window (at most 60 s); more than
    ``max_restarts`` within ``restart_window_s`` is a crash loop and the supervisor
    gives up."""

    restart: RestartMode = Field(
        default="on-failure",
        description="'on-failure': restart a failed instance (with backoff); 'never': "
        "leave it exited.",
    )
    restart_backoff_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Wait before the first restart; doubles with each restart in the "
        "window, capped at 60 s.",
    )
    max_restarts: int = Field(
        default=5,
        ge=1,
        description="Restarts allowed within restart_window_s before the supervisor gives "
        "up (a crash loop); use restart = 'never' for none.",
    )
    restart_window_s: float = Field(
        default=300.0, gt=0, description="The sliding window max_restarts counts in."
    )


class InstanceGroup(_Restartable):
    """``count`` identical prefill or decode instances on one host."""

    name: str | None = Field(
        default=None, description="Group name; instances are '<name>-<index>'."
    )
    host: str = Field(
        default="127.0.0.1", description="Address the HTTP server binds and is reached at."
    )
    count: int = Field(default=1, ge=1, le=1024)
    tp: int = Field(default=1, ge=1, description="Tensor-parallel size.")
    pp: int = Field(default=1, ge=1, description="Pipeline-parallel size.")
    dp: int = Field(default=1, ge=1, description="Data-parallel size inside one instance.")
    devices: list[int] | None = Field(
        default=None, description="GPU indices for the whole group (tp*pp*dp per instance)."
    )
    cpu_cores: list[int] | None = Field(
        default=None, description="CPU cores for the whole group (split evenly per instance)."
    )
    http_port: Port | None = Field(default=None, description="First instance's HTTP port.")
    side_channel_port: Port | None = Field(
        default=None, description="First instance's NIXL side-channel port (spaced by dp)."
    )
    side_channel_host: str | None = Field(
        default=None, description="VLLM_NIXL_SIDE_CHANNEL_HOST; defaults to host."
    )
    engine_id: str = Field(
        default="{name}",
        description="Pattern with {name} {role} {group} {index} {host}.",
    )
    block_size: int | None = Field(default=None, ge=1, description="Overrides fleet.block_size.")
    mode: Mode | None = Field(default=None, description="Overrides fleet.mode (lint flags mixing).")
    max_num_seqs: int | None = Field(default=None, ge=1)
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    _name_shape = field_validator("name")(classmethod(lambda cls, v: _group_name_shape(v)))
    _indices = field_validator("devices", "cpu_cores")(
        classmethod(lambda cls, v: _non_negative_unique(v))
    )

    @field_validator("engine_id")
    @classmethod
    def _engine_id_pattern(cls, v: str) -> str:
        for field in re.findall(r"{([^{}]*)}", v):
            if field not in ENGINE_ID_FIELDS:
                known = ", ".join("{" + f + "}" for f in ENGINE_ID_FIELDS)
                raise ValueError(f"unknown placeholder {{{field}}}; use {known}")
        return v

    @property
    def ranks(self) -> int:
        """Worker ranks (devices) one instance of this group needs."""
        return self.tp * self.pp * self.dp


class RenderGroup(_Restartable):
    """``count`` GPU-less render servers (tokenize before, detokenize after the engines):
    vLLM's ``launch render``; the router's ``tokens`` path uses them."""

    name: str | None = Field(default=None, description="Group name (default 'render').")
    host: str = Field(
        default="127.0.0.1", description="Address the server binds and is reached at."
    )
    count: int = Field(default=1, ge=1, le=256)
    http_port: Port | None = Field(default=None, description="First instance's HTTP port.")
    cpu_cores: list[int] | None = Field(
        default=None, description="CPU cores for the whole group (split evenly per instance)."
    )
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    _name_shape = field_validator("name")(classmethod(lambda cls, v: _group_name_shape(v)))
    _cores = field_validator("cpu_cores")(classmethod(lambda cls, v: _non_negative_unique(v)))


class ApiKeySpec(_Strict):
    """Where the router reads the API key clients must present; never the key itself."""

    env: str | None = Field(default=None, description="Environment variable holding the key.")
    file: str | None = Field(default=None, description="File holding the key (first line).")

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeySpec:
        if self.env and self.file:
            raise ValueError("give either env or file, not both")
        return self


class RouterSpec(_Strict):
    host: str = "127.0.0.1"
    port: Port = 8000
    policy: RouterPolicy = "round_robin"
    concurrent: bool = Field(
        default=True, description="Dispatch both legs at once in push mode (the point of push)."
    )
    connect_timeout_s: float = Field(default=5.0, gt=0)
    prefill_timeout_s: float = Field(default=120.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    api_key: ApiKeySpec | None = None
    path: RouterPath = Field(
        default="text",
        description="'text': OpenAI requests go to the engines as they are; 'tokens': a "
        "render server tokenizes once, the engines get token ids on /inference/v1/generate "
        "and the render server turns the output back into an OpenAI response.",
    )
    disaggregate_min_tokens: int = Field(
        default=0,
        ge=0,
        description="tokens path: prompts with fewer tokens go to decode alone (no prefill, "
        "no KV transfer); 0 disaggregates every prompt.",
    )
    disaggregate_min_uncached_tokens: int = Field(
        default=0,
        ge=0,
        description="cache_aware: a prompt whose tokens not already cached on the chosen "
        "decode number at most this goes to decode alone (no prefill, no KV transfer); "
        "0 disaggregates every prompt.",
    )
    cache_weight_prefix: float = Field(
        default=1.0,
        ge=0,
        description="cache_aware: weight of the cached share of the prompt (0-1) in an "
        "instance's score.",
    )
    cache_weight_load: float = Field(
        default=0.25,
        ge=0,
        description="cache_aware: weight of each request in flight on an instance, "
        "subtracted from its score (0.25: a whole-prompt hit outweighs 3 more in flight).",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector base URL (e.g. 'http://127.0.0.1:4318'): the router "
        "exports its spans (route, legs, render, migration) to <url>/v1/traces and every vLLM "
        "instance gets --otlp-traces-endpoint <url>/v1/traces, so one request is one trace. "
        "Needs OpenTelemetry ('pdctl[otel]').",
    )
    render_fallback: RenderFallback = Field(
        default="error",
        description="tokens path, no render server answering: 'error' (503) or 'text' "
        "(route the request on the text path instead).",
    )
    unavailable_wait_s: float = Field(
        default=10.0,
        ge=0,
        description="When no healthy instance of a role is available (one restarting, "
        "say), hold a request up to this long for one to come back before answering 503; "
        "0 answers at once.",
    )
    prefill_retries: int = Field(
        default=1,
        ge=0,
        le=3,
        description="A prefill that fails before answering (connection lost, 5xx) is "
        "retried this many times on another prefill, with a fresh decode registration.",
    )
    migration_limit: int = Field(
        default=1,
        ge=0,
        le=8,
        description="A decode that fails mid-answer: continue the request on another "
        "decode from the prompt plus the tokens already sent, at most this many times per "
        "request (text path, one choice); 0 ends the stream with an error event.",
    )

    @property
    def otlp_traces_url(self) -> str | None:
        """The OTLP/HTTP traces URL of ``otlp_endpoint`` (``<url>/v1/traces``)."""
        if not self.otlp_endpoint:
            return None
        e = self.otlp_endpoint.rstrip("/")
        return e if e.endswith("/v1/traces") else e + "/v1/traces"

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(
                f"{v!r} is not an http(s) URL; write the collector's OTLP/HTTP address, "
                "e.g. 'http://127.0.0.1:4318'"
            )
        return v


_DURATION_RE = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


class ObservabilitySpec(_Strict):
    """The operator's monitoring stack: a local Prometheus scraping the fleet, the router's
    OpenTelemetry traces."""

    prometheus: bool = Field(
        default=False,
        description="`pdctl up` also starts a Prometheus (the `prometheus` binary) scraping "
        "every instance and the router with pdctl's alert rules, supervised like an instance.",
    )
    prometheus_host: str = Field(default="127.0.0.1", description="Where it listens.")
    prometheus_port: Port = Field(default=9090, description="Its HTTP port (UI and API).")
    prometheus_bin: str = Field(
        default="prometheus", description="The Prometheus binary (a name on PATH or a path)."
    )
    scrape_interval: str = Field(
        default="5s", description="Scrape and rule evaluation interval (a Prometheus duration)."
    )
    retention: str = Field(default="15d", description="How long it keeps samples.")

    @field_validator("scrape_interval", "retention")
    @classmethod
    def _duration(cls, v: str) -> str:
        if not _DURATION_RE.match(v):
            raise ValueError(f"{v!r} is not a Prometheus duration; write e.g. '5s', '1m', '15d'")
        return v


BackendKind = Literal["local", "k8s", "ray"]
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_QUALIFIED_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
RESERVED_LABEL_PREFIXES = ("pdctl.io/", "app.kubernetes.io/managed-by")


def is_dns_label(name: str) -> bool:
    """A valid name for any Kubernetes object, Services included (an RFC 1123 label)."""
    return len(name) <= 63 and bool(_NAME_RE.match(name))


class Toleration(_Strict):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


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
    router_service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    cluster_domain: str = "cluster.local"
    labels: dict[str, str] = Field(default_factory=dict, description="Added to every object.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to every pod.")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not is_dns_label(v):
            raise ValueError("use lowercase letters, digits and '-' (at most 63), e.g. 'llm'")
        return v

    @field_validator("cpu", "memory", "shm_size")
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


class _InitOnly(BaseSettings):
    """Settings whose only source is the merged dict pdctl builds itself.

    pdctl merges file, environment and ``--set`` layers in :mod:`pdctl.sdk.specload`
    (so that list indices such as ``prefill.0.tp`` work in every layer); validation then
    happens here in one go.
    """

    model_config = SettingsConfigDict(
        env_prefix="PDCTL_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class FleetSpec(_InitOnly):
    """A whole fleet: model, transfer settings, prefill and decode groups, router."""

    model: ModelSpec
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    prefill: list[InstanceGroup] = Field(default_factory=list)
    decode: list[InstanceGroup] = Field(default_factory=list)
    router: RouterSpec | None = None
    backend: BackendSpec = Field(default_factory=BackendSpec)
    render: list[RenderGroup] = Field(
        default_factory=list, description="GPU-less render servers for the tokens path."
    )
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)

    @model_validator(mode="after")
    def _groups(self) -> FleetSpec:
        if not self.prefill and not self.decode:
            raise ValueError(
                "the fleet has no instances: add at least one [[prefill]] and one [[decode]] table"
            )
        seen: dict[str, str] = {}
        for role, groups in (("prefill", self.prefill), ("decode", self.decode)):
            for i, g in enumerate(groups):
                gname = group_name(role, i, g, len(groups))
                where = f"{role}[{i}].name"
                if gname in seen:
                    raise ValueError(
                        f"{where}: group name {gname!r} is already used by {seen[gname]}; "
                        "give each group a distinct name"
                    )
                seen[gname] = where
        for i, r in enumerate(self.render):
            rname = render_group_name(i, r, len(self.render))
            if rname in seen:
                raise ValueError(
                    f"render[{i}].name: group name {rname!r} is already used by {seen[rname]}"
                )
            seen[rname] = f"render[{i}].name"
        if self.router is not None and self.router.path == "tokens" and not self.render:
            raise ValueError(
                "router.path = 'tokens' needs a render server: add a [[render]] table "
                "(or set router.path = 'text')"
            )
        return self

    @property
    def kv_events_on(self) -> bool:
        """Whether instances publish KV cache events: ``fleet.kv_events``, by default on
        with the cache-aware router policy (unless prefix caching is off)."""
        if self.fleet.kv_events is not None:
            return self.fleet.kv_events
        cache_aware = self.router is not None and self.router.policy == "cache_aware"
        return cache_aware and self.fleet.enable_prefix_caching is not False

    def groups(self) -> list[tuple[Role, int, InstanceGroup]]:
        """All groups in plan order: prefill groups first, then decode groups."""
        out: list[tuple[Role, int, InstanceGroup]] = []
        out.extend(("prefill", i, g) for i, g in enumerate(self.prefill))
        out.extend(("decode", i, g) for i, g in enumerate(self.decode))
        return out


def group_name(role: str, index: int, group: InstanceGroup, n_groups: int) -> str:
    """A group's name: explicit, else the role (one group) or role + letter (several)."""
    if group.name:
        return group.name
    if n_groups == 1:
        return role
    return f"{role}-{_letters(index)}"


def render_group_name(index: int, group: RenderGroup, n_groups: int) -> str:
    if group.name:
        return group.name
    return "render" if n_groups == 1 else f"render-{_letters(index)}"


def _letters(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def spec_json_schema() -> dict[str, Any]:
    """JSON schema of the spec, for editors and docs."""
    return FleetSpec.model_json_schema()
