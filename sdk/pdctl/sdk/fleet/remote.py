"""A fleet seen from other shells: status from its state directory, requests to its
supervisor over the control socket, and clean-up after a supervisor that crashed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.errors import NotRunningError
from pdctl.sdk.events.actor import actor
from pdctl.sdk.fleet import control
from pdctl.sdk.fleet.events import InstanceStatus
from pdctl.sdk.fleet.procs import alive, group_alive, kill_group
from pdctl.sdk.fleet.readiness import check_ready
from pdctl.sdk.fleet.state import (
    FleetRecord,
    InstanceRecord,
    fleet_dir,
    read_exit,
    read_state,
    state_file,
    tail,
)
from pdctl.sdk.shepherd import group_members

DEFAULT_READY_TIMEOUT = 180.0
DEFAULT_GRACE = 10.0
TAIL_LINES = 15


@dataclass
class FleetStatus:
    fleet: str
    state_dir: str
    supervisor_pid: int | None
    supervisor_alive: bool
    instances: list[InstanceStatus] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        return not self.supervisor_alive

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "state_dir": self.state_dir,
            "supervisor_pid": self.supervisor_pid,
            "supervisor_alive": self.supervisor_alive,
            "instances": [i.as_dict() for i in self.instances],
        }


def status_of(rec: InstanceRecord, state: str, ready: bool | None) -> InstanceStatus:
    now = time.time()
    if state in ("ready", "starting") and ready is not None:
        if ready:
            state = "ready"
        elif state == "ready":
            state = "unhealthy"
    exited = state in ("exited", "gone", "backoff", "failed")
    nxt = rec.next_restart_at if state == "backoff" else None
    return InstanceStatus(
        name=rec.name,
        role=rec.role,
        url=rec.url,
        state=state,
        pid=rec.shepherd_pid,
        exit_code=rec.exit_code,
        uptime_s=None if exited or rec.started_at is None else now - rec.started_at,
        restarts=rec.restarts,
        log=rec.log,
        log_tail=tuple(tail(rec.log, TAIL_LINES)) if exited else (),
        restart_policy=rec.restart_policy,
        last_restart_at=rec.last_restart_at,
        next_restart_in_s=None if nxt is None else max(0.0, nxt - now),
        last_failure=rec.last_failure,
    )


def _require_state(fleet: str, root: Path | None) -> tuple[Path, FleetRecord]:
    d = fleet_dir(fleet, root)
    rec = read_state(d)
    if rec is None:
        raise NotRunningError(f"no fleet named {fleet!r} is running (nothing in {d})")
    return d, rec


async def fleet_status(
    fleet: str,
    *,
    state_root: Path | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FleetStatus:
    """Status of a fleet supervised by another process, from its state directory.

    An instance whose process exited shows ``exited`` with its code and log tail as soon
    as its shepherd has written the exit file (milliseconds after the exit).
    """
    d, rec = _require_state(fleet, state_root)
    sup_alive = alive(rec.supervisor_pid, rec.supervisor_ticks)
    states: list[str] = []
    for inst in rec.instances:
        ex = read_exit(inst.exit_file)
        if inst.state in ("backoff", "failed") and sup_alive:
            states.append(inst.state)  # the supervisor has seen the exit and decided
        elif ex is not None and ex[1] >= (inst.started_at or 0):
            inst.exit_code = ex[0]
            states.append("stopped" if inst.state in ("stopping", "stopped") else "exited")
        elif not group_alive(inst.shepherd_pid):
            states.append("gone" if inst.state not in ("stopped",) else "stopped")
        else:
            states.append(inst.state)
    async with httpx.AsyncClient(transport=transport) as client:
        checks = await asyncio.gather(
            *(
                check_ready(client, i.url, i.served_name, role=i.role)
                if s in ("ready", "starting", "unhealthy")
                else _none()
                for i, s in zip(rec.instances, states, strict=True)
            )
        )
    out = FleetStatus(rec.fleet, str(d), rec.supervisor_pid, sup_alive)
    for inst, s, check in zip(rec.instances, states, checks, strict=True):
        out.instances.append(status_of(inst, s, check[0] if check is not None else None))
    return out


async def _none() -> None:
    return None


def cleanup_stale(rec: FleetRecord, d: Path, grace: float = DEFAULT_GRACE) -> int:
    """Stop whatever a crashed supervisor left behind; remove its state. Returns the number
    of process groups stopped."""
    stopped = 0
    for inst in rec.instances:
        pgid = inst.shepherd_pid
        if pgid and group_members(pgid) and _ours(pgid, inst.shepherd_ticks):
            kill_group(pgid, grace)
            stopped += 1
    with contextlib.suppress(FileNotFoundError):
        state_file(d).unlink()
    with contextlib.suppress(FileNotFoundError):
        (d / "control.sock").unlink()
    return stopped


def _ours(pgid: int, ticks: int | None) -> bool:
    """Is process group ``pgid`` still the one pdctl started (not a reused number)?"""
    if alive(pgid, ticks):
        return True
    for pid in group_members(pgid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"vllm" in cmdline or b"pdctl" in cmdline:
            return True
    return False


def _instance_request(
    fleet: str, name: str, cmd: str, state_root: Path | None, timeout: float
) -> None:
    _d, rec = _require_state(fleet, state_root)
    if not alive(rec.supervisor_pid, rec.supervisor_ticks):
        raise NotRunningError(
            f"fleet {fleet!r} has no live supervisor (it crashed); run `pdctl down` to clean "
            "up, then `pdctl up`"
        )
    rec.instance(name)
    control.request(rec.control_socket, {"cmd": cmd, "name": name, "by": actor()}, timeout)


def remote_restart(
    fleet: str,
    name: str,
    *,
    state_root: Path | None = None,
    timeout: float = DEFAULT_READY_TIMEOUT + 30,
) -> None:
    """Ask the supervisor to restart one instance; returns once it is ready again."""
    _instance_request(fleet, name, "restart", state_root, timeout)


def remote_stop(
    fleet: str, name: str, *, state_root: Path | None = None, grace: float = DEFAULT_GRACE
) -> None:
    """Ask the supervisor to stop one instance and leave it stopped."""
    _instance_request(fleet, name, "stop", state_root, grace + 30)


def remote_down(fleet: str, *, state_root: Path | None = None, grace: float = DEFAULT_GRACE) -> str:
    """Ask the supervisor to stop the fleet; clean up directly when it is gone."""
    d, rec = _require_state(fleet, state_root)
    if alive(rec.supervisor_pid, rec.supervisor_ticks):
        try:
            control.request(rec.control_socket, {"cmd": "down", "by": actor()}, grace + 30)
        except control.ControlError:
            # the supervisor is wedged: stop it, then clean up after it
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.supervisor_pid, 15)
        else:
            return "stopped"
    n = cleanup_stale(rec, d, grace)
    return f"cleaned up after a crashed supervisor ({n} process group(s) stopped)"
