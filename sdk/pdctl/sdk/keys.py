"""Reading the router's keys from where the spec says they are (an environment variable
or a file such as a mounted Secret), and the one rule about who may reach the control
endpoints: a router bound beyond loopback has an admin key, or says it does not want one.

Pure over the spec and an environment mapping; shared by the router (which checks keys),
the clients and the supervisor (which present the admin key) and lint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pdctl.sdk.apikey import ApiKeyError, read_key
from pdctl.sdk.fleetplan import is_loopback
from pdctl.sdk.spec import FleetSpec, RouterSpec
from pdctl.sdk.spec.security import KeyRole, RateLimitSpec

__all__ = [
    "DEFAULT_KEY_NAME",
    "KeySource",
    "KeySourceError",
    "admin_key",
    "control_exposure",
    "key_sources",
    "read_secret",
    "router_bind_host",
]

DEFAULT_KEY_NAME = "default"
"""The name ``router.api_key`` goes by: an admin key of tenant 'default'."""


KeySourceError = ApiKeyError
"""A key source is configured but unusable (the message names the field and the fix)."""


@dataclass(frozen=True)
class KeySource:
    """One configured key, before it is read: where it lives and what it may do."""

    field: str
    name: str
    role: KeyRole
    tenant: str
    env: str | None
    file: str | None
    value: str | None
    limits: RateLimitSpec


def key_sources(rs: RouterSpec | None) -> list[KeySource]:
    """Every key the router accepts, ``router.api_key`` first (as the admin 'default')."""
    if rs is None:
        return []
    out: list[KeySource] = []
    if rs.api_key is not None and (rs.api_key.env or rs.api_key.file):
        out.append(
            KeySource(
                "router.api_key",
                DEFAULT_KEY_NAME,
                "admin",
                DEFAULT_KEY_NAME,
                rs.api_key.env,
                rs.api_key.file,
                None,
                RateLimitSpec(),
            )
        )
    for i, k in enumerate(rs.keys):
        out.append(
            KeySource(
                f"router.keys[{i}]", k.name, k.role, k.tenant_name, k.env, k.file, k.value, k.limits
            )
        )
    return out


def read_secret(src: KeySource, environ: Mapping[str, str] | None = None) -> bytes:
    """The key's bytes; :class:`KeySourceError` naming the field when it cannot be read."""
    key = read_key(src.field, env=src.env, file=src.file, value=src.value, environ=environ)
    assert key is not None, f"{src.field} names no source"  # key_sources() keeps only those
    return key


def admin_key(spec: FleetSpec, environ: Mapping[str, str] | None = None) -> str | None:
    """The first readable admin key (what pdctl's own tools present), or None."""
    for src in key_sources(spec.router):
        if src.role == "admin":
            try:
                return read_secret(src, environ).decode()
            except KeySourceError:
                continue
    return None


def inference_key(spec: FleetSpec, environ: Mapping[str, str] | None = None) -> str | None:
    """The first readable key that may send completions (an inference key before an
    admin key: a benchmark's traffic should not need control rights), or None."""
    for src in sorted(key_sources(spec.router), key=lambda s: s.role != "inference"):
        try:
            return read_secret(src, environ).decode()
        except KeySourceError:
            continue
    return None


RAY_NODE_ADDRESS = "its Ray node's address"


def router_bind_host(spec: FleetSpec) -> str:
    """Where the router listens: its pod binds every address on Kubernetes; on Ray a
    loopback or wildcard ``router.host`` becomes the address of the node it is placed
    on (:func:`pdctl.sdk.backends.ray.placement.resolve`)."""
    host = spec.router.host if spec.router is not None else "127.0.0.1"
    if spec.backend.kind == "k8s":
        return "0.0.0.0"
    if spec.backend.kind == "ray" and (is_loopback(host) or host in ("0.0.0.0", "::")):
        return RAY_NODE_ADDRESS
    return host


def control_exposure(spec: FleetSpec, host: str | None = None) -> str | None:
    """Why this router's control endpoints would be open to the network, or None.

    Open means: bound (to ``host``, default where the spec binds it) beyond loopback with
    no admin key and no ``insecure_control``.
    """
    rs = spec.router
    if rs is None or rs.insecure_control:
        return None
    host = host or router_bind_host(spec)
    if is_loopback(host) or any(s.role == "admin" for s in key_sources(rs)):
        return None
    return (
        f"the router binds {host} with no admin key, so anyone who can reach it can drain "
        "instances, switch modes and read every request's timeline; add a "
        '[[router.keys]] entry with role = "admin" (key from env or a file/Secret), or set '
        "router.insecure_control = true to accept that"
    )
