"""Which listeners a fleet has, by its spec's launch plan, and how they line up with what
the OS shows listening in the fleet's processes (pure: plans and socket lists in,
:class:`~.model.Listener` out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from pdctl.sdk.audit.model import Listener
from pdctl.sdk.audit.sockets import OsListener
from pdctl.sdk.fleetplan import FleetPlan, is_wildcard
from pdctl.sdk.spec import FleetSpec

KV_EVENTS_HOST = "0.0.0.0"
"""The launch plan binds KV-event sockets to ``tcp://*`` (``kv_events_config``)."""


def planned(spec: FleetSpec, plan: FleetPlan, *, host_of: str | None = None) -> list[Listener]:
    """Every listener the plan opens: each vLLM instance's HTTP port (which also serves
    ``/metrics``), NIXL side channels, KV-event publisher and replay, the router and the
    local Prometheus. ``host_of`` replaces every bind address (a pod binds ``0.0.0.0``)."""
    out: list[Listener] = []
    for i in plan.instances:
        out.append(Listener(i.name, "vllm-http", host_of or i.host, i.http_port))
        sc_host = host_of or i.side_channel_host or i.host
        out += [Listener(i.name, "side-channel", sc_host, p) for p in i.side_channel_ports]
        ev_host = host_of or KV_EVENTS_HOST
        out += [Listener(i.name, "kv-events", ev_host, p) for p in i.kv_events_ports]
    if spec.router is not None:
        out.append(Listener("router", "router", host_of or spec.router.host, spec.router.port))
    o = spec.observability
    if o.prometheus:
        out.append(Listener("prometheus", "prometheus", o.prometheus_host, o.prometheus_port))
    return out


def _same_bind(planned_host: str, os_host: str) -> bool:
    if is_wildcard(planned_host):
        return True
    return planned_host == os_host or is_wildcard(os_host)


def reconcile(
    plan: Iterable[Listener], seen: Iterable[OsListener], owner_of: Mapping[int, str]
) -> list[Listener]:
    """The plan's listeners marked seen or not by the OS view (with the address actually
    bound, the pid and process), then every socket the OS shows that no plan names
    (``unplanned``). Sockets of one owner on one address (``router.workers`` processes
    sharing a port with ``SO_REUSEPORT``) are one listener. ``owner_of``: pid → the
    instance whose process tree holds it."""
    left = list(seen)
    out: list[Listener] = []
    for lst in plan:
        match = next(
            (
                s
                for s in left
                if s.port == lst.port
                and _same_bind(lst.host, s.host)
                and owner_of.get(s.pid) in (lst.owner, None)
            ),
            None,
        )
        if match is None:
            out.append(_with(lst, seen=False))
            continue
        left.remove(match)
        out.append(_with(lst, host=match.host, pid=match.pid, process=match.process, seen=True))
    by_port = {(lst.owner, lst.port): lst for lst in out if lst.seen}
    for s in left:
        twin = by_port.get((owner_of.get(s.pid, "?"), s.port))
        if twin is not None and s.host == twin.host:
            continue  # one address, several sockets: the router's workers (SO_REUSEPORT)
        if twin is not None:  # the same port bound twice (IPv4 and IPv6)
            out.append(_with(twin, host=s.host, pid=s.pid, process=s.process))
            continue
        out.append(
            Listener(
                owner_of.get(s.pid, "?"),
                "unplanned",
                s.host,
                s.port,
                pid=s.pid,
                process=s.process,
                planned=False,
                seen=True,
            )
        )
    return out


def _with(lst: Listener, **kw: object) -> Listener:
    return replace(lst, **kw)  # type: ignore[arg-type]
