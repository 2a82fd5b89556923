"""Pods, Deployments and LeaderWorkerSets → the launcher's instance states (pure).

A pod counts as ``ready`` when Kubernetes says so (its ``readinessProbe`` on
``/health`` passes); ``starting`` while it is scheduled, pulled or loading the model
(its ``startupProbe`` has not passed); ``unhealthy`` when it started but fails
readiness, or cannot start for a reason that needs a person (image pull, missing
Secret); ``exited`` when its container terminated or is crash-looping; ``stopping``
while it is being deleted. An instance spanning several pods takes the worst state of
its pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pdctl.sdk import k8slabels
from pdctl.sdk.fleet.events import InstanceStatus

Obj = dict[str, Any]
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")
CRASHED = frozenset({"CrashLoopBackOff", "RunContainerError"})
NEEDS_A_PERSON = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
SEVERITY = {"exited": 0, "unhealthy": 1, "stopping": 2, "starting": 3, "ready": 4}


@dataclass(frozen=True)
class PodState:
    state: str
    detail: str = ""
    exit_code: int | None = None
    started_at: float | None = None
    restarts: int = 0


def parse_time(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(obj: Obj, kind: str) -> Obj | None:
    for c in obj.get("status", {}).get("conditions", []) or []:
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return None


def _why(reason: object, message: object) -> str:
    return ": ".join(str(x) for x in (reason, message) if x)


def _container_state(c: Obj) -> PodState | None:
    """What one container status says, when it says more than 'running'."""
    state = c.get("state", {}) or {}
    last = (c.get("lastState", {}) or {}).get("terminated") or {}
    waiting = state.get("waiting")
    if waiting:
        reason = waiting.get("reason")
        if reason in CRASHED:
            detail = _why(reason, last.get("reason") or waiting.get("message"))
            return PodState("exited", detail, last.get("exitCode"))
        if reason in NEEDS_A_PERSON:
            return PodState("unhealthy", _why(reason, waiting.get("message")))
    term = state.get("terminated")
    if term:
        return PodState(
            "exited", _why(term.get("reason"), term.get("message")), term.get("exitCode")
        )
    return None


def pod_state(pod: Obj) -> PodState:
    meta = pod.get("metadata", {})
    status = pod.get("status", {}) or {}
    containers = [c for c in status.get("containerStatuses", []) or [] if isinstance(c, dict)]
    restarts = sum(int(c.get("restartCount", 0) or 0) for c in containers)
    started = [
        t
        for c in containers
        if (t := parse_time(((c.get("state") or {}).get("running") or {}).get("startedAt")))
    ]
    started_at = min(started) if started else None

    def st(state: str, detail: str = "", code: int | None = None) -> PodState:
        return PodState(state, detail, code, started_at, restarts)

    if meta.get("deletionTimestamp"):
        return st("stopping")
    for c in containers:
        said = _container_state(c)
        if said is not None:
            return st(said.state, said.detail, said.exit_code)
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        return st("exited", _why(status.get("reason"), status.get("message")))
    if phase == "Pending" or not containers:
        sched = _condition(pod, "PodScheduled")
        if sched is not None and sched.get("status") == "False":
            return st("starting", _why(sched.get("reason"), sched.get("message")))
        return st("starting")
    ready = _condition(pod, "Ready")
    if ready is not None and ready.get("status") == "True":
        return st("ready")
    if all(c.get("started") for c in containers):
        # the startupProbe passed, so the server came up and now fails /health
        return st("unhealthy", _why(ready and ready.get("reason"), ready and ready.get("message")))
    return st("starting")


def _workload_detail(obj: Obj) -> str:
    """Why a workload has no pod yet (quota, admission, a missing service account…)."""
    for c in obj.get("status", {}).get("conditions", []) or []:
        if isinstance(c, dict) and c.get("status") == "True" and c.get("type") == "ReplicaFailure":
            return _why(c.get("reason"), c.get("message"))
    return ""


def instance_status(
    name: str,
    role: str,
    url: str,
    objects: list[Obj],
    *,
    now: float,
    log_hint: str,
) -> InstanceStatus:
    """One instance from the objects labelled with its name (pods and its workload)."""
    pods = [o for o in objects if o.get("kind") == "Pod"]
    workloads = [o for o in objects if o.get("kind") in WORKLOAD_KINDS]
    if pods:
        states = sorted((pod_state(p) for p in pods), key=lambda s: SEVERITY.get(s.state, 0))
        worst = states[0]
        started = [s.started_at for s in states if s.started_at is not None]
        uptime = now - min(started) if started and worst.state != "exited" else None
        state, detail, code = worst.state, worst.detail, worst.exit_code
        restarts = sum(s.restarts for s in states)
    else:
        state = "starting" if workloads else "gone"
        detail = _workload_detail(workloads[0]) if workloads else "no workload: run `pdctl up`"
        code, uptime, restarts = None, None, 0
    return InstanceStatus(
        name=name,
        role=role,
        url=url,
        state=state,
        pid=None,
        exit_code=code,
        uptime_s=uptime,
        restarts=restarts,
        log=log_hint,
        log_tail=(detail,) if detail else (),
    )


def by_instance(objects: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for o in objects:
        label = (o.get("metadata", {}).get("labels") or {}).get(k8slabels.INSTANCE)
        if isinstance(label, str):
            out.setdefault(label, []).append(o)
    return out
