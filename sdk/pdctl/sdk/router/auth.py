"""Who is asking, and may they: the router's keys with their roles and tenants.

Three kinds of endpoint: public (``/health``, ``/metrics``), inference (completions,
``/v1/models``) and admin (everything under ``/v1/pdctl/``: control, state, the request
history, the audit log). Inference needs a key once any key is configured; admin needs
an admin key once one is configured (a router with none is loopback-only unless
``router.insecure_control``: :func:`pdctl.sdk.keys.control_exposure`).

A presented key is hashed once and compared with every configured key's hash by
:func:`hmac.compare_digest`, always all of them, so neither the time taken nor an early
exit tells which key (or how much of one) matched. Keys are held only as hashes and
never appear in a repr, a log line or the audit log.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdctl.sdk.keys import KeySource, read_secret
from pdctl.sdk.spec.security import RateLimitSpec

Access = Literal["public", "inference", "admin"]

_INFERENCE = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models"})
_PUBLIC = frozenset({"/health", "/ready", "/metrics"})


def access_for(endpoint: str) -> Access:
    """What ``endpoint`` needs (unknown endpoints are admin: a 404 is not free
    information)."""
    if endpoint in _PUBLIC:
        return "public"
    if endpoint in _INFERENCE:
        return "inference"
    return "admin"


@dataclass(frozen=True)
class Principal:
    """Who a request was made as: the key's name, role and tenant (never the key)."""

    name: str
    role: str
    tenant: str


ANONYMOUS = Principal("anonymous", "none", "anonymous")
"""A request on a router with no key that would guard it."""


@dataclass(frozen=True)
class Verdict:
    """The answer to "may this request go on": ``status`` 0 (:attr:`ok`) means yes;
    ``access`` is the endpoint's kind."""

    principal: Principal | None
    status: int = 0
    message: str = ""
    reason: str = ""
    access: Access = "inference"
    ok: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ok", self.status == 0)


@dataclass(frozen=True)
class _Key:
    principal: Principal
    digest: bytes = field(repr=False)
    limits: RateLimitSpec


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


class KeyRing:
    """The configured keys, checked in constant time."""

    def __init__(self, keys: Iterable[tuple[Principal, bytes, RateLimitSpec]] = ()) -> None:
        self._keys = tuple(_Key(p, _digest(secret), lim) for p, secret, lim in keys)
        self.has_keys = bool(self._keys)
        self.has_admin = any(k.principal.role == "admin" for k in self._keys)

    @classmethod
    def from_sources(
        cls, sources: Sequence[KeySource], environ: Mapping[str, str] | None = None
    ) -> KeyRing:
        """Read every key (:class:`~pdctl.sdk.keys.KeySourceError` names a bad one)."""
        return cls(
            (Principal(s.name, s.role, s.tenant), read_secret(s, environ), s.limits)
            for s in sources
        )

    @classmethod
    def single(cls, secret: bytes) -> KeyRing:
        """One admin key named 'default' (the old ``router.api_key``)."""
        return cls([(Principal("default", "admin", "default"), secret, RateLimitSpec())])

    @property
    def principals(self) -> list[Principal]:
        return [k.principal for k in self._keys]

    def key_limits(self) -> dict[str, RateLimitSpec]:
        return {k.principal.name: k.limits for k in self._keys if k.limits.limited}

    def identify(self, token: bytes | None) -> Principal | None:
        """The key ``token`` is, or None; every key is compared, whatever matched first."""
        if token is None:
            return None
        presented = _digest(token)
        found: Principal | None = None
        for k in self._keys:
            if hmac.compare_digest(presented, k.digest) and found is None:
                found = k.principal
        return found

    def check(self, endpoint: str, authorization: bytes | None) -> Verdict:
        """Decide one request from its endpoint (:func:`access_for`) and ``Authorization``
        header."""
        access = access_for(endpoint)
        if access == "public" or not self.has_keys:
            return Verdict(ANONYMOUS, access=access)
        if access == "admin" and not self.has_admin:
            return Verdict(ANONYMOUS, access=access)
        token = _bearer(authorization)
        who = self.identify(token)
        if who is None:
            reason = "missing_key" if token is None else "wrong_key"
            return Verdict(
                None,
                401,
                "missing API key (send Authorization: Bearer KEY)"
                if token is None
                else "wrong API key",
                reason,
                access,
            )
        if access == "admin" and who.role != "admin":
            return Verdict(
                who,
                403,
                f"key {who.name!r} has role {who.role!r}; this endpoint needs an admin key",
                "role",
                access,
            )
        return Verdict(who, access=access)


def _bearer(value: bytes | None) -> bytes | None:
    if value is None:
        return None
    scheme, _, token = value.partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token
