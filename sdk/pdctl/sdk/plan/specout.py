"""The recommended layout as a fleet spec (TOML), derived from the spec profiled (pure)."""

from __future__ import annotations

import json
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.plan.planner import Layout
from pdctl.sdk.spec import FleetSpec, InstanceGroup


def spec_for_layout(base: FleetSpec, layout: Layout) -> FleetSpec:
    """``base`` with its groups replaced by ``layout``'s: the first prefill (decode) group
    is the template; each instance gets as many CPU cores (GPUs: TP x PP x DP) as one
    instance of the template, taken in order from all the base groups' cores (GPUs)."""
    p_tpl = base.prefill[0] if base.prefill else base.decode[0]
    d_tpl = base.decode[0] if base.decode else p_tpl
    cores = [c for _, _, g in base.groups() for c in (g.cpu_cores or [])]
    devices = [d for _, _, g in base.groups() for d in (g.devices or [])]
    wanted = [(p_tpl, layout.prefill, "prefill")]
    if layout.decode:
        wanted.append((d_tpl, layout.decode, "decode"))
    groups: dict[str, list[InstanceGroup]] = {"prefill": [], "decode": []}
    used_cores = used_devices = 0
    for tpl, count, role in wanted:
        upd: dict[str, Any] = {"count": count, "tp": layout.tp, "mode": None}
        if tpl.cpu_cores:
            per = max(1, len(tpl.cpu_cores) // tpl.count)
            upd["cpu_cores"] = _take(cores, used_cores, count * per, "CPU cores")
            used_cores += count * per
        if tpl.devices:
            per = layout.tp * tpl.pp * tpl.dp
            upd["devices"] = _take(devices, used_devices, count * per, "GPUs")
            used_devices += count * per
        groups[role].append(tpl.model_copy(update=upd))
    fleet = base.fleet.model_copy(update={"mode": layout.mode})
    return base.model_copy(update={"fleet": fleet, **groups})


def _take(pool: list[int], start: int, n: int, what: str) -> list[int]:
    if start + n > len(pool):
        raise PdctlError(
            f"the base spec's groups hold {len(pool)} {what}; this layout needs {start + n} "
            "(an instance gets as many as one instance of the base spec's group): add them "
            "to the base spec's groups or lower --budget"
        )
    return pool[start : start + n]


def to_toml(spec: FleetSpec, header: str = "") -> str:
    """A TOML text of the spec's non-default fields (round-trips through the loader)."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    lines = [f"# {line}" for line in header.splitlines()]
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict | list)}
    for k, v in scalars.items():
        lines.append(f"{k} = {_value(v)}")
    for k, v in data.items():
        if isinstance(v, dict):
            _table(lines, k, v)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                _table(lines, k, item, array=True)
        elif isinstance(v, list):
            lines.append(f"{k} = {_value(v)}")
    return "\n".join(lines) + "\n"


def _table(lines: list[str], name: str, data: dict[str, Any], array: bool = False) -> None:
    lines.append("")
    lines.append(f"[[{name}]]" if array else f"[{name}]")
    nested = []
    for k, v in data.items():
        if isinstance(v, dict) and v and not all(isinstance(x, str) for x in v.values()):
            nested.append((k, v))
        elif v is not None:
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in nested:
        _table(lines, f"{name}.{k}", v)


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
