"""The I/O edge: look at this host (or at recorded files) and build an :class:`Inventory`.

Every source is optional; each one tried is listed in ``Inventory.checks`` with what it
found, so a report can say plainly what was checked. ``--from-topo`` without
``--sysfs-root`` is fully offline: nothing of this machine is read.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.preflight.model import (
    Inventory,
    NicInfo,
    SourceCheck,
    SourceState,
    ToolsInfo,
    Topology,
)
from pdctl.sdk.preflight.nvml import merge_topologies, nvml_topology
from pdctl.sdk.preflight.sysfs import LIVE_SYSFS, gdr_status, netdev_speeds, read_rdma_nics
from pdctl.sdk.preflight.tools import nixl_info, parse_fi_info, parse_ucx_transports, run_tool
from pdctl.sdk.preflight.topo import parse_topo


class PreflightInputError(PdctlError):
    """A file given to the preflight cannot be read."""


def read_input(path: str | Path, what: str) -> str:
    p = Path(path).expanduser()
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise PreflightInputError(
            f"{what} {p}: cannot read it ({e.strerror or e}); check the path"
        ) from None


def collect_inventory(
    *,
    from_topo: str | Path | None = None,
    sysfs_root: str | Path | None = None,
) -> Inventory:
    checks: list[SourceCheck] = []
    offline = from_topo is not None
    if from_topo is not None:
        parsed = parse_topo(read_input(from_topo, "--from-topo"), str(from_topo))
        checks.append(SourceCheck("topo file", "ok", f"{from_topo}: {len(parsed.gpus)} GPU(s)"))
        topo: Topology | None = parsed
    else:
        topo = _live_topology(checks, Path(sysfs_root) if sysfs_root else LIVE_SYSFS)
    if topo is not None and not topo.gpus:
        topo.notes.append("no GPU rows found")
    inv = Inventory(topology=topo if topo is not None and topo.gpus else None, checks=checks)
    if offline and sysfs_root is None:
        checks.append(SourceCheck("sysfs", "skipped", "offline (--from-topo without --sysfs-root)"))
        checks.append(SourceCheck("tools", "skipped", "offline: fi_info/ucx_info/NIXL not run"))
        return inv
    root = Path(sysfs_root) if sysfs_root is not None else LIVE_SYSFS
    nics = read_rdma_nics(root)
    inv.nics = _label_nics(nics, topo)
    checks.append(
        SourceCheck(
            "RDMA NICs",
            "ok" if nics else "absent",
            f"{root / 'class/infiniband'}: {len(nics)} device(s)",
        )
    )
    inv.gdr = gdr_status(root)
    checks.append(SourceCheck("GPUDirect RDMA", _state(inv.gdr.present), inv.gdr.evidence))
    inv.netdev_speeds_mbps = netdev_speeds(root)
    checks.append(
        SourceCheck(
            "netdevs",
            "ok" if inv.netdev_speeds_mbps else "absent",
            f"{len(inv.netdev_speeds_mbps)} interface(s) with a link speed",
        )
    )
    if sysfs_root is None:
        inv.tools = _tools(checks)
    return inv


def _state(flag: bool | None) -> SourceState:
    return "ok" if flag else "absent"


def _live_topology(checks: list[SourceCheck], sysfs: Path) -> Topology | None:
    nv, check = nvml_topology(sysfs_root=sysfs)
    checks.append(check)
    text = run_tool(["nvidia-smi", "topo", "-m"])
    smi: Topology | None = None
    if text is None:
        checks.append(SourceCheck("nvidia-smi", "absent", "not on PATH, or it failed"))
    else:
        for cap in ("r", "w"):
            p2p = run_tool(["nvidia-smi", "topo", "-p2p", cap])
            if p2p:
                text += f"\n# nvidia-smi topo -p2p {cap}\n{p2p}"
        smi = parse_topo(text, "nvidia-smi topo -m")
        checks.append(SourceCheck("nvidia-smi", "ok", f"topo -m: {len(smi.gpus)} GPU(s)"))
    return merge_topologies(smi, nv)


def _label_nics(nics: list[NicInfo], topo: Topology | None) -> list[NicInfo]:
    if topo is None:
        return nics
    label_of = {name: label for label, name in topo.nic_names.items()}
    label_of.update({lab: lab for lab in topo.nic_labels if not lab.startswith("NIC")})
    return [replace(n, label=label_of.get(n.name)) for n in nics]


def _tools(checks: list[SourceCheck]) -> ToolsInfo:
    nixl = nixl_info()
    checks.append(
        SourceCheck(
            "NIXL",
            "ok" if nixl.installed else "absent",
            f"nixl {nixl.version}, backends {list(nixl.backends or [])}"
            if nixl.installed
            else "python package nixl not importable here",
        )
    )
    ucx = run_tool(["ucx_info", "-d"])
    transports = tuple(sorted({t for t, _ in parse_ucx_transports(ucx)})) if ucx else None
    checks.append(
        SourceCheck(
            "ucx_info",
            "ok" if ucx else "absent",
            f"transports {list(transports)}" if transports else "not on PATH, or it failed",
        )
    )
    fi = run_tool(["fi_info", "-p", "efa", "-t", "FI_EP_RDM"])
    entries = parse_fi_info(fi) if fi else []
    checks.append(
        SourceCheck(
            "fi_info",
            "ok" if fi else "absent",
            f"{len(entries)} EFA RDM domain(s)" if fi else "not on PATH, or no EFA provider",
        )
    )
    return ToolsInfo(
        nixl_installed=nixl.installed,
        nixl_version=nixl.version,
        nixl_backends=nixl.backends,
        ucx_transports=transports,
        fi_providers=tuple(sorted({e.provider for e in entries})) if fi else None,
        efa_domains=len(entries) if fi else None,
    )
