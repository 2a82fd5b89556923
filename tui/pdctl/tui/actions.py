"""Operator actions: what can be done to the fleet now, and doing it through the SDK.

Every action that changes the fleet is *mutating* (refused with ``--readonly``); the
ones that stop work are *destructive* and are confirmed first.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.sdk.client import RouterState
from pdctl.sdk.errors import PdctlError
from pdctl.tui.source import Source, Update


@dataclass(frozen=True)
class Action:
    kind: str  # restart | stop | drain | resume | mode | preflight | admission
    target: str | None = None
    """Instance name, or the router mode for ``mode``."""

    @property
    def label(self) -> str:
        return {
            "restart": f"Restart {self.target}",
            "stop": f"Stop {self.target}",
            "drain": f"Drain {self.target}",
            "resume": f"Resume routing to {self.target}",
            "mode": f"Router mode → {self.target}",
            "preflight": "Run preflight",
            "admission": "Admission thresholds",
        }[self.kind]

    @property
    def help(self) -> str:
        return {
            "restart": "stop the instance and start it again (waits until it is ready)",
            "stop": "stop the instance and leave it stopped",
            "drain": "stop routing new requests to it, then wait until its work is done",
            "resume": "route new requests to it again",
            "mode": "switch the router's dispatch mode (A/B: concurrent vs sequential push)",
            "preflight": "check the topology of this placement",
            "admission": "change the router's admission limits and thresholds (a form)",
        }[self.kind]

    @property
    def mutating(self) -> bool:
        return self.kind != "preflight"

    @property
    def destructive(self) -> bool:
        return self.kind in ("restart", "stop", "drain", "mode")


def available(update: Update | None) -> list[Action]:
    """Every action that makes sense for the fleet as last seen."""
    out: list[Action] = [Action("preflight")]
    if update is None:
        return out
    routed = {i.name: i for i in update.router.instances} if update.router else {}
    for inst in update.snapshot.instances:
        if inst.role == "router":
            continue
        out.append(Action("restart", inst.name))
        out.append(Action("stop", inst.name))
        r = routed.get(inst.name)
        if r is not None:
            out.append(Action("resume" if r.drained else "drain", inst.name))
    if update.router is not None:
        out.extend(Action("mode", m) for m in update.router.modes if m != update.router.mode)
        if update.router.admission.get("enabled"):
            out.append(Action("admission"))
    return out


def for_instance(update: Update | None, name: str, kinds: tuple[str, ...]) -> Action | None:
    """The action of one of ``kinds`` offered for ``name`` (drain or resume, say)."""
    for a in available(update):
        if a.target == name and a.kind in kinds:
            return a
    return None


async def perform(action: Action, source: Source) -> str:
    """Do it; returns what happened in one line. Raises :class:`PdctlError`."""
    t = action.target or ""
    if action.kind == "restart":
        await source.restart(t)
        return f"{t} restarted"
    if action.kind == "stop":
        await source.stop(t)
        return f"{t} stopped"
    router = source.router
    if router is None:
        raise PdctlError("this fleet has no pdctl router to control")
    if action.kind == "drain":
        await router.drain(t)
        source.control("drain", t)
        await router.wait_drained(t)
        return f"{t} drained: no request in flight; stop or restart it safely"
    if action.kind == "resume":
        await router.resume(t)
        source.control("resume", t)
        return f"{t} receives requests again"
    if action.kind == "mode":
        st = await router.set_mode(t)
        source.control(f"mode {st.mode}", "router")
        return f"router now dispatches in {st.mode} mode"
    if action.kind == "admission":
        raise PdctlError("admission changes go through set_admission (the form's values)")
    raise PdctlError(f"unknown action {action.kind!r}")


async def set_admission(source: Source, changes: dict[str, int | float]) -> RouterState:
    """Send admission changes (``POST /v1/pdctl/admission``); the router's answer.
    Raises :class:`PdctlError` (a :class:`RouterError` naming the refused setting)."""
    if source.router is None:
        raise PdctlError("this fleet has no pdctl router to control")
    state = await source.router.set_admission(**changes)
    source.control("admission " + " ".join(f"{k}={v}" for k, v in changes.items()), "router")
    return state
