"""GPUs, NVLink peers, P2P status and PCIe ancestry from NVML (``nvidia-ml-py``, optional).

The ``pynvml`` module is imported lazily by name; when it is missing or ``nvmlInit``
fails (no driver: ``NVMLError_LibraryNotFound``) the answer is "unknown", never an
exception. Tests pass a stand-in module.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

from pdctl.sdk.preflight.model import GpuInfo, SourceCheck, Topology
from pdctl.sdk.preflight.sysfs import LIVE_SYSFS, pci_numa

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


def nvml_topology(
    module: Any | None = None, sysfs_root: Path = LIVE_SYSFS
) -> tuple[Topology | None, SourceCheck]:
    """Topology from NVML, or None with the reason."""
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
        topo = _read(nv, sysfs_root)
    except Exception as e:  # a driver that answers some calls and not others
        return None, SourceCheck("NVML", "error", f"NVML query failed: {type(e).__name__} {e}")
    finally:
        with contextlib.suppress(Exception):  # best effort on a half-working NVML
            nv.nvmlShutdown()
    return topo, SourceCheck("NVML", "ok", f"{len(topo.gpus)} GPU(s)")


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _read(nv: Any, sysfs_root: Path) -> Topology:
    topo = Topology(source="NVML")
    count = int(nv.nvmlDeviceGetCount())
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus: list[str | None] = []
    for i, h in enumerate(handles):
        pci = _try(nv.nvmlDeviceGetPciInfo, h)
        b = normalise_bus_id(_text(pci.busId)) if pci is not None else None
        bus.append(b)
        numa = _try(getattr(nv, "nvmlDeviceGetNumaNodeId", None) or (lambda _h: None), h)
        if not isinstance(numa, int) or numa < 0:
            numa = pci_numa(sysfs_root, b) if b else None
        name = _try(nv.nvmlDeviceGetName, h)
        topo.gpus.append(
            GpuInfo(
                index=i,
                name=_text(name) if name is not None else None,
                bus_id=b,
                numa=numa,
                pcie_gen=_try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                pcie_width=_try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
            )
        )
    index_of = {b: i for i, b in enumerate(bus) if b}
    for i, h in enumerate(handles):
        peers, to_switch = _nvlinks(nv, h)
        if to_switch:
            topo.nvswitch = True
        for peer_bus, n in peers.items():
            j = index_of.get(peer_bus)
            if j is not None and j != i:
                topo.links[(min(i, j), max(i, j))] = f"NV{n}"
        if to_switch:
            for j in range(count):
                if j != i:
                    topo.links.setdefault((min(i, j), max(i, j)), f"NV{to_switch}")
    for i, hi in enumerate(handles):
        for j, hj in enumerate(handles):
            if i == j:
                continue
            for cap in _WANTED_CAPS:
                res = _try(nv.nvmlDeviceGetP2PStatus, hi, hj, P2P_CAPS[cap])
                if isinstance(res, int):
                    topo.p2p.setdefault(cap, {})[(i, j)] = P2P_RESULT.get(res, "U")
            if i < j and (i, j) not in topo.links:
                level = _try(nv.nvmlDeviceGetTopologyCommonAncestor, hi, hj)
                if isinstance(level, int) and level in ANCESTOR:
                    topo.links[(i, j)] = ANCESTOR[level]
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
