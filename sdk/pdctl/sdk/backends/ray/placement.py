"""Which Ray node runs which group, and the spec as it runs there (pure: no Ray import).

Every instance of a group goes to one node (a group is "``count`` instances on one host"
in the spec), chosen first-fit over the live nodes: the head node first, then by address.
A node fits when what is left of its resources, after the groups already placed on it,
covers ``count`` times what one instance asks for (CPUs, GPUs, custom resources). A group
whose ``host`` names a routable address only fits the node with that address.

:func:`resolve` then rewrites the spec for the nodes: loopback and wildcard hosts (the
default ``127.0.0.1`` included) become the node's address, so each vLLM server binds and
advertises the address its peers, the router and the monitor reach it at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.backends.base import BackendError
from pdctl.sdk.fleetplan import is_loopback, is_wildcard
from pdctl.sdk.spec import (
    FleetSpec,
    InstanceGroup,
    RayGroup,
    RaySpec,
    Role,
    group_name,
    render_group_name,
)

ROUTER = "router"
HEAD_RESOURCE = "node:__internal_head__"
"""The marker resource Ray gives the head node."""


class PlacementError(BackendError):
    """No live node has what a group asks for."""


@dataclass(frozen=True)
class Node:
    """One Ray node as ``ray.nodes()`` describes it."""

    node_id: str
    ip: str
    alive: bool
    resources: Mapping[str, float]
    death: str = ""

    @property
    def is_head(self) -> bool:
        return HEAD_RESOURCE in self.resources

    @property
    def label(self) -> str:
        return f"{self.ip} ({self.node_id[:8]}{', head' if self.is_head else ''})"

    def describe(self) -> str:
        shown = {k: v for k, v in self.resources.items() if not _internal(k)}
        have = ", ".join(f"{k} {_num(v)}" for k, v in sorted(shown.items())) or "nothing"
        return f"{self.label}: {have}"

    @classmethod
    def from_ray(cls, raw: Mapping[str, Any]) -> Node:
        return cls(
            node_id=str(raw.get("NodeID", "")),
            ip=str(raw.get("NodeManagerAddress", "")),
            alive=bool(raw.get("Alive", raw.get("alive", False))),
            resources={str(k): float(v) for k, v in (raw.get("Resources") or {}).items()},
            death=str(raw.get("DeathReasonMessage") or ""),
        )


@dataclass(frozen=True)
class Demand:
    """What one group asks of a node: ``count`` times ``per_instance``."""

    group: str
    instances: tuple[str, ...]
    per_instance: Mapping[str, float]
    pinned_ip: str | None = None

    @property
    def total(self) -> dict[str, float]:
        n = len(self.instances)
        return {k: v * n for k, v in self.per_instance.items() if v}


@dataclass(frozen=True)
class Placement:
    """Group name → the node it runs on."""

    nodes: Mapping[str, Node] = field(default_factory=dict)

    def node_of(self, group: str) -> Node:
        return self.nodes[group]


def ray_settings(spec: FleetSpec) -> RaySpec:
    return spec.backend.ray or RaySpec()


def group_settings(spec: FleetSpec, group: str) -> RayGroup:
    return ray_settings(spec).groups.get(group) or RayGroup()


def ray_options(spec: FleetSpec, group: str, ranks: int = 1) -> dict[str, float]:
    """Resources one instance of ``group`` reserves (``CPU``, ``GPU`` and custom ones)."""
    settings = ray_settings(spec)
    g = group_settings(spec, group)
    if group == ROUTER:
        cpus, gpus = g.num_cpus or 0.0, g.num_gpus or 0.0
    else:
        cpus = settings.num_cpus if g.num_cpus is None else g.num_cpus
        default_gpus = float(ranks) if spec.fleet.platform == "gpu" else 0.0
        gpus = default_gpus if g.num_gpus is None else g.num_gpus
    return {"CPU": cpus, "GPU": gpus, **g.resources}


def named_groups(spec: FleetSpec) -> list[tuple[str, Role, int, InstanceGroup]]:
    """(group name, role, index in its role, group) of every prefill and decode group."""
    n_by_role = {"prefill": len(spec.prefill), "decode": len(spec.decode)}
    return [
        (group_name(role, gi, g, n_by_role[role]), role, gi, g) for role, gi, g in spec.groups()
    ]


def demands(spec: FleetSpec) -> list[Demand]:
    """One demand per prefill/decode group, then render groups, then the router."""
    out = [
        Demand(
            name,
            tuple(f"{name}-{i}" for i in range(g.count)),
            ray_options(spec, name, g.ranks),
            _pin(g.host),
        )
        for name, _role, _gi, g in named_groups(spec)
    ]
    for ri, r in enumerate(spec.render):
        name = render_group_name(ri, r, len(spec.render))
        out.append(
            Demand(
                name,
                tuple(f"{name}-{i}" for i in range(r.count)),
                ray_options(spec, name),
                _pin(r.host),
            )
        )
    if spec.router is not None:
        out.append(Demand(ROUTER, (ROUTER,), ray_options(spec, ROUTER), _pin(spec.router.host)))
    return out


def _pin(host: str) -> str | None:
    """A host that names one machine (not loopback, not a wildcard) pins its group there."""
    return None if is_loopback(host) or is_wildcard(host) else host


def place(spec: FleetSpec, nodes: Iterable[Node]) -> Placement:
    """A node for every group (and the router), or :class:`PlacementError` naming the
    instance, what it asks for and what each live node has."""
    live = sorted((n for n in nodes if n.alive), key=lambda n: (not n.is_head, n.ip, n.node_id))
    if not live:
        raise PlacementError("the Ray cluster has no live node")
    left = {n.node_id: dict(n.resources) for n in live}
    chosen: dict[str, Node] = {}
    for d in demands(spec):
        need = d.total
        fits = [
            n
            for n in live
            if (d.pinned_ip is None or n.ip == d.pinned_ip)
            and all(left[n.node_id].get(k, 0.0) >= v - 1e-9 for k, v in need.items())
        ]
        if not fits:
            raise PlacementError(_no_fit(spec, d, live))
        node = fits[0]
        for k, v in need.items():
            left[node.node_id][k] -= v
        chosen[d.group] = node
    return Placement(chosen)


def _no_fit(spec: FleetSpec, d: Demand, live: list[Node]) -> str:
    each = ", ".join(f"{k} {_num(v)}" for k, v in sorted(d.per_instance.items()) if v) or "nothing"
    who = d.instances[0] if len(d.instances) == 1 else f"{len(d.instances)} instances"
    where = f"backend.ray.groups.{d.group}"
    pin = f" on {d.pinned_ip} (its host)" if d.pinned_ip else ""
    lacking = sorted(
        {k for k in d.per_instance if d.per_instance[k] and all(k not in n.resources for n in live)}
    )
    hint = (
        f"no node has {', '.join(lacking)}: start a node with it (`ray start --resources "
        f"'{{\"{lacking[0]}\": 1}}'`) or change {where}.resources"
        if lacking and lacking[0] not in ("CPU", "GPU")
        else f"add nodes, or lower what {where} asks for (num_cpus, num_gpus, resources)"
    )
    if d.pinned_ip and not any(n.ip == d.pinned_ip for n in live):
        hint = f"no live node has the address {d.pinned_ip}: fix the group's host or drop it"
    have = "; ".join(n.describe() for n in live)
    return (
        f"group {d.group!r} ({who}: {each} each{pin}) fits no live Ray node, counting what "
        f"the groups before it take. Nodes: {have}. Fix: {hint}"
    )


def resolve(spec: FleetSpec, placement: Placement) -> FleetSpec:
    """The spec as it runs on the placed nodes: loopback/wildcard hosts (and side-channel
    hosts) become the node's address; GPU indices are Ray's to choose, so pins go."""
    data = spec.model_dump(mode="python")
    for name, role, gi, g in named_groups(spec):
        ip = placement.node_of(name).ip
        entry = data[role][gi]
        if _pin(g.host) is None:
            entry["host"] = ip
        sc = g.side_channel_host
        if sc is None or is_wildcard(sc):
            entry["side_channel_host"] = ip if _pin(g.host) is None else g.host
        entry["devices"] = None
    for ri, r in enumerate(spec.render):
        if _pin(r.host) is None:
            ip = placement.node_of(render_group_name(ri, r, len(spec.render))).ip
            data["render"][ri]["host"] = ip
    if spec.router is not None and _pin(spec.router.host) is None:
        data["router"]["host"] = placement.node_of(ROUTER).ip
    return FleetSpec(**data)


def _internal(resource: str) -> bool:
    return resource.startswith("node:") or resource in ("memory", "object_store_memory")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"
