"""The launch plan's types: what starting one process, or the whole fleet, takes."""

from __future__ import annotations

import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pdctl.sdk.spec import Mode, Role
from pdctl.sdk.urls import http_url

PlanRole = Literal["prefill", "decode", "colocated", "router", "render", "prometheus"]
GroupRole = Role | Literal["router", "render", "prometheus"]


class InstancePlan(BaseModel):
    """Everything needed to start one vLLM server and find it again."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: PlanRole
    group: str
    group_role: GroupRole
    group_index: int
    index: int
    host: str
    http_port: int
    side_channel_host: str | None
    side_channel_port: int | None
    """First side-channel port; DP rank r listens on this + r."""
    engine_id: str | None
    """The engine id given to vLLM (with DP, vLLM appends ``_dp<rank>`` per rank)."""
    mode: Mode
    tp: int
    pp: int
    dp: int
    block_size: int
    devices: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    kv_transfer_config: dict[str, Any] | None
    argv: tuple[str, ...]
    env: dict[str, str]
    kv_events_port: int | None = None
    """The KV event publisher's port (ZMQ PUB); its replay socket listens on the next."""

    @property
    def kv_events_ports(self) -> tuple[int, ...]:
        """(publisher, replay) when the instance publishes KV cache events."""
        if self.kv_events_port is None:
            return ()
        return (self.kv_events_port, self.kv_events_port + 1)

    @property
    def url(self) -> str:
        return http_url(self.host, self.http_port)

    @property
    def side_channel_ports(self) -> tuple[int, ...]:
        if self.side_channel_port is None:
            return ()
        return tuple(self.side_channel_port + r for r in range(self.dp))

    @property
    def engine_ids(self) -> tuple[str, ...]:
        """The engine ids the instance will actually announce (one per DP rank)."""
        if self.engine_id is None:
            return ()
        if self.dp == 1:
            return (self.engine_id,)
        return tuple(f"{self.engine_id}_dp{r}" for r in range(self.dp))

    def ports(self) -> tuple[int, ...]:
        return (self.http_port, *self.side_channel_ports, *self.kv_events_ports)

    def shell(self) -> str:
        """One shell line that reproduces the launch."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv)
        return f"env {env} {cmd}" if env else cmd

    def as_json(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        if self.kv_events_port is None:
            d.pop("kv_events_port")
        d["url"] = self.url
        d["engine_ids"] = list(self.engine_ids)
        d["side_channel_ports"] = list(self.side_channel_ports)
        return d


class RouterPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    port: int


class FleetPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    instances: tuple[InstancePlan, ...]
    router: RouterPlan | None

    def by_name(self, name: str) -> InstancePlan:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise KeyError(name)

    def role(self, role: PlanRole) -> list[InstancePlan]:
        return [i for i in self.instances if i.role == role]
