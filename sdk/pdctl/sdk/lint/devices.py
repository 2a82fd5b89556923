"""Rules PD012-PD013: GPU devices and CPU cores, enough of them and none shared."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from pdctl.sdk.fleetplan import (
    InstancePlan,
    compress_ranges,
    host_key,
)
from pdctl.sdk.lint.core import (
    Finding,
    LintContext,
    _f,
    rule,
)


@rule("PD012", "more devices or cores requested than listed")
def _devices_short(ctx: LintContext) -> Iterator[Finding]:
    gpu = ctx.spec.fleet.platform == "gpu"
    for role, gi, g, where in ctx.groups():
        need = g.count * g.ranks
        if gpu and g.devices is not None and len(g.devices) < need:
            yield _f(
                "PD012",
                "error",
                f"{where}.devices",
                f"{g.count} instance(s) x tp{g.tp} x pp{g.pp} x dp{g.dp} need {need} GPUs; "
                f"{len(g.devices)} listed",
                "instances start with too few GPUs and fail at start",
                f"list {need} devices, or lower count/tp/pp/dp",
            )
        if not gpu and g.cpu_cores is not None and len(g.cpu_cores) < g.count:
            yield _f(
                "PD012",
                "warning",
                f"{where}.cpu_cores",
                f"{g.count} instance(s) share {len(g.cpu_cores)} core(s): "
                + "; ".join(
                    f"{i.name} on core {compress_ranges(i.cpu_cores)}"
                    for i in ctx.instances_of(role, gi)
                ),
                "instances on one core take turns and each runs slower",
                f"list {g.count} cores for one each, or lower count",
            )
        elif not gpu and g.cpu_cores is not None and (len(g.cpu_cores) // g.count < g.ranks):
            yield _f(
                "PD012",
                "warning",
                f"{where}.cpu_cores",
                f"each instance gets {len(g.cpu_cores) // g.count} core(s) for {g.ranks} ranks",
                "ranks share a core and run several times slower",
                f"list {g.count * g.ranks} cores or lower tp/pp/dp",
            )


@rule("PD013", "one device or core given to two instances")
def _devices_shared(ctx: LintContext) -> Iterator[Finding]:
    kind = "GPU" if ctx.spec.fleet.platform == "gpu" else "core"
    owners: dict[tuple[str, int], list[InstancePlan]] = defaultdict(list)
    for inst in ctx.plan.instances:
        for d in inst.devices if kind == "GPU" else inst.cpu_cores:
            owners[(host_key(inst.host), d)].append(inst)
    for (hk, d), insts in sorted(owners.items()):
        # cores shared inside one group were asked for (PD012 says so)
        if len({(i.group_role, i.group_index) for i in insts}) > 1 or (
            kind == "GPU" and len(insts) > 1
        ):
            first = insts[-1]
            yield _f(
                "PD013",
                "error" if kind == "GPU" else "warning",
                f"{first.group_role}[{first.group_index}]."
                + ("devices" if kind == "GPU" else "cpu_cores"),
                f"{kind} {d} on {hk} is assigned to {', '.join(i.name for i in insts)}",
                "two engines on one GPU each reserve most of its memory; the second OOMs"
                if kind == "GPU"
                else "the engines compete for one core and both slow down",
                "give each instance its own devices",
            )


# --------------------------------------------------------------------------- transfer settings
