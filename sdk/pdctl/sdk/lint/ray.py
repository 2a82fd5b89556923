"""Rules PD032-PD035: mistakes that only matter on Ray."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.sdk.fleetplan import (
    is_loopback,
)
from pdctl.sdk.lint.core import (
    Finding,
    LintContext,
    _f,
    rule,
)
from pdctl.sdk.spec import (
    InstanceGroup,
    RaySpec,
    group_name,
    render_group_name,
)

# --------------------------------------------------------------------------- Ray


def _ray(ctx: LintContext) -> RaySpec | None:
    if ctx.spec.backend.kind != "ray":
        return None
    return ctx.spec.backend.ray or RaySpec()


@rule("PD032", "loopback side-channel host on Ray")
def _ray_sc_loopback(ctx: LintContext) -> Iterator[Finding]:
    if _ray(ctx) is None:
        return
    for _r, _gi, g, where in ctx.groups():
        sc = g.side_channel_host
        if sc is not None and is_loopback(sc):
            yield _f(
                "PD032",
                "error",
                f"{where}.side_channel_host",
                f"side_channel_host = {sc!r} on Ray, where groups run on whichever nodes "
                "have their resources",
                "a peer on another node connects to its own loopback: NIXL handshakes fail "
                "and every request errors or recomputes",
                f"remove side_channel_host from {where}: pdctl advertises the node's address",
            )


def _named_groups(ctx: LintContext) -> Iterator[tuple[str, InstanceGroup, str]]:
    """(group name, group, spec location) of every prefill and decode group."""
    n_by_role = {"prefill": len(ctx.spec.prefill), "decode": len(ctx.spec.decode)}
    for role, gi, g, where in ctx.groups():
        yield group_name(role, gi, g, n_by_role[role]), g, where


@rule("PD033", "instances on Ray without the GPUs they need")
def _ray_gpus(ctx: LintContext) -> Iterator[Finding]:
    ray = _ray(ctx)
    if ray is None:
        return
    gpu = ctx.spec.fleet.platform == "gpu"
    for name, g, where in _named_groups(ctx):
        placed = ray.groups.get(name)
        n = placed.num_gpus if placed is not None else None
        field_ = f"backend.ray.groups.{name}.num_gpus"
        if gpu and n is not None and (n == 0 or (g.ranks > 1 and n < g.ranks)):
            yield _f(
                "PD033",
                "error",
                field_,
                f"num_gpus = {n:g} but each instance of {where} runs tp x pp x dp = {g.ranks} "
                "GPU workers",
                "Ray hides the GPUs it did not grant (CUDA_VISIBLE_DEVICES): the engine finds "
                "too few devices and exits at start",
                f"remove num_gpus (pdctl asks for {g.ranks}) or set it to {g.ranks}",
            )
        elif not gpu and n:
            yield _f(
                "PD033",
                "warning",
                field_,
                f"num_gpus = {n:g} on the CPU platform",
                "the instance holds GPUs it never uses; other work cannot be placed on them",
                "remove num_gpus",
            )


@rule("PD034", "Ray placement for a group that does not exist")
def _ray_unknown_groups(ctx: LintContext) -> Iterator[Finding]:
    ray = _ray(ctx)
    if ray is None:
        return
    known = {name for name, _g, _w in _named_groups(ctx)}
    known |= {render_group_name(i, r, len(ctx.spec.render)) for i, r in enumerate(ctx.spec.render)}
    if ctx.spec.router is not None:
        known.add("router")
    for name in sorted(set(ray.groups) - known):
        yield _f(
            "PD034",
            "error",
            f"backend.ray.groups.{name}",
            f"no group is named {name!r} (groups: {', '.join(sorted(known))})",
            "the placement meant for it applies to nothing: its instances land on any node "
            "with a free CPU, not the one that was meant",
            "rename the table after a group above (its name, or prefill/decode with one group "
            "per role, prefill-a/prefill-b… with several)",
        )


@rule("PD035", "GPU indices pinned on Ray")
def _ray_devices(ctx: LintContext) -> Iterator[Finding]:
    if _ray(ctx) is None or ctx.spec.fleet.platform != "gpu":
        return
    for _r, _gi, g, where in ctx.groups():
        if g.devices is not None:
            yield _f(
                "PD035",
                "warning",
                f"{where}.devices",
                "devices are ignored on Ray: Ray grants each instance its GPUs",
                "placement reasoning based on the pins (NVLink neighbours, one NUMA node) does "
                "not hold",
                "remove devices; steer placement with backend.ray.groups.<group>.resources",
            )
