"""A group's instance count changed in a spec, by hand or from a plan (pure)."""

from __future__ import annotations

from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.spec import FleetSpec, group_name


class ScaleError(PdctlError):
    """The group or the plan does not fit the spec."""


def scaled(spec: FleetSpec, group: str, count: int) -> FleetSpec:
    """``spec`` with group ``group`` (its name as ``pdctl status`` shows it) at ``count``."""
    if count < 1:
        raise ScaleError(f"count {count}: a group needs at least 1 instance (pdctl down stops all)")
    names = []
    for role in ("prefill", "decode"):
        groups = list(getattr(spec, role))
        for i, g in enumerate(groups):
            name = group_name(role, i, g, len(groups))
            names.append(name)
            if name == group:
                groups[i] = g.model_copy(update={"count": count})
                return spec.model_copy(update={role: groups})
    raise ScaleError(f"no group {group!r} in the spec; its groups are {', '.join(names)}")


def counts_from_plan(spec: FleetSpec, plan: dict[str, Any]) -> dict[str, int]:
    """Group → count for the recommended layout of a ``pdctl plan --json`` document: the
    spec's first prefill and first decode group take the recommended counts."""
    best = next((c for c in plan.get("candidates", []) if c["layout"] == plan["recommended"]), None)
    if best is None:
        raise ScaleError("the plan has no recommended candidate; write it with pdctl plan --json")
    mode = best["mode"]
    if mode != spec.fleet.mode or (mode == "colocated") != (not spec.decode):
        raise ScaleError(
            f"the plan recommends {plan['recommended']} but the spec runs fleet.mode = "
            f"{spec.fleet.mode!r}: a mode change is a new spec — write it with pdctl plan --out "
            "spec.toml and pdctl up"
        )
    out = {group_name("prefill", 0, spec.prefill[0], len(spec.prefill)): int(best["prefill"])}
    if spec.decode:
        out[group_name("decode", 0, spec.decode[0], len(spec.decode))] = int(best["decode"])
    return out
