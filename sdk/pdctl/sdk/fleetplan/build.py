"""Spec → launch plan: every process of the fleet, with its ports, devices, cores, argv
and environment (see :mod:`~pdctl.sdk.fleetplan.ports` for how ports are chosen)."""

from __future__ import annotations

from typing import Any, Literal

from pdctl.sdk.fleetplan.cores import split_cores
from pdctl.sdk.fleetplan.model import FleetPlan, GroupRole, InstancePlan, PlanRole, RouterPlan
from pdctl.sdk.fleetplan.ports import (
    PortBook,
    group_ports,
    host_key,
    kv_events_ports,
    render_server_ports,
)
from pdctl.sdk.fleetplan.vllm_args import (
    effective_block_size,
    effective_mode,
    engine_argv,
    engine_env,
    kv_transfer_config,
    render_server_argv,
    render_server_env,
    with_kv_events,
)
from pdctl.sdk.spec import (
    FleetSpec,
    InstanceGroup,
    Mode,
    RenderGroup,
    Role,
    group_name,
    render_group_name,
)
from pdctl.sdk.specload import SpecLike, spec_of


def build_plan(spec: SpecLike) -> FleetPlan:
    """Every instance of the spec (a :class:`FleetSpec`, or what :func:`load_spec` gives)
    as a launch plan: prefill groups, decode groups, then render servers."""
    spec = spec_of(spec)
    book = PortBook()
    for r in spec.render:  # explicit render ports are kept clear of automatic ones
        if r.http_port is not None:
            book.take(r.host, range(r.http_port, r.http_port + r.count))
    ports = group_ports(spec, book)
    events = kv_events_ports(spec, book)
    next_device: dict[str, int] = {}
    instances: list[InstancePlan] = []
    n_by_role = {"prefill": len(spec.prefill), "decode": len(spec.decode)}
    for role, gi, g in spec.groups():
        gname = group_name(role, gi, g, n_by_role[role])
        http0, sc0 = ports[(role, gi)]
        for i in range(g.count):
            devices: tuple[int, ...] = ()
            if spec.fleet.platform == "gpu":
                if g.devices is not None:
                    devices = tuple(g.devices[i * g.ranks : (i + 1) * g.ranks])
                else:
                    hk = host_key(g.host)
                    start = next_device.get(hk, 0)
                    devices = tuple(range(start, start + g.ranks))
                    next_device[hk] = start + g.ranks
            cores = split_cores(g.cpu_cores, g.count)[i]
            inst = _engine_plan(
                spec, role, gi, gname, g, i, http0 + i, sc0 + i * g.dp, devices, cores
            )
            if (role, gi) in events:
                inst = with_kv_events(inst, events[(role, gi)] + 2 * i * g.dp)
            instances.append(inst)
    for ri, (r, http0) in enumerate(zip(spec.render, render_server_ports(spec, book), strict=True)):
        rname = render_group_name(ri, r, len(spec.render))
        for i in range(r.count):
            rcores = split_cores(r.cpu_cores, r.count)[i]
            instances.append(_render_server_plan(spec, ri, rname, r, i, http0 + i, rcores))
    router = RouterPlan(host=spec.router.host, port=spec.router.port) if spec.router else None
    return FleetPlan(instances=tuple(instances), router=router)


def _plan(
    spec: FleetSpec,
    *,
    name: str,
    role: PlanRole,
    group: str,
    group_role: GroupRole,
    host: str,
    http_port: int,
    argv: tuple[str, ...],
    env: dict[str, str],
    group_index: int = 0,
    index: int = 0,
    mode: Mode | None = None,
    block_size: int | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    devices: tuple[int, ...] = (),
    cpu_cores: tuple[int, ...] = (),
    side_channel_host: str | None = None,
    side_channel_port: int | None = None,
    engine_id: str | None = None,
    kv_transfer_config: dict[str, Any] | None = None,
) -> InstancePlan:
    """The one place an :class:`InstancePlan` is made: what a process without an engine
    (render server, router, Prometheus) does not set takes the fleet's defaults."""
    return InstancePlan(
        name=name,
        role=role,
        group=group,
        group_role=group_role,
        group_index=group_index,
        index=index,
        host=host,
        http_port=http_port,
        side_channel_host=side_channel_host,
        side_channel_port=side_channel_port,
        engine_id=engine_id,
        mode=mode if mode is not None else spec.fleet.mode,
        tp=tp,
        pp=pp,
        dp=dp,
        block_size=block_size if block_size is not None else spec.fleet.effective_block_size,
        devices=devices,
        cpu_cores=cpu_cores,
        kv_transfer_config=kv_transfer_config,
        argv=argv,
        env=env,
    )


def _engine_plan(
    spec: FleetSpec,
    role: Role,
    gi: int,
    gname: str,
    g: InstanceGroup,
    index: int,
    http_port: int,
    side_channel_port: int,
    devices: tuple[int, ...],
    cores: tuple[int, ...],
) -> InstancePlan:
    mode = effective_mode(spec, g)
    name = f"{gname}-{index}"
    block_size = effective_block_size(spec, g)
    engine_id: str | None = None
    sc_host: str | None = None
    sc_port: int | None = None
    ktc: dict[str, Any] | None = None
    if mode != "colocated":
        engine_id = g.engine_id.format(name=name, role=role, group=gname, index=index, host=g.host)
        sc_host = g.side_channel_host or g.host
        sc_port = side_channel_port
        ktc = kv_transfer_config(spec, role, mode, engine_id)
    side_channel = (sc_host, sc_port) if sc_host is not None and sc_port is not None else None
    return _plan(
        spec,
        name=name,
        role="colocated" if mode == "colocated" else role,
        group=gname,
        group_role=role,
        group_index=gi,
        index=index,
        host=g.host,
        http_port=http_port,
        side_channel_host=sc_host,
        side_channel_port=sc_port,
        engine_id=engine_id,
        mode=mode,
        tp=g.tp,
        pp=g.pp,
        dp=g.dp,
        block_size=block_size,
        devices=devices,
        cpu_cores=cores,
        kv_transfer_config=ktc,
        argv=tuple(engine_argv(spec, g, http_port, block_size, ktc)),
        env=engine_env(spec, g, name, role, side_channel, devices, cores),
    )


def _render_server_plan(
    spec: FleetSpec,
    gi: int,
    gname: str,
    r: RenderGroup,
    index: int,
    http_port: int,
    cores: tuple[int, ...],
) -> InstancePlan:
    """A GPU-less render server: tokenizes for the engines and turns their token output
    back into OpenAI responses (the router's ``tokens`` path)."""
    return _plan(
        spec,
        name=f"{gname}-{index}",
        role="render",
        group=gname,
        group_role="render",
        group_index=gi,
        index=index,
        host=r.host,
        http_port=http_port,
        cpu_cores=cores,
        argv=tuple(render_server_argv(spec, r, http_port)),
        env=render_server_env(spec, r, cores),
    )


def router_plan(spec: FleetSpec, argv: tuple[str, ...]) -> InstancePlan | None:
    """The router as one more supervised process (None when the spec has no router)."""
    if spec.router is None:
        return None
    return _service_plan(spec, "router", spec.router.host, spec.router.port, argv)


def prometheus_plan(spec: FleetSpec, argv: tuple[str, ...]) -> InstancePlan | None:
    """The local Prometheus of ``[observability] prometheus = true`` as one more supervised
    process (None when it is off)."""
    o = spec.observability
    if not o.prometheus:
        return None
    return _service_plan(spec, "prometheus", o.prometheus_host, o.prometheus_port, argv)


def _service_plan(
    spec: FleetSpec,
    name: Literal["router", "prometheus"],
    host: str,
    port: int,
    argv: tuple[str, ...],
) -> InstancePlan:
    return _plan(
        spec,
        name=name,
        role=name,
        group=name,
        group_role=name,
        host=host,
        http_port=port,
        argv=argv,
        env={},
    )
