"""Plain data the preflight works on: what one host holds, as far as it could be seen.

Every field that a source could not tell is ``None`` ("unknown"), never a guess. The
parsers in this package build these objects from text; :mod:`.inventory` fills them
from the live machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SourceState = Literal["ok", "absent", "error", "skipped"]
P2P_LETTERS = ("OK", "CNS", "GNS", "TNS", "DR", "NS", "U")
"""``nvidia-smi topo -p2p`` letters (NVML results 0..6 in this order, except DR=4/NS=5)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    """nvidia-smi / NVML index (PCI bus order), not necessarily the CUDA index."""
    name: str | None = None
    bus_id: str | None = None
    numa: int | None = None
    cpu_affinity: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


@dataclass(frozen=True)
class NicInfo:
    name: str
    """RDMA device name (``mlx5_0``, ``rdmap16s27``) or ``NICn`` when no legend named it."""
    label: str | None = None
    """The ``NICn`` column of ``nvidia-smi topo -m`` that shows this device, if any."""
    driver: str | None = None
    vendor: str | None = None
    state: str | None = None
    phys_state: str | None = None
    link_layer: str | None = None
    rate_gbps: float | None = None
    """Link rate in gigabits per second (sysfs ``rate``)."""
    numa: int | None = None
    gdr: bool | None = None
    """EFA only: ``/sys/class/infiniband/<dev>/device/gdr`` (the PCI device's file)."""
    netdevs: tuple[str, ...] = ()
    bus_id: str | None = None

    @property
    def kind(self) -> Literal["efa", "ib", "roce", "unknown"]:
        if (
            self.driver == "efa"
            or self.vendor == "0x1d0f"
            or self.name.startswith(("efa", "rdmap"))
        ):
            return "efa"
        if self.link_layer == "InfiniBand":
            return "ib"
        if self.link_layer == "Ethernet":
            return "roce"
        return "unknown"

    @property
    def active(self) -> bool | None:
        if self.state is None:
            return None
        return "ACTIVE" in self.state.upper()


@dataclass
class Topology:
    """What ``nvidia-smi topo -m`` (plus optional ``-p2p`` sections) or NVML says."""

    source: str
    gpus: list[GpuInfo] = field(default_factory=list)
    nic_labels: list[str] = field(default_factory=list)
    """NIC columns in order (``NIC0``… or, on older drivers, device names)."""
    nic_names: dict[str, str] = field(default_factory=dict)
    """``NICn`` → device name from the ``NIC Legend:`` block."""
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    """GPU i ↔ GPU j (i < j) cell: ``NV18``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``…"""
    gpu_nic: dict[tuple[int, str], str] = field(default_factory=dict)
    """(GPU index, NIC label) → cell."""
    p2p: dict[str, dict[tuple[int, int], str]] = field(default_factory=dict)
    """Capability (``r`` ``w`` ``n`` ``a`` ``p``, or ``?`` when the file did not say) →
    (i, j) → letter (``OK``, ``CNS``, ``GNS``, ``TNS``, ``DR``, ``NS``, ``U``)."""
    nvswitch: bool | None = None
    notes: list[str] = field(default_factory=list)

    def link(self, a: int, b: int) -> str | None:
        if a == b:
            return "X"
        return self.links.get((min(a, b), max(a, b)))

    def nvlink_count(self, a: int, b: int) -> int | None:
        """Bonded NVLinks between two GPUs (0 when the cell is a PCIe path)."""
        cell = self.link(a, b)
        if cell is None or cell == "X":
            return None
        if cell.startswith("NV") and cell[2:].isdecimal():
            return int(cell[2:])
        return 0

    def nic_name(self, label: str) -> str:
        return self.nic_names.get(label, label)

    def gpu(self, index: int) -> GpuInfo | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None


@dataclass(frozen=True)
class GdrStatus:
    """GPUDirect RDMA: the peer-memory module or nv_mem registration NCCL/UCX look for."""

    present: bool | None
    evidence: str
    gdrcopy: bool | None = None


@dataclass(frozen=True)
class ToolsInfo:
    nixl_installed: bool | None = None
    nixl_version: str | None = None
    nixl_backends: tuple[str, ...] | None = None
    ucx_transports: tuple[str, ...] | None = None
    fi_providers: tuple[str, ...] | None = None
    efa_domains: int | None = None


@dataclass(frozen=True)
class SourceCheck:
    """One place the inventory looked, and what it found there."""

    name: str
    state: SourceState
    detail: str


@dataclass
class Inventory:
    """One host as the preflight saw it (other hosts of the fleet are assumed to match)."""

    topology: Topology | None
    nics: list[NicInfo] = field(default_factory=list)
    gdr: GdrStatus = field(default_factory=lambda: GdrStatus(None, "not checked"))
    netdev_speeds_mbps: dict[str, int] = field(default_factory=dict)
    tools: ToolsInfo = field(default_factory=ToolsInfo)
    checks: list[SourceCheck] = field(default_factory=list)
    host: str = "this host"
    """The host's name as collected (``hostname``), or ``this host``."""
    addresses: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    """``UCX_*``/``NIXL_*``/``FI_*``/``NCCL_*`` variables where it was collected."""

    @property
    def gpus(self) -> list[GpuInfo]:
        return self.topology.gpus if self.topology is not None else []

    def nic(self, label_or_name: str) -> NicInfo | None:
        name = self.topology.nic_name(label_or_name) if self.topology else label_or_name
        for n in self.nics:
            if n.name in (name, label_or_name) or n.label == label_or_name:
                return n
        return None


@dataclass(frozen=True)
class PlannedPair:
    name: str
    prefill_host: str
    decode_host: str
    prefill_gpus: tuple[int, ...]
    decode_gpus: tuple[int, ...]
    tp: int
    same_host: bool
