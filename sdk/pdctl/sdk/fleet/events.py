"""Lifecycle events and status snapshots of a fleet (plain immutable data)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from pdctl.sdk.events.model import Event

EventKind = Literal[
    "starting",
    "ready",
    "exited",
    "restarting",
    "restarted",
    "unhealthy",
    "backoff",
    "gave-up",
    "stopping",
    "stopped",
    "fleet-ready",
    "fleet-stopped",
]


@dataclass(frozen=True)
class FleetEvent:
    kind: EventKind
    instance: str | None
    at: float = field(default_factory=time.time)
    code: int | None = None
    message: str = ""
    log_tail: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "instance": self.instance,
            "at": self.at,
            "code": self.code,
            "message": self.message,
            "log_tail": list(self.log_tail),
        }


def journal_event(ev: FleetEvent) -> Event:
    """A lifecycle event as the journal keeps it (the kinds share their names)."""
    data: dict[str, object] = {}
    if ev.code is not None:
        data["code"] = ev.code
    if ev.log_tail:
        data["log_tail"] = list(ev.log_tail)
    return Event(ev.kind, ev.instance, ev.message, at=ev.at, data=data)


@dataclass(frozen=True)
class InstanceStatus:
    name: str
    role: str
    url: str
    state: str
    """starting | ready | unhealthy | backoff | failed | exited | stopping | stopped |
    gone (backoff: failed, restarting by policy soon; failed: the policy gave up)"""
    pid: int | None
    exit_code: int | None
    uptime_s: float | None
    restarts: int
    log: str
    log_tail: tuple[str, ...] = ()
    restart_policy: str = ""
    """How the supervisor restarts it: 'on-failure (max N in W s)', 'never'; '' unknown."""
    last_restart_at: float | None = None
    next_restart_in_s: float | None = None
    """Seconds until the policy restarts it (state backoff)."""
    last_failure: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "role": self.role,
            "url": self.url,
            "state": self.state,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "uptime_s": self.uptime_s,
            "restarts": self.restarts,
            "log": self.log,
            "log_tail": list(self.log_tail),
            "restart_policy": self.restart_policy,
            "last_restart_at": self.last_restart_at,
            "next_restart_in_s": self.next_restart_in_s,
            "last_failure": self.last_failure,
        }
