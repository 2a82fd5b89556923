"""The router's keys, tenants' rate limits and audit log: ``[[router.keys]]``,
``[router.tenants.NAME]`` and ``router.audit_log``. The spec names where a key is read
(an environment variable or a file, e.g. a mounted Secret), never the key itself, except
``value`` for throwaway specs, which lint flags."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pdctl.sdk.spec.base import _Strict

KeyRole = Literal["admin", "inference"]


class RateLimitSpec(_Strict):
    """A token bucket per tenant or per key: ``*_per_s`` is the refill rate, ``burst_s``
    how many seconds of it may be spent at once. 0 (the default) means no limit."""

    requests_per_s: float = Field(default=0.0, ge=0, description="Requests per second.")
    tokens_per_s: float = Field(
        default=0.0,
        ge=0,
        description="Prompt plus completion tokens per second (reserved from the request's "
        "max_tokens and prompt on admission, settled from the answer's usage).",
    )
    burst_s: float = Field(
        default=1.0,
        gt=0,
        description="Bucket size in seconds of the rate (1: at most one second's worth at once).",
    )

    @property
    def limited(self) -> bool:
        return self.requests_per_s > 0 or self.tokens_per_s > 0


class RouterKeySpec(_Strict):
    """One key clients present as ``Authorization: Bearer KEY``."""

    name: str = Field(min_length=1, description="What the audit log and metrics call this key.")
    role: KeyRole = Field(
        default="inference",
        description="'inference': completions and models; 'admin': also the control "
        "endpoints (/v1/pdctl/...) and the request history.",
    )
    tenant: str | None = Field(
        default=None, description="Whose traffic this is (rate limits, metrics); default: name."
    )
    env: str | None = Field(default=None, description="Environment variable holding the key.")
    file: str | None = Field(
        default=None, description="File holding the key (first line), e.g. a mounted Secret."
    )
    value: str | None = Field(
        default=None,
        description="The key itself. Only for throwaway specs: lint warns (PD046), since a "
        "committed spec would publish it.",
    )
    limits: RateLimitSpec = Field(
        default_factory=RateLimitSpec, description="This key's own limits."
    )

    @model_validator(mode="after")
    def _one_source(self) -> RouterKeySpec:
        given = [s for s in ("env", "file", "value") if getattr(self, s)]
        if len(given) != 1:
            raise ValueError(
                f"key {self.name!r}: give exactly one of env, file or value "
                f"(got {', '.join(given) or 'none'})"
            )
        return self

    @property
    def tenant_name(self) -> str:
        return self.tenant or self.name


class AuditSpec(_Strict):
    """Where the router writes its audit log (JSON lines, rotated)."""

    path: str | None = Field(
        default=None,
        description="File to write; '-' for standard error. Default: router-audit.jsonl "
        "next to the router's spec file (the fleet's run directory), else standard error "
        "(the pod's log).",
    )
    max_bytes: int = Field(default=10 << 20, ge=4096, description="Rotate past this size.")
    backups: int = Field(default=5, ge=0, description="Rotated files kept.")


class HttpLimitsSpec(_Strict):
    """What the router accepts from one client connection (``[router.http]``)."""

    max_header_bytes: int = Field(
        default=16 * 1024, ge=1024, description="Request line plus headers (431 above)."
    )
    max_headers: int = Field(default=100, ge=8, description="Header fields (431 above).")
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A new connection must send a whole request head within this (408).",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="A request body must arrive within this (408)."
    )
    idle_timeout_s: int = Field(
        default=30, ge=1, description="An idle keep-alive connection is closed after this."
    )
    max_connections: int = Field(
        default=4096,
        ge=16,
        description="Past this a new connection closes the longest-idle one (503 when all "
        "are busy).",
    )
    max_json_depth: int = Field(
        default=64, ge=4, description="Nesting depth of a JSON request body (400 above)."
    )


class TlsSpec(_Strict):
    """HTTPS for the router (``[router.tls]``): files, e.g. a mounted Secret."""

    cert_file: str = Field(description="PEM certificate chain the router presents.")
    key_file: str = Field(description="Its PEM private key.")
    client_ca_file: str | None = Field(
        default=None,
        description="PEM CA bundle: clients presenting a certificate it signed may use the "
        "admin endpoints (mTLS); see client_cert.",
    )
    client_cert: Literal["control", "all"] = Field(
        default="control",
        description="With client_ca_file: 'control' asks every client for a certificate "
        "but needs one only on /v1/pdctl/ (with an admin key); 'all' refuses the TLS "
        "handshake without one.",
    )
