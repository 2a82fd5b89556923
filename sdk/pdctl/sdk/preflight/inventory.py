"""Collected texts → an :class:`Inventory` of one host (live, recorded files or a bundle).

Every source is optional; each one is listed in ``Inventory.checks`` with what it found,
so a report says plainly what was checked. A live run goes through the same parser as a
bundle: :func:`collect_inventory` collects the texts (:mod:`.sources`) and hands them to
:func:`inventory_from_sources`. ``--from-topo`` without ``--sysfs-root`` is fully
offline: nothing of this machine is read.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.preflight import sources as S
from pdctl.sdk.preflight.model import (
    GdrStatus,
    GpuInfo,
    Inventory,
    NicInfo,
    SourceCheck,
    SourceState,
    ToolsInfo,
    Topology,
)
from pdctl.sdk.preflight.nvml import merge_topologies, parse_nvml
from pdctl.sdk.preflight.sysfs import (
    dump_sysfs,
    gdr_status,
    netdev_speeds,
    numa_nodes,
    parse_sysfs,
    read_rdma_nics,
)
from pdctl.sdk.preflight.tools import (
    efa_devices,
    gdr_from_lsmod,
    nics_from_ibv,
    parse_fi_info,
    parse_ibv_devinfo,
    parse_lsmod,
    parse_nvidia_smi_q,
    parse_ucx_transports,
)
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


def gather_sources(
    *, from_topo: str | Path | None = None, sysfs_root: str | Path | None = None
) -> S.Sources:
    """The texts a run reads: recorded files when given, else this machine (``--sysfs-root``
    replaces ``/sys`` and skips the tool commands)."""
    if from_topo is None:
        root = Path(sysfs_root) if sysfs_root is not None else None
        return S.collect_sources(sysfs_root=root, tools=root is None)
    src = S.Sources(origin="files")
    src.add(S.Collected(S.TOPO, "ok", read_input(from_topo, "--from-topo"), str(from_topo)))
    if sysfs_root is not None:
        src.add(S.Collected(S.SYSFS, "ok", dump_sysfs(Path(sysfs_root)), str(sysfs_root)))
    else:
        src.add(S.Collected(S.SYSFS, "skipped", None, "offline (--from-topo without --sysfs-root)"))
    src.records["tools"] = {"name": "tools", "state": "skipped"}
    return src


def collect_inventory(
    *, from_topo: str | Path | None = None, sysfs_root: str | Path | None = None
) -> Inventory:
    return inventory_from_sources(gather_sources(from_topo=from_topo, sysfs_root=sysfs_root))


def _check(src: S.Sources, name: str, label: str, found: str) -> SourceCheck:
    state = src.state(name)
    rec = src.records.get(name, {})
    if state == "ok" and name in src.texts:
        return SourceCheck(label, "ok", found)
    why = str(rec.get("detail") or "") or ("not collected" if state is None else str(state))
    st: SourceState = (
        "skipped" if state == "skipped" else "error" if state in ("error", "timeout") else "absent"
    )
    return SourceCheck(label, st, why)


def _json(src: S.Sources, name: str) -> dict[str, Any]:
    try:
        data = json.loads(src.texts.get(name) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def inventory_from_sources(src: S.Sources) -> Inventory:
    """One host from its collected texts: the only place sources become an inventory."""
    checks: list[SourceCheck] = []
    fs = parse_sysfs(src.texts[S.SYSFS]) if S.SYSFS in src.texts else None
    topo = _topology(src, fs, checks)
    inv = Inventory(
        topology=topo if topo is not None and topo.gpus else None,
        checks=checks,
        host=src.host,
        addresses=src.addresses,
        env={str(k): str(v) for k, v in _json(src, S.ENV).items()},
    )
    sysfs_nics = read_rdma_nics(fs) if fs is not None else []
    ibv = parse_ibv_devinfo(src.texts.get(S.IBV, ""))
    fi = parse_fi_info(src.texts.get(S.FI_INFO, "")) if S.FI_INFO in src.texts else None
    nics = _nics(sysfs_nics, nics_from_ibv(ibv), efa_devices(fi or []))
    inv.nics = _label_nics(nics, topo)
    where = "sysfs" if sysfs_nics else "ibv_devinfo" if ibv else "fi_info" if nics else ""
    if fs is None and not nics:
        checks.append(_check(src, S.SYSFS, "RDMA NICs", ""))
    else:
        checks.append(
            SourceCheck(
                "RDMA NICs",
                "ok" if nics else "absent",
                f"{len(nics)} device(s)" + (f" ({where})" if where else " in class/infiniband"),
            )
        )
    inv.gdr = _gdr(src, fs)
    checks.append(
        SourceCheck("GPUDirect RDMA", "ok" if inv.gdr.present else "absent", inv.gdr.evidence)
    )
    if fs is not None:
        inv.netdev_speeds_mbps = netdev_speeds(fs)
        checks.append(
            SourceCheck(
                "netdevs",
                "ok" if inv.netdev_speeds_mbps else "absent",
                f"{len(inv.netdev_speeds_mbps)} interface(s) with a link speed",
            )
        )
        nodes = numa_nodes(fs)
        if nodes:
            layout = "; ".join(f"node{n}: {cpus}" for n, cpus in sorted(nodes.items()))
            checks.append(SourceCheck("NUMA", "ok", layout))
    else:
        checks.append(_check(src, S.SYSFS, "sysfs", ""))
    if "tools" in src.records and not any(n in src.texts for n in (S.UCX_INFO, S.FI_INFO, S.IBV)):
        checks.append(SourceCheck("tools", "skipped", "offline: fi_info/ucx_info/NIXL not run"))
        return inv
    inv.tools = _tools(src, fi, checks)
    return inv


def _topology(src: S.Sources, fs: Any, checks: list[SourceCheck]) -> Topology | None:
    smi: Topology | None = None
    text = src.texts.get(S.TOPO)
    if text is not None:
        for cap, name in S.P2P.items():
            if src.texts.get(name):
                text += f"\n# nvidia-smi topo -p2p {cap}\n{src.texts[name]}"
        smi = parse_topo(text, "nvidia-smi topo -m")
        recorded = not src.records.get(S.TOPO, {}).get("argv")
        label = "topo file" if recorded else "nvidia-smi"
        detail = src.records.get(S.TOPO, {}).get("detail") or "topo -m"
        checks.append(SourceCheck(label, "ok", f"{detail}: {len(smi.gpus)} GPU(s)"))
    elif S.ROCM in src.texts:
        smi = parse_topo(src.texts[S.ROCM])
        checks.append(SourceCheck("rocm-smi", "ok", f"--showtopo: {len(smi.gpus)} GPU(s)"))
    else:
        checks.append(_check(src, S.TOPO, "nvidia-smi", ""))
    nv: Topology | None = None
    if S.NVML in src.texts:
        nv = parse_nvml(src.texts[S.NVML], fs)
        checks.append(SourceCheck("NVML", "ok", f"{len(nv.gpus)} GPU(s)"))
    elif src.state(S.NVML) is not None:
        checks.append(_check(src, S.NVML, "NVML", ""))
    topo = merge_topologies(smi, nv)
    if S.SMI_Q in src.texts:
        q = parse_nvidia_smi_q(src.texts[S.SMI_Q])
        versions = f"driver {q.driver}, CUDA {q.cuda}" if q.driver else "no driver line"
        checks.append(SourceCheck("nvidia-smi -q", "ok", f"{len(q.gpus)} GPU(s); {versions}"))
        topo = _with_query(topo, q.gpu_infos())
    if topo is not None and not topo.gpus:
        topo.notes.append("no GPU rows found")
    return topo


def _with_query(topo: Topology | None, infos: list[GpuInfo]) -> Topology | None:
    """Names, bus ids and PCIe links from ``nvidia-smi -q`` where the topology lacks them."""
    if not infos:
        return topo
    if topo is None:
        return Topology(source="nvidia-smi -q", gpus=infos)
    by_index = {g.index: g for g in infos}
    topo.gpus = [
        replace(
            g,
            name=g.name or q.name,
            bus_id=g.bus_id or q.bus_id,
            pcie_gen=g.pcie_gen or q.pcie_gen,
            pcie_width=g.pcie_width or q.pcie_width,
        )
        if (q := by_index.get(g.index)) is not None
        else g
        for g in topo.gpus
    ]
    return topo


def _nics(sysfs: list[NicInfo], ibv: list[NicInfo], efa: list[str]) -> list[NicInfo]:
    """sysfs first (it has NUMA and bus ids), filled in from ibv_devinfo; else ibv_devinfo;
    else the EFA devices fi_info lists."""
    if sysfs:
        by_name = {n.name: n for n in ibv}
        return [
            replace(
                n,
                rate_gbps=n.rate_gbps or (b.rate_gbps if b else None),
                state=n.state or (b.state if b else None),
            )
            if (b := by_name.get(n.name)) is not None
            else n
            for n in sysfs
        ]
    if ibv:
        return ibv
    return [NicInfo(name=d, driver="efa", vendor="0x1d0f") for d in efa]


def _gdr(src: S.Sources, fs: Any) -> GdrStatus:
    status = gdr_status(fs) if fs is not None else GdrStatus(None, "sysfs not collected")
    if status.present is None and S.LSMOD in src.texts:
        return gdr_from_lsmod(parse_lsmod(src.texts[S.LSMOD]))
    return status


def _label_nics(nics: list[NicInfo], topo: Topology | None) -> list[NicInfo]:
    if topo is None:
        return nics
    label_of = {name: label for label, name in topo.nic_names.items()}
    label_of.update({lab: lab for lab in topo.nic_labels if not lab.startswith("NIC")})
    return [replace(n, label=label_of.get(n.name)) for n in nics]


def _tools(src: S.Sources, fi: Any, checks: list[SourceCheck]) -> ToolsInfo:
    nixl = _json(src, S.NIXL)
    installed = bool(nixl.get("installed")) if nixl else None
    backends = nixl.get("backends")
    checks.append(
        SourceCheck("NIXL", "ok", f"nixl {nixl.get('version')}, backends {list(backends or [])}")
        if installed
        else _check(src, S.NIXL, "NIXL", "")
        if not nixl
        else SourceCheck("NIXL", "absent", "python package nixl not importable there")
    )
    ucx = src.texts.get(S.UCX_INFO)
    transports = tuple(sorted({t for t, _ in parse_ucx_transports(ucx)})) if ucx else None
    checks.append(_check(src, S.UCX_INFO, "ucx_info", f"transports {list(transports or [])}"))
    entries = fi or []
    devices = efa_devices(entries)
    checks.append(_check(src, S.FI_INFO, "fi_info", f"{len(devices)} EFA device(s)"))
    if S.IBV in src.texts or src.state(S.IBV) is not None:
        n = len(parse_ibv_devinfo(src.texts.get(S.IBV, "")))
        checks.append(_check(src, S.IBV, "ibv_devinfo", f"{n} device(s)"))
    versions = _json(src, S.VERSIONS)
    if versions:
        found = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        checks.append(SourceCheck("versions", "ok", found))
    return ToolsInfo(
        nixl_installed=installed,
        nixl_version=nixl.get("version") if nixl else None,
        nixl_backends=tuple(backends) if isinstance(backends, list) else None,
        ucx_transports=transports,
        fi_providers=tuple(sorted({e.provider for e in entries})) if fi is not None else None,
        efa_domains=len(devices) if fi is not None else None,
    )
