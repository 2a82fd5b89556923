"""The router's front desk: keys (:mod:`.auth`), rate limits (:mod:`.limits`) and the
audit log (:mod:`.audit`) composed into one object. The HTTP layer asks it who this is
and whether they may (:meth:`Guard.check`), asks its :attr:`Guard.limits` whether a
completion may start now (:meth:`~pdctl.sdk.router.limits.Limiter.admit`), and has it
record each control action (:meth:`Guard.control_done`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdctl.sdk.keys import key_sources
from pdctl.sdk.router.audit import AuditLog
from pdctl.sdk.router.auth import ANONYMOUS, KeyRing, Principal, Verdict
from pdctl.sdk.router.limits import Clock, Limiter
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.spec import RouterSpec

Scope = Mapping[str, Any]


class Guard:
    def __init__(
        self,
        keys: KeyRing,
        registry: Registry,
        *,
        tenants: Mapping[str, Any] | None = None,
        audit: AuditLog | None = None,
        clock: Clock | None = None,
        control_needs_client_cert: bool = False,
        share: float = 1.0,
    ) -> None:
        """``control_needs_client_cert``: mTLS on the admin endpoints (the TLS layer
        verified the certificate; see :mod:`.hardening`). ``share``: the part of every
        rate limit this process enforces (:class:`~.limits.Limiter`)."""
        self.keys = keys
        self.control_needs_client_cert = control_needs_client_cert
        self.audit = audit if audit is not None else AuditLog(None)
        # an unguarded router admits every request as the anonymous tenant
        known = {p.tenant for p in keys.principals} or {ANONYMOUS.tenant}
        kw = {"clock": clock} if clock is not None else {}
        self.limits = Limiter(registry, tenants or {}, keys.key_limits(), known, share=share, **kw)
        self.auth_failures = registry.counter(
            "pdctl_router_auth_failures_total",
            "Requests refused for a missing or wrong key (401) or a key's role (403).",
            ["reason"],
        )
        self.auth_failures.prime(("missing_key", "wrong_key", "role", "client_cert"))

    @classmethod
    def from_spec(
        cls,
        rs: RouterSpec,
        registry: Registry,
        *,
        environ: Mapping[str, str] | None = None,
        audit_path: str | None = None,
        share: float = 1.0,
    ) -> Guard:
        """Read every key (:class:`~pdctl.sdk.keys.KeySourceError` names a bad one)."""
        keys = KeyRing.from_sources(key_sources(rs), environ)
        path = rs.audit.path or audit_path
        audit = AuditLog(path, max_bytes=rs.audit.max_bytes, backups=rs.audit.backups)
        mtls = rs.tls is not None and bool(rs.tls.client_ca_file)
        return cls(
            keys,
            registry,
            tenants=rs.tenants,
            audit=audit,
            control_needs_client_cert=mtls,
            share=share,
        )

    def check(self, scope: Scope) -> Verdict:
        """Authenticate one HTTP request; refusals are counted and audited."""
        endpoint = scope["path"]
        v = self.keys.check(endpoint, _header(scope, b"authorization"))
        if v.ok and v.access == "admin" and self.control_needs_client_cert:
            subject = scope.get("extensions", {}).get("tls", {}).get("client_cert_subject")
            if not subject:
                v = Verdict(
                    v.principal,
                    403,
                    "the control endpoints need a client certificate signed by "
                    "router.tls.client_ca_file (mTLS)",
                    "client_cert",
                    v.access,
                )
        if not v.ok:
            self.auth_failures.inc(v.reason)
            who = v.principal
            self.audit.record(
                who=who.name if who is not None else "-",
                tenant=who.tenant if who is not None else None,
                action=f"{scope['method']} {endpoint}",
                peer=peer(scope),
                result=v.status,
                detail={"reason": v.reason},
            )
        return v

    def control_done(self, who: Principal | None, scope: Scope, request: Any, status: int) -> None:
        p = who or ANONYMOUS
        self.audit.record(
            who=p.name,
            tenant=p.tenant if who is not None and p is not ANONYMOUS else None,
            action=f"{scope['method']} {scope['path']}",
            peer=peer(scope),
            result=status,
            detail={"request": request} if request is not None else None,
        )


def peer(scope: Scope) -> str:
    client = scope.get("client")
    if not client:
        return "-"
    host, port = client[0], client[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None
