"""The local backend: the existing launcher behind the :class:`Backend` interface."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from pdctl.sdk.backends.base import DEFAULT_GRACE, DEFAULT_READY_TIMEOUT, BackendStatus
from pdctl.sdk.fleet import AsyncFleet, fleet_status, remote_down
from pdctl.sdk.fleetplan import FleetPlan, build_plan
from pdctl.sdk.spec import FleetSpec


class LocalBackend:
    """Instances as processes of this machine, supervised by this process.

    :meth:`up` supervises in-process (as ``pdctl up`` in the foreground does);
    :meth:`down` and :meth:`status` also work on a fleet another process supervises.
    """

    kind: ClassVar[str] = "local"

    def __init__(
        self,
        spec: FleetSpec,
        *,
        source: str = "<spec>",
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        self.spec = spec
        self.source = source
        self.ready_timeout = ready_timeout
        self.grace = grace
        self.fleet: AsyncFleet | None = None

    async def up(self, *, wait: bool = True) -> None:
        self.fleet = AsyncFleet(
            self.spec, source=self.source, ready_timeout=self.ready_timeout, grace=self.grace
        )
        await self.fleet.up(wait=wait)

    async def down(self) -> str:
        if self.fleet is not None:
            await self.fleet.down()
            return "stopped"
        return await asyncio.to_thread(remote_down, self.spec.fleet.name, grace=self.grace)

    async def status(self) -> BackendStatus:
        st = await fleet_status(self.spec.fleet.name)
        return BackendStatus(st.fleet, self.kind, st.state_dir, st.instances)

    def endpoints(self) -> FleetPlan:
        return build_plan(self.spec)
