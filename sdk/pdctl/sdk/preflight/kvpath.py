"""Which path KV takes between two GPUs, and its nominal bandwidth (pure).

First match wins: same GPU → ``SAME_GPU``; NVLink (direct or NVSwitch) → ``NVLINK``; P2P
READ+WRITE OK → ``PCIE_P2P``; no P2P → ``HOST_STAGED``; across hosts with active RDMA →
``RDMA_IB`` / ``RDMA_ROCE`` / ``EFA`` when GPUDirect RDMA is usable (GDR present and the
NIC PIX/PXB to the GPU), else ``RDMA_HOST_STAGED``; otherwise ``TCP``. Bandwidths are
bytes per second per direction; nominal x efficiency η gives the expectation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pdctl.sdk.preflight.model import Inventory, NicInfo, Topology
from pdctl.sdk.preflight.parts import lookup

GB = 1e9


class PathClass(StrEnum):
    SAME_GPU = "SAME_GPU"
    NVLINK = "NVLINK"
    XGMI = "XGMI"
    PCIE_P2P = "PCIE_P2P"
    HOST_STAGED = "HOST_STAGED"
    RDMA_IB = "RDMA_IB"
    RDMA_ROCE = "RDMA_ROCE"
    EFA = "EFA"
    RDMA_HOST_STAGED = "RDMA_HOST_STAGED"
    TCP = "TCP"
    UNKNOWN = "UNKNOWN"


NVLINK_PER_LINK = 25 * GB
"""Per direction per link of NVLink 2-4 (NV18 = 450 GB/s on H100/H200, NV12 = 300 on A100);
used, and said to be assumed, when the part is not in :mod:`.parts`."""
PCIE_X16 = {3: 12.5 * GB, 4: 25 * GB, 5: 50 * GB, 6: 100 * GB}
"""Per direction, x16, practical."""
PCIE_FLOOR_BPS = PCIE_X16[3] / 2
"""The least a PCIe GPU link gives (Gen3 x8): what the TCP-fallback check compares with
when the generation is unknown."""
NIC_DEFAULT_GBIT = {"ib": 400.0, "roce": 100.0, "efa": 100.0, "unknown": 100.0}
ASSUMED_TCP_GBIT = 10.0
FALLBACK_BPS = 0.4 * GB
"""What NIXL achieves when it silently falls back to TCP or a software path (0.3-0.5 GB/s)."""
FALLBACK_RANGE = "0.3-0.5 GB/s"

EFFICIENCY: dict[PathClass, float] = {
    PathClass.NVLINK: 0.8,
    PathClass.XGMI: 0.8,
    PathClass.PCIE_P2P: 0.8,
    PathClass.HOST_STAGED: 0.5,
    PathClass.RDMA_IB: 0.85,
    PathClass.RDMA_ROCE: 0.85,
    PathClass.EFA: 0.85,
    PathClass.RDMA_HOST_STAGED: 0.85,
    PathClass.TCP: 0.65,
}
P2P_THROUGH_CPU_EFFICIENCY = 0.65
_NEAR = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class PathChoice:
    path: PathClass
    nominal_bps: float | None
    efficiency: float
    basis: str
    """How the nominal figure was derived."""
    cell: str | None = None
    """The topo cell between the two GPUs (same host) or GPU↔NIC (across hosts)."""
    nic: str | None = None
    gdr: bool | None = None
    assumed: tuple[str, ...] = field(default_factory=tuple)
    floor_bps: float | None = None
    """The least this path gives on any part (when the nominal figure is unknown)."""

    @property
    def expected_bps(self) -> float | None:
        return None if self.nominal_bps is None else self.nominal_bps * self.efficiency


def p2p_ok(topo: Topology, a: int, b: int) -> tuple[bool | None, str]:
    """P2P a→b from the best source available: read+write, else PCI, else CUDA, else any."""
    r, w = topo.p2p.get("r", {}).get((a, b)), topo.p2p.get("w", {}).get((a, b))
    if r is not None and w is not None:
        return r == "OK" and w == "OK", f"P2P read {r}, write {w}"
    for cap, what in (("p", "P2P (PCI)"), ("cuda", "CUDA peer access"), ("?", "P2P")):
        v = topo.p2p.get(cap, {}).get((a, b))
        if v is not None:
            return v == "OK", f"{what} {v}"
    if r is not None or w is not None:
        return (r or w) == "OK", f"P2P {'read' if r else 'write'} {r or w} (other unknown)"
    return None, "P2P status unknown"


def pcie_bps(topo: Topology | None, gpu: int) -> tuple[float | None, str, tuple[str, ...]]:
    """PCIe bandwidth of a GPU's link: NVML/nvidia-smi -q facts, else the part's table row,
    else unknown (never an assumed generation)."""
    g = topo.gpu(gpu) if topo is not None else None
    part = lookup(g.name if g else None)
    gen = g.pcie_gen if g and g.pcie_gen in PCIE_X16 else None
    width = g.pcie_width if g and g.pcie_width else None
    how = "measured link"
    if gen is None and part is not None and part.pcie_gen in PCIE_X16:
        gen, width, how = part.pcie_gen, width or part.pcie_width, f"{part.family} part"
    if gen is None:
        what = f"part {g.name!r} not in the table" if g and g.name else "GPU model unknown"
        return None, "PCIe generation unknown", (f"PCIe bandwidth unknown ({what})",)
    w = width or 16
    return PCIE_X16[gen] * min(w, 16) / 16, f"PCIe Gen{gen} x{w} ({how})", ()


def _link_rate(topo: Topology, a: int, kind: str) -> tuple[float | None, str, tuple[str, ...]]:
    g = topo.gpu(a)
    part = lookup(g.name if g else None)
    if part is not None and part.link_bps is not None:
        return part.link_bps, f"{part.link_kind} ({part.family})", ()
    if kind == "NVLink":
        why = f"part {g.name!r} unknown" if g and g.name else "GPU model unknown"
        return NVLINK_PER_LINK, "NVLink", (f"NVLink generation unknown ({why}): 25 GB/s per link",)
    return None, kind, (f"{kind} rate unknown for this part",)


def classify_same_host(topo: Topology, a: int, b: int) -> PathChoice:
    if a == b:
        return PathChoice(PathClass.SAME_GPU, None, 1.0, "same GPU: no transfer", "X")
    if topo.gpu(a) is None or topo.gpu(b) is None:
        missing = a if topo.gpu(a) is None else b
        return PathChoice(PathClass.UNKNOWN, None, 1.0, f"GPU{missing} is not in the inventory")
    cell = topo.link(a, b)
    links = topo.nvlink_count(a, b)
    if links:
        rate, kind, assumed = _link_rate(topo, a, "NVLink")
        nominal = links * rate if rate is not None else None
        return PathChoice(
            PathClass.NVLINK,
            nominal,
            EFFICIENCY[PathClass.NVLINK],
            f"{cell}: {links} links of {kind} x {(rate or 0) / GB:g} GB/s per direction",
            cell,
            assumed=assumed,
        )
    if cell == "XGMI":
        rate, kind, assumed = _link_rate(topo, a, "xGMI")
        return PathChoice(
            PathClass.XGMI,
            rate,
            EFFICIENCY[PathClass.XGMI],
            f"XGMI: one {kind} link" + (f" x {rate / GB:g} GB/s per direction" if rate else ""),
            cell,
            assumed=assumed,
        )
    pcie, basis, assumed = pcie_bps(topo, a)
    ok, why = p2p_ok(topo, a, b)
    if ok:
        local = cell in ("PIX", "PXB")
        eff = EFFICIENCY[PathClass.PCIE_P2P] if local else P2P_THROUGH_CPU_EFFICIENCY
        where = "switch-local" if local else f"through the CPU ({cell or 'path unknown'})"
        return PathChoice(
            PathClass.PCIE_P2P,
            pcie,
            eff,
            f"{basis}, {why}, {where}",
            cell,
            assumed=assumed,
            floor_bps=PCIE_FLOOR_BPS * eff,
        )
    if ok is None:
        assumed = (*assumed, f"{why}: assumed none (conservative); check nvidia-smi topo -p2p r")
    return PathChoice(
        PathClass.HOST_STAGED,
        pcie,
        EFFICIENCY[PathClass.HOST_STAGED],
        f"{basis} via host memory ({why})",
        cell,
        assumed=assumed,
        floor_bps=PCIE_FLOOR_BPS * EFFICIENCY[PathClass.HOST_STAGED],
    )


def closest_nics(topo: Topology, gpu: int) -> tuple[str | None, list[str]]:
    """The best topo cell from a GPU to any NIC, and the NIC labels at that distance."""
    cells = {nic: c for (g, nic), c in topo.gpu_nic.items() if g == gpu}
    for level in _NEAR:
        at = [nic for nic, c in cells.items() if c == level]
        if at:
            return level, sorted(at)
    return None, []


def _nic_sharers(topo: Topology, label: str) -> int:
    return max(1, sum(1 for g in topo.gpus if label in closest_nics(topo, g.index)[1]))


def classify_cross_host(inv: Inventory, gpu: int) -> PathChoice:
    """The path from ``gpu`` on this host to an identical GPU on another, identical host."""
    topo = inv.topology
    active = [n for n in inv.nics if n.active is not False]
    level, labels = closest_nics(topo, gpu) if topo is not None else (None, [])
    if not active and not (labels and not inv.nics):
        return _tcp(inv)
    assumed: list[str] = []
    chosen: list[tuple[str, NicInfo | None]] = [(lab, inv.nic(lab)) for lab in labels]
    chosen = [(lab, n) for lab, n in chosen if n is None or n.active is not False]
    if not chosen:
        chosen = [(n.label or n.name, n) for n in active]
        level = None
        assumed.append("GPU-to-NIC distance unknown (no NIC columns in topo -m)")
    nic = chosen[0][1]
    kind = nic.kind if nic is not None else "unknown"
    if nic is None:
        assumed.append("NIC type unknown (no sysfs record): assumed InfiniBand")
        kind = "ib"
    total = 0.0
    for label, n in chosen:
        gbit = n.rate_gbps if n is not None and n.rate_gbps else None
        if gbit is None:
            gbit = NIC_DEFAULT_GBIT[kind]
            assumed.append(f"{label}: link rate unknown, assumed {gbit:g} Gb/s")
        total += gbit / 8 * GB / (_nic_sharers(topo, label) if topo is not None else 1)
    path = {"efa": PathClass.EFA, "roce": PathClass.RDMA_ROCE}.get(kind, PathClass.RDMA_IB)
    gdr = nic.gdr if kind == "efa" and nic is not None and nic.gdr is not None else inv.gdr.present
    names = ", ".join((n.name if n else topo.nic_name(lab) if topo else lab) for lab, n in chosen)
    basis = f"{names}: {total / GB:.1f} GB/s share of NIC capacity"
    if not gdr or level not in ("PIX", "PXB"):
        pcie, _, more = pcie_bps(topo, gpu)
        staged = (
            min(total, pcie * EFFICIENCY[PathClass.HOST_STAGED] / EFFICIENCY[path])
            if pcie is not None
            else None
        )
        return PathChoice(
            PathClass.RDMA_HOST_STAGED,
            staged,
            EFFICIENCY[PathClass.RDMA_HOST_STAGED],
            f"{basis}, staged through host memory",
            level,
            names,
            gdr,
            (*assumed, *more),
        )
    return PathChoice(path, total, EFFICIENCY[path], basis, level, names, gdr, tuple(assumed))


def _tcp(inv: Inventory) -> PathChoice:
    speeds = inv.netdev_speeds_mbps
    if speeds:
        iface, mbps = max(speeds.items(), key=lambda kv: kv[1])
        basis = f"{iface}: {mbps / 1000:g} Gb/s Ethernet"
        assumed: tuple[str, ...] = ()
    else:
        mbps = int(ASSUMED_TCP_GBIT * 1000)
        basis = f"{ASSUMED_TCP_GBIT:g} GbE (assumed)"
        assumed = ("no netdev speed found: assumed 10 GbE",)
    return PathChoice(
        PathClass.TCP, mbps / 8 * 1e6, EFFICIENCY[PathClass.TCP], basis, assumed=assumed
    )
