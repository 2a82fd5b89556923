"""Rules PD001-PD004: ports and hosts: two listeners on one port, ports already bound on
this machine, loopback or wildcard NIXL side-channel hosts.
"""

from __future__ import annotations

import errno
import os
import socket
from collections import defaultdict
from collections.abc import Iterator

from pdctl.sdk.fleetplan import (
    host_key,
    is_loopback,
    is_wildcard,
)
from pdctl.sdk.lint.core import (
    Finding,
    LintContext,
    _f,
    rule,
)


def _port_owners(ctx: LintContext) -> dict[tuple[str, int], list[str]]:
    owners: dict[tuple[str, int], list[str]] = defaultdict(list)
    if ctx.spec.router is not None:
        owners[(host_key(ctx.spec.router.host), ctx.spec.router.port)].append("router.port")
    o = ctx.spec.observability
    if o.prometheus:
        owners[(host_key(o.prometheus_host), o.prometheus_port)].append(
            "observability.prometheus_port"
        )
    for inst in ctx.plan.instances:
        where = f"{inst.group_role}[{inst.group_index}]"
        hk = host_key(inst.host)
        owners[(hk, inst.http_port)].append(f"{where}.http_port ({inst.name} HTTP)")
        for r, p in enumerate(inst.side_channel_ports):
            label = f"{inst.name} side channel" + (f" dp{r}" if inst.dp > 1 else "")
            owners[(hk, p)].append(f"{where}.side_channel_port ({label})")
        for p, what in zip(inst.kv_events_ports, ("KV events", "KV events replay"), strict=False):
            owners[(hk, p)].append(f"fleet.kv_events_port_base ({inst.name} {what})")
    return owners


@rule("PD001", "two listeners on one host share a port")
def _port_collision(ctx: LintContext) -> Iterator[Finding]:
    for (hk, port), who in sorted(_port_owners(ctx).items()):
        if len(who) > 1:
            yield _f(
                "PD001",
                "error",
                who[0].split(" ")[0],
                f"port {port} on {hk} is used by {len(who)} listeners: {'; '.join(who)}",
                "the second server fails to bind (a NIXL side-channel clash kills its "
                "listener thread while HTTP keeps answering, so transfers hang)",
                "remove the explicit port so pdctl assigns one, or move the base so the "
                "ranges (count x dp for side channels) do not overlap",
            )


def _bind_problem(host: str, port: int) -> int | None:
    """errno when (host, port) cannot be bound here, None when free or not our host."""
    bind_host = "0.0.0.0" if is_wildcard(host) else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                return None  # not an address of this machine
            return e.errno
        except socket.gaierror:
            return None
    return None


@rule("PD002", "a port is already bound on this host")
def _port_in_use(ctx: LintContext) -> Iterator[Finding]:
    if not ctx.check_bound_ports:
        return
    checked: set[tuple[str, int]] = set()
    listeners: list[tuple[str, str, int, str]] = []
    if ctx.spec.router is not None:
        listeners.append(("router.port", ctx.spec.router.host, ctx.spec.router.port, "router"))
    o = ctx.spec.observability
    if o.prometheus:
        listeners.append(
            ("observability.prometheus_port", o.prometheus_host, o.prometheus_port, "Prometheus")
        )
    for inst in ctx.plan.instances:
        where = f"{inst.group_role}[{inst.group_index}]"
        listeners.append((f"{where}.http_port", inst.host, inst.http_port, f"{inst.name} HTTP"))
        sc_host = inst.side_channel_host or inst.host
        for p in inst.side_channel_ports:
            listeners.append(
                (f"{where}.side_channel_port", sc_host, p, f"{inst.name} side channel")
            )
        for p in inst.kv_events_ports:
            listeners.append(("fleet.kv_events_port_base", inst.host, p, f"{inst.name} KV events"))
    for field_, host, port, label in listeners:
        if (host, port) in checked:
            continue
        checked.add((host, port))
        err = _bind_problem(host, port)
        if err is not None:
            yield _f(
                "PD002",
                "error",
                field_,
                f"{label} port {port} on {host} is already in use on this machine "
                f"({os.strerror(err)})",
                "the instance cannot start; vLLM may hang in start-up instead of exiting",
                f"stop whatever listens on {port} (`ss -ltnp 'sport = :{port}'`) or choose "
                "another port",
            )


# --------------------------------------------------------------------------- side channel


def _hosts(ctx: LintContext) -> set[str]:
    return {host_key(i.host) for i in ctx.plan.instances}


@rule("PD003", "side-channel host is loopback in a multi-host fleet")
def _sc_loopback(ctx: LintContext) -> Iterator[Finding]:
    hosts = _hosts(ctx)
    if len(hosts) < 2:
        return
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        if insts and insts[0].side_channel_host and is_loopback(insts[0].side_channel_host):
            yield _f(
                "PD003",
                "error",
                f"{where}.side_channel_host",
                f"side channel of {insts[0].group} is {insts[0].side_channel_host!r} but the "
                f"fleet spans {len(hosts)} hosts",
                "peers on other hosts cannot reach it: NIXL handshakes fail (push mode "
                "handshakes in both directions) and every request errors or recomputes",
                "set side_channel_host (or host) to an address the other hosts can route to",
            )


@rule("PD004", "side-channel host is a wildcard address")
def _sc_wildcard(ctx: LintContext) -> Iterator[Finding]:
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        if (
            insts
            and insts[0].side_channel_host is not None
            and is_wildcard(insts[0].side_channel_host)
        ):
            yield _f(
                "PD004",
                "error",
                f"{where}.side_channel_host",
                f"side channel host of {insts[0].group} is {insts[0].side_channel_host!r} "
                "(a bind-all address, not something a peer can connect to)",
                "the address is advertised to peers, which then fail to handshake",
                "set side_channel_host to this host's routable IP (host may stay 0.0.0.0)",
            )


# --------------------------------------------------------------------------- parallelism
