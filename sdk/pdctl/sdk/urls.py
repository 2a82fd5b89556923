"""Addresses of a fleet's listeners as URLs a client can use.

One place knows that a wildcard bind address (``0.0.0.0``, ``::``) is reached on
loopback and that an IPv6 address goes in brackets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdctl.sdk.errors import SpecError, SpecProblem

if TYPE_CHECKING:
    from pdctl.sdk.spec import FleetSpec

WILDCARDS = ("0.0.0.0", "::")


def http_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` for a listener bound to ``host``."""
    if host in WILDCARDS:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def router_url(spec: FleetSpec, source: str = "<spec>") -> str:
    """The URL of the fleet's pdctl router; :class:`SpecError` when the spec has none."""
    if spec.router is None:
        raise SpecError(
            source,
            [SpecProblem("router", "this fleet has no router", "add a [router] table")],
        )
    return http_url(spec.router.host, spec.router.port)
