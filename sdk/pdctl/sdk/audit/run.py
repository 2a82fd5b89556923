"""``pdctl audit``: every listener of a fleet, probed as an outsider, with a verdict.

Locally (:func:`audit_local`) the listeners come from the running fleet's spec (its
launch plan) *and* from what the OS shows the fleet's processes listening on (the
``ss -ltnp`` view, :mod:`.sockets`), so a socket a library opened behind the plan's back
is found too; each is then probed (:mod:`.probe`). On Kubernetes and Ray
(:func:`audit_plan`) the listeners come from the launch plan and the verdicts from the
spec (keys, NetworkPolicies): nothing is probed, and the report says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import httpx

from pdctl.sdk.audit.expected import planned, reconcile
from pdctl.sdk.audit.model import Answer, AuditReport, Finding, Listener, judge
from pdctl.sdk.audit.probe import probe_router, probe_tcp, probe_vllm, socket_mode
from pdctl.sdk.audit.sockets import descendants, listening, process_parents, supported
from pdctl.sdk.backends.k8s import cluster_plan
from pdctl.sdk.errors import AuditError, NotRunningError
from pdctl.sdk.fleet import fleet_dir, read_state
from pdctl.sdk.fleet.procs import alive
from pdctl.sdk.fleetplan import build_plan, is_loopback
from pdctl.sdk.keys import key_sources
from pdctl.sdk.spec import FleetSpec

PROC = Path("/proc")


def running_spec(d: Path) -> FleetSpec | None:
    """The spec a running fleet was started from (``run/spec.json``, written for its
    router), or None."""
    path = d / "run" / "spec.json"
    try:
        return FleetSpec.model_validate_json(path.read_text())
    except OSError:
        return None
    except ValueError as e:
        raise AuditError(f"{path} is unreadable ({e}); give the spec with -f") from None


async def audit_local(
    fleet: str,
    *,
    spec: FleetSpec | None = None,
    state_root: Path | None = None,
    strict: bool = False,
    proc: Path = PROC,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AuditReport:
    """Audit the fleet ``fleet`` running on this machine."""
    d = fleet_dir(fleet, state_root)
    rec = read_state(d)
    if rec is None:
        raise NotRunningError(f"fleet {fleet!r} is not running here (no state in {d})")
    spec = spec or running_spec(d)
    if spec is None:
        raise AuditError(f"fleet {fleet!r} left no run/spec.json in {d}; give its spec with -f")
    report = AuditReport(fleet, "local", strict=strict)
    expected = planned(spec, build_plan(spec))
    owner_of: dict[int, str] = {}
    if supported(proc):
        parents = process_parents(proc)
        for inst in rec.instances:
            if inst.shepherd_pid and alive(inst.shepherd_pid, inst.shepherd_ticks):
                for pid in descendants(parents, [inst.shepherd_pid]):
                    owner_of[pid] = inst.name
        if alive(rec.supervisor_pid, rec.supervisor_ticks):
            owner_of.setdefault(rec.supervisor_pid, "supervisor")
        listeners = reconcile(expected, listening(owner_of, proc), owner_of)
    else:
        listeners = expected
        report.notes.append(
            "no /proc/net/tcp here: listeners are the launch plan's only (the OS view was "
            "not taken); each was probed"
        )
    mode = socket_mode(rec.control_socket)
    listeners.append(
        Listener(
            "supervisor",
            "supervisor-socket",
            "",
            path=rec.control_socket,
            pid=rec.supervisor_pid,
            seen=mode is not None,
            mode=mode,
        )
    )
    served = {i.name: i.served_name for i in rec.instances}
    tls = spec.router is not None and spec.router.tls is not None

    async def one(lst: Listener) -> Finding:
        answers = await _probe(lst, served.get(lst.owner, ""), tls, transport)
        return judge(lst, answers, strict=strict)

    sem = asyncio.Semaphore(8)

    async def bounded(lst: Listener) -> Finding:
        async with sem:
            return await one(lst)

    report.findings = list(await asyncio.gather(*(bounded(x) for x in listeners)))
    return report


async def _probe(
    lst: Listener, model: str, tls: bool, transport: httpx.AsyncBaseTransport | None
) -> tuple[Answer, ...]:
    if lst.seen is False or lst.kind == "supervisor-socket":
        return ()
    if lst.kind == "vllm-http":
        return await probe_vllm(lst, model, transport=transport)
    if lst.kind == "router":
        return await probe_router(lst, tls=tls, transport=transport)
    if lst.kind == "unplanned":
        # never connected to: a library's own protocol (UCX, Gloo) may not take a stray
        # connection well, and the kernel completes any TCP handshake on a listening
        # socket, so the OS's LISTEN entry is the answer
        return (
            Answer(
                "listening (OS view)",
                None,
                True,
                note=f"{lst.process or '?'} pid {lst.pid}: accepts any TCP connection",
            ),
        )
    return await probe_tcp(lst)


def audit_plan(spec: FleetSpec, backend: str, *, strict: bool = False) -> AuditReport:
    """The listeners of ``spec`` on Kubernetes or Ray from its launch plan, judged from the
    spec (keys, NetworkPolicies); not probed (``probed`` False)."""
    report = AuditReport(spec.fleet.name, backend, probed=False, strict=strict)
    if backend == "k8s":
        listeners = planned(spec, cluster_plan(spec), host_of="0.0.0.0")
        report.notes.append(
            "from the launch plan (every pod binds 0.0.0.0); not probed: run pdctl audit "
            "from a pod of the fleet's namespace to probe, or kubectl port-forward"
        )
    else:
        listeners = [
            x if not is_loopback(x.host) else _on_node(x) for x in planned(spec, build_plan(spec))
        ]
        report.notes.append(
            "from the launch plan (a loopback host becomes the Ray node's address); not probed"
        )
    report.findings = [
        judge(x, _static(spec, backend, x), strict=strict, probed=False) for x in listeners
    ]
    return report


def _on_node(x: Listener) -> Listener:
    return replace(x, host="node-address")


def _static(spec: FleetSpec, backend: str, x: Listener) -> tuple[Answer, ...]:
    """What the spec says an outsider would get."""
    if x.kind == "router":
        keys = key_sources(spec.router)
        admin = any(k.role == "admin" for k in keys)
        return (
            Answer(
                "control without a key (spec)",
                None,
                not admin,
                note="an admin key is required" if admin else "no admin key in router.keys",
            ),
            Answer(
                "inference without a key (spec)",
                None,
                not keys,
                note="a key is required" if keys else "no key in router.keys",
            ),
        )
    if backend == "k8s":
        guarded = spec.backend.k8s is not None and spec.backend.k8s.network_policies
        why = (
            "NetworkPolicies admit only the fleet's own pods"
            if guarded
            else "backend.k8s.network_policies = false: every pod may connect"
        )
        return (Answer("reachable from other pods (spec)", None, not guarded, note=why),)
    return (
        Answer(
            "reachable on the node's network (spec)",
            None,
            True,
            note="pdctl does not fence Ray nodes' ports",
        ),
    )
