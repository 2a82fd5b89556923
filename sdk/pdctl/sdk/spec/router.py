"""The router: ``[router]`` and where it reads its API key."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pdctl.sdk.spec.admission import AdmissionSpec
from pdctl.sdk.spec.base import Port, RenderFallback, RouterPath, RouterPolicy, _Strict
from pdctl.sdk.spec.security import (
    AuditSpec,
    HttpLimitsSpec,
    RateLimitSpec,
    RouterKeySpec,
    TlsSpec,
)


class ApiKeySpec(_Strict):
    """Where the router reads the API key clients must present; never the key itself."""

    env: str | None = Field(default=None, description="Environment variable holding the key.")
    file: str | None = Field(default=None, description="File holding the key (first line).")

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeySpec:
        if self.env and self.file:
            raise ValueError("give either env or file, not both")
        return self


CanaryTarget = Literal["decode", "prefill", "reference"]


class CanarySpec(_Strict):
    """The live output canary (``[router.canary]``): a sampled share of greedy requests
    replayed on one instance alone, their answers compared (docs/router.md)."""

    rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of greedy (temperature 0) disaggregated requests replayed after "
        "their answer is sent and compared with it; 0 (the default) turns the canary off. "
        "Each replay costs one more full request on the fleet.",
    )
    target: CanaryTarget = Field(
        default="decode",
        description="Where the replay runs, colocated-style (no KV transfer, prefix cache "
        "bypassed): 'decode' (the pair's decode: a divergence then points at the KV that "
        "arrived), 'prefill' (the pair's prefill) or 'reference' (reference_url).",
    )
    reference_url: str | None = Field(
        default=None,
        description="target = 'reference': an OpenAI-compatible server of the same model "
        "(http://host:port) that the replays go to.",
    )
    concurrency: int = Field(
        default=2, ge=1, le=64, description="Replays in flight at most; more are dropped."
    )
    busy_outstanding: int = Field(
        default=4,
        ge=1,
        description="A replay is dropped when its instance already has this many legs in "
        "flight (the fleet is busy: the canary never queues behind clients).",
    )
    timeout_s: float = Field(default=120.0, gt=0, description="A replay's deadline.")
    tie_tolerance: float = Field(
        default=0.05,
        ge=0.0,
        description="On a pair whose prefill and decode TP sizes differ (they do not "
        "compute bit for bit alike), a first difference is counted 'tied', not "
        "'diverged', when the answer's token there is one of the replay's top "
        "candidates within this many nats of log-probability of the replay's choice; "
        "0 counts every difference as diverged. Equal-TP pairs are always compared "
        "exactly.",
    )

    @field_validator("reference_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^http://[^/\s]+/?$", v):
            raise ValueError(
                f"{v!r} is not an http://host:port address; write the reference server's "
                "base URL, e.g. 'http://127.0.0.1:9000'"
            )
        return v.rstrip("/") if v is not None else v

    @model_validator(mode="after")
    def _reference_given(self) -> CanarySpec:
        if self.target == "reference" and self.reference_url is None:
            raise ValueError(
                "router.canary.target = 'reference' needs router.canary.reference_url "
                "(the server to replay on); or choose target = 'decode'"
            )
        return self


class RouterSpec(_Strict):
    host: str = "127.0.0.1"
    port: Port = 8000
    workers: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Router processes sharing the port (SO_REUSEPORT), each a complete "
        "router; a parent process restarts one that dies and keeps control changes, /metrics "
        "and /v1/pdctl/requests one view across them. Default: the CPUs the router may use "
        "(its CPU affinity, capped by a cgroup CPU quota), at most 16; 1 is a single process.",
    )
    policy: RouterPolicy = "round_robin"
    concurrent: bool = Field(
        default=True, description="Dispatch both legs at once in push mode (the point of push)."
    )
    connect_timeout_s: float = Field(default=5.0, gt=0)
    prefill_timeout_s: float = Field(default=120.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    api_key: ApiKeySpec | None = Field(
        default=None,
        description="One key for everything (an admin key named 'default'); prefer "
        "[[router.keys]], which adds roles and tenants.",
    )
    keys: list[RouterKeySpec] = Field(
        default_factory=list,
        description="Keys with roles (admin, inference) and tenants; see docs/security.md.",
    )
    tenants: dict[str, RateLimitSpec] = Field(
        default_factory=dict,
        description="Rate limits per tenant (the keys' tenant names): requests/s, tokens/s.",
    )
    insecure_control: bool = Field(
        default=False,
        description="Let a router bound beyond loopback start with no admin key, its "
        "control endpoints open to the network (lint still warns: PD045).",
    )
    http: HttpLimitsSpec = Field(
        default_factory=HttpLimitsSpec,
        description="Limits on each client connection: header size and count, slow heads "
        "and bodies, idle connections, the connection cap, JSON depth.",
    )
    tls: TlsSpec | None = Field(
        default=None, description="Serve HTTPS (and optionally mTLS on the control endpoints)."
    )
    audit: AuditSpec = Field(
        default_factory=AuditSpec,
        description="The audit log of control actions and failed authentications.",
    )
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
        default=256,
        ge=0,
        description="cache_aware: a prompt whose tokens not already cached on the chosen "
        "decode number at most this goes to decode alone (no prefill, no KV transfer); "
        "0 disaggregates every prompt. Decode holds what it computed and, with its prefix "
        "caching on, the KV pushed to it, so a follow-up sharing a prefix decode already "
        "holds skips the two-leg push. Other policies ignore it.",
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
    canary: CanarySpec = Field(
        default_factory=CanarySpec,
        description="The live output canary: a sampled share of greedy requests replayed "
        "on one instance alone and compared, divergence counted per P->D pair (off: "
        "rate = 0).",
    )
    admission: AdmissionSpec = Field(
        default_factory=AdmissionSpec,
        description="Admission control: bounded in-flight per stage, a priority queue, "
        "saturation from the instances' gauges, a default first-byte deadline "
        "(docs/router.md, 'Overload').",
    )
    release_kv_on_failure: bool = Field(
        default=True,
        description="Push fleets on pdctl's connector: when a disaggregated request ends "
        "without decode reading its KV (decode failed, refused it or was cut off, the client "
        "left), ask the prefill over HTTP to free that KV at once instead of holding it for "
        "its lease. Independent of the P<->D side channel, which may be what failed.",
    )

    @property
    def otlp_traces_url(self) -> str | None:
        """The OTLP/HTTP traces URL of ``otlp_endpoint`` (``<url>/v1/traces``)."""
        if not self.otlp_endpoint:
            return None
        e = self.otlp_endpoint.rstrip("/")
        return e if e.endswith("/v1/traces") else e + "/v1/traces"

    @model_validator(mode="after")
    def _keys_unique(self) -> RouterSpec:
        names = [k.name for k in self.keys]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup or (self.api_key is not None and "default" in names):
            raise ValueError(
                f"router key names must be unique (repeated: {', '.join(dup) or 'default'}; "
                "router.api_key is the key named 'default')"
            )
        tenants = {k.tenant_name for k in self.keys} | ({"default"} if self.api_key else set())
        unknown = sorted(set(self.tenants) - tenants)
        if unknown:
            raise ValueError(
                f"router.tenants names {', '.join(unknown)}, which no key belongs to; "
                "set tenant = ... on a [[router.keys]] entry or remove the limit"
            )
        return self

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(
                f"{v!r} is not an http(s) URL; write the collector's OTLP/HTTP address, "
                "e.g. 'http://127.0.0.1:4318'"
            )
        return v
