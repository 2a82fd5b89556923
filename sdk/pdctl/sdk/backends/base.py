"""What every backend offers: bring a fleet up, take it down, report each instance.

A backend turns the same spec into running instances somewhere (this machine, a
Kubernetes cluster, a Ray cluster). Status comes back as the launcher's
:class:`~pdctl.sdk.fleet.events.InstanceStatus` records, and :meth:`Backend.endpoints`
gives the launch plan with every instance at the address it is reached at, which is all
the router and the monitor need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from pdctl.sdk.errors import LaunchError
from pdctl.sdk.fleet.events import InstanceStatus
from pdctl.sdk.fleetplan import FleetPlan
from pdctl.sdk.spec import FleetSpec

DEFAULT_READY_TIMEOUT = 180.0
DEFAULT_GRACE = 10.0


class BackendError(LaunchError):
    """A backend cannot do what was asked (tool missing, cluster unreachable, …)."""


@dataclass(frozen=True)
class BackendStatus:
    """A fleet as one backend sees it."""

    fleet: str
    backend: str
    where: str
    """Where it runs: a state directory, ``context/namespace``, a Ray address."""
    instances: list[InstanceStatus] = field(default_factory=list)

    @property
    def all_ready(self) -> bool:
        return bool(self.instances) and all(i.state == "ready" for i in self.instances)

    def not_ready(self) -> list[InstanceStatus]:
        return [i for i in self.instances if i.state != "ready"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "backend": self.backend,
            "where": self.where,
            "instances": [i.as_dict() for i in self.instances],
        }


@runtime_checkable
class Backend(Protocol):
    """One way of running a fleet. Implementations take the spec (and their own options)
    in their constructor; :func:`pdctl.sdk.backends.open_backend` builds them by kind."""

    kind: ClassVar[str]
    spec: FleetSpec

    async def up(self, *, wait: bool = True) -> None:
        """Start every instance (and the router); with ``wait``, return once all are ready
        or raise :class:`~pdctl.sdk.errors.LaunchError` naming those that are not."""
        ...

    async def down(self) -> str:
        """Stop and remove everything of this fleet; returns a one-line summary.
        Idempotent: a fleet that is not running is not an error."""
        ...

    async def status(self) -> BackendStatus:
        """A fresh snapshot of every instance: ready | starting | unhealthy | exited | …"""
        ...

    def endpoints(self) -> FleetPlan:
        """The launch plan with each instance at the address the router reaches it at."""
        ...
