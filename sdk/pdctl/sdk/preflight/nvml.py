"""GPUs, NVLink peers, P2P status and PCIe ancestry from NVML (``nvidia-ml-py``, optional).

The ``pynvml`` module is imported lazily by name; when it is missing or ``nvmlInit``
fails (no driver: ``NVMLError_LibraryNotFound``) the answer is "unknown", never an
exception. Tests pass a stand-in module.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path
from typing import Any

from pdctl.sdk.preflight.model import GpuInfo, SourceCheck, Topology
from pdctl.sdk.preflight.sysfs import LIVE_SYSFS, Sysfs, dump_sysfs, parse_sysfs, pci_numa

P2P_CAPS = {"r": 0, "w": 1, "n": 2, "a": 3, "p": 4}
P2P_RESULT = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
ANCESTOR = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
"""nvmlGpuTopologyLevel → topo -m cell (INTERNAL=0, SINGLE=10, MULTIPLE=20, HOSTBRIDGE=30,
NODE=40, SYSTEM=50)."""
REMOTE_SWITCH = 2
MAX_NVLINKS = 18
_WANTED_CAPS = ("r", "w")


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def normalise_bus_id(bus: str) -> str:
    """``00000000:1B:00.0`` → ``0000:1b:00.0`` (sysfs form)."""
    b = bus.strip().lower()
    head, _, tail = b.partition(":")
    if len(head) == 8:
        head = head[4:]
    return f"{head}:{tail}" if tail else b


def nvml_dump(module: Any | None = None) -> tuple[str | None, SourceCheck]:
    """What NVML says, as JSON text (parsed by :func:`parse_nvml`), or None with the reason."""
    nv = module
    if nv is None:
        try:
            nv = importlib.import_module("pynvml")
        except ImportError:
            return None, SourceCheck(
                "NVML", "absent", "nvidia-ml-py not installed (pip install 'pdctl[gpu]')"
            )
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, …
        return None, SourceCheck("NVML", "absent", f"nvmlInit failed: {type(e).__name__} {e}")
    try:
        data = _read(nv)
    except Exception as e:  # a driver that answers some calls and not others
        return None, SourceCheck("NVML", "error", f"NVML query failed: {type(e).__name__} {e}")
    finally:
        with contextlib.suppress(Exception):  # best effort on a half-working NVML
            nv.nvmlShutdown()
    return json.dumps(data, indent=1), SourceCheck("NVML", "ok", f"{len(data['gpus'])} GPU(s)")


def nvml_topology(
    module: Any | None = None, sysfs_root: Path | Sysfs = LIVE_SYSFS
) -> tuple[Topology | None, SourceCheck]:
    """Topology from NVML, or None with the reason (dump, then parse)."""
    text, check = nvml_dump(module)
    if text is None:
        return None, check
    fs = sysfs_root if isinstance(sysfs_root, Sysfs) else parse_sysfs(dump_sysfs(sysfs_root))
    return parse_nvml(text, fs), check


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _read(nv: Any) -> dict[str, Any]:
    count = int(nv.nvmlDeviceGetCount())
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus: list[dict[str, Any]] = []
    for i, h in enumerate(handles):
        pci = _try(nv.nvmlDeviceGetPciInfo, h)
        numa = _try(getattr(nv, "nvmlDeviceGetNumaNodeId", None) or (lambda _h: None), h)
        name = _try(nv.nvmlDeviceGetName, h)
        peers, to_switch = _nvlinks(nv, h)
        gpus.append(
            {
                "index": i,
                "name": _text(name) if name is not None else None,
                "bus_id": normalise_bus_id(_text(pci.busId)) if pci is not None else None,
                "numa": numa if isinstance(numa, int) and numa >= 0 else None,
                "pcie_gen": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                "pcie_width": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
                "nvlink_peers": peers,
                "nvlinks_to_switch": to_switch,
            }
        )
    p2p: dict[str, dict[str, str]] = {}
    ancestor: dict[str, str] = {}
    for i, hi in enumerate(handles):
        for j, hj in enumerate(handles):
            if i == j:
                continue
            for cap in _WANTED_CAPS:
                res = _try(nv.nvmlDeviceGetP2PStatus, hi, hj, P2P_CAPS[cap])
                if isinstance(res, int):
                    p2p.setdefault(cap, {})[f"{i},{j}"] = P2P_RESULT.get(res, "U")
            if i < j:
                level = _try(nv.nvmlDeviceGetTopologyCommonAncestor, hi, hj)
                if isinstance(level, int) and level in ANCESTOR:
                    ancestor[f"{i},{j}"] = ANCESTOR[level]
    return {"gpus": gpus, "p2p": p2p, "common_ancestor": ancestor}


def parse_nvml(text: str, sysfs: Sysfs | None = None) -> Topology:
    """The JSON of :func:`nvml_dump` → Topology (NUMA from sysfs when NVML had none)."""
    topo = Topology(source="NVML")
    try:
        data = json.loads(text)
        gpus = list(data.get("gpus", []))
    except (ValueError, AttributeError, TypeError):
        topo.notes.append("NVML record unreadable")
        return topo
    index_of = {g.get("bus_id"): int(g["index"]) for g in gpus if g.get("bus_id")}
    for g in gpus:
        i, bus = int(g["index"]), g.get("bus_id")
        numa = g.get("numa")
        if numa is None and bus and sysfs is not None:
            numa = pci_numa(sysfs, bus)
        topo.gpus.append(
            GpuInfo(
                index=i,
                name=g.get("name"),
                bus_id=bus,
                numa=numa,
                pcie_gen=g.get("pcie_gen"),
                pcie_width=g.get("pcie_width"),
            )
        )
        to_switch = int(g.get("nvlinks_to_switch") or 0)
        if to_switch:
            topo.nvswitch = True
        for peer_bus, n in (g.get("nvlink_peers") or {}).items():
            j = index_of.get(peer_bus)
            if j is not None and j != i:
                topo.links[(min(i, j), max(i, j))] = f"NV{n}"
        if to_switch:
            for o in gpus:
                j = int(o["index"])
                if j != i:
                    topo.links.setdefault((min(i, j), max(i, j)), f"NV{to_switch}")
    for cap, table in (data.get("p2p") or {}).items():
        for key, letter in table.items():
            a, _, b = key.partition(",")
            topo.p2p.setdefault(cap, {})[(int(a), int(b))] = letter
    for key, cell in (data.get("common_ancestor") or {}).items():
        a, _, b = key.partition(",")
        topo.links.setdefault((int(a), int(b)), cell)
    return topo


def _nvlinks(nv: Any, h: Any) -> tuple[dict[str, int], int]:
    """Active links per peer bus id, and active links to an NVSwitch."""
    peers: dict[str, int] = {}
    switch = 0
    for link in range(MAX_NVLINKS):
        state = _try(nv.nvmlDeviceGetNvLinkState, h, link)
        if state != 1:
            continue
        kind = _try(
            getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None) or (lambda *_: None), h, link
        )
        if kind == REMOTE_SWITCH:
            switch += 1
            continue
        remote = _try(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        if remote is not None:
            b = normalise_bus_id(_text(remote.busId))
            peers[b] = peers.get(b, 0) + 1
    return peers, switch


def merge_topologies(smi: Topology | None, nvml: Topology | None) -> Topology | None:
    """nvidia-smi's matrix (it has the NIC columns) enriched with NVML's per-GPU facts."""
    if smi is None or nvml is None:
        return smi or nvml
    by_index = {g.index: g for g in nvml.gpus}
    merged: list[GpuInfo] = []
    for g in smi.gpus:
        n = by_index.get(g.index)
        if n is None:
            merged.append(g)
            continue
        merged.append(
            GpuInfo(
                index=g.index,
                name=n.name,
                bus_id=n.bus_id,
                numa=g.numa if g.numa is not None else n.numa,
                cpu_affinity=g.cpu_affinity,
                pcie_gen=n.pcie_gen,
                pcie_width=n.pcie_width,
            )
        )
    smi.gpus = merged
    for cap, table in nvml.p2p.items():
        smi.p2p.setdefault(cap, table)
    smi.nvswitch = nvml.nvswitch
    smi.source = f"{smi.source} + NVML"
    return smi
