"""Backends: the same fleet spec run on this machine (``local``), on Kubernetes
(``k8s``) or on Ray (``ray``), behind one :class:`Backend` interface.

:func:`open_backend` builds the one a spec (or the caller) asks for. Modules of a
backend are imported only when it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdctl.sdk.backends.base import (
    DEFAULT_GRACE,
    DEFAULT_READY_TIMEOUT,
    Backend,
    BackendError,
    BackendStatus,
)
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.spec import BackendKind, FleetSpec

BackendFactory = Callable[..., Backend]


def _local(spec: FleetSpec, **kw: Any) -> Backend:
    from pdctl.sdk.backends.local import LocalBackend

    return LocalBackend(spec, **kw)


def _k8s(spec: FleetSpec, **kw: Any) -> Backend:
    from pdctl.sdk.backends.k8s import K8sBackend

    kw.pop("grace", None)  # the cluster's terminationGracePeriodSeconds applies
    return K8sBackend(spec, **kw)


def _ray(spec: FleetSpec, **kw: Any) -> Backend:
    from pdctl.sdk.backends.ray import RayBackend

    return RayBackend(spec, **kw)


FACTORIES: dict[str, BackendFactory] = {"local": _local, "k8s": _k8s, "ray": _ray}
"""Backend kind → factory(spec, *, source, ready_timeout, grace)."""


def open_backend(
    spec: FleetSpec,
    kind: BackendKind | None = None,
    *,
    source: str = "<spec>",
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    grace: float = DEFAULT_GRACE,
) -> Backend:
    """The backend ``kind`` (default: the spec's ``backend.kind``) for this spec."""
    chosen = kind or spec.backend.kind
    factory = FACTORIES.get(chosen)
    if factory is None:
        have = ", ".join(sorted(FACTORIES))
        raise BackendError(f"the {chosen!r} backend is not available here (have: {have})")
    return factory(spec, source=source, ready_timeout=ready_timeout, grace=grace)


__all__ = [
    "FACTORIES",
    "Backend",
    "BackendError",
    "BackendStatus",
    "observed",
    "open_backend",
]


def observed(spec: FleetSpec) -> tuple[FleetSpec, FleetPlan]:
    """The spec and plan to watch a running fleet with (metrics stream, UI): the spec as
    written on this machine; where the backend put it otherwise (Ray: node addresses;
    k8s: in-cluster DNS names, reachable from inside the cluster or a port-forward)."""
    from pdctl.sdk.lint import lint, require_clean

    if spec.backend.kind == "local":
        return spec, require_clean(lint(spec, check_bound_ports=False))
    backend = open_backend(spec)
    resolved = getattr(backend, "resolved", None)
    placed = resolved() if callable(resolved) else spec
    return (placed if isinstance(placed, FleetSpec) else spec), backend.endpoints()
