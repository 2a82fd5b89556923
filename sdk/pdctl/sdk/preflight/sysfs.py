"""RDMA NICs, GPUDirect RDMA, netdev speeds, GPU NUMA nodes from a sysfs tree, via text.

A tree (live ``/sys`` or a recorded copy, ``root`` playing ``/sys``) is first dumped to
text by :func:`dump_sysfs` — only the files the preflight reads — and every fact is
then parsed from that text (:func:`parse_sysfs`), so a live run and an evidence bundle
share one code path. Dump lines: ``path = first line of the file``, ``path -> basename
of the link target``, ``path/`` for a directory. Missing or unreadable files give
``None`` ("unknown"); nothing here raises for odd content.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pdctl.sdk.preflight.model import GdrStatus, NicInfo

LIVE_SYSFS = Path("/sys")
GDR_MARKERS = (
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
    "module/nvidia_peermem/version",
    "module/nv_peer_mem/version",
)
_MODULES = ("nvidia", "gdrdrv", "efa", "ib_core", "mlx5_core", "amdgpu")
_PORT_FILES = ("state", "phys_state", "link_layer", "rate")
_GPU_VENDORS = ("0x10de", "0x1002")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_LINE = re.compile(r"^(\S+?)(?:\s+(=|->)\s?(.*))?$")
VENDORS = {"0x15b3": "Mellanox/NVIDIA", "0x1d0f": "Amazon", "0x02c9": "Mellanox"}
EFA_GDR = "device/gdr"
"""EFA's GPUDirect flag, relative to ``class/infiniband/<dev>``: amzn-drivers' ``efa_sysfs.c``
creates ``gdr`` on the PCI device (``device_create_file(&pdev->dev, ...)``), not on the
ib device, so it is reached through the ``device`` link."""
GDRDRV_DEV = "dev/gdrdrv"
"""Pseudo path in a dump: the live ``/dev/gdrdrv`` (gdrcopy) exists."""


def read_text(path: Path, limit: int = 4096) -> str | None:
    """First ``limit`` characters of a small file, stripped; None when it cannot be read."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return f.read(limit).strip()
    except (OSError, ValueError):
        return None


def parse_rate_gbps(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` → 400.0."""
    if not text:
        return None
    m = _RATE.match(text)
    return float(m.group(1)) if m else None


def parse_numa(text: str | None) -> int | None:
    """sysfs ``numa_node``: ``-1`` (no affinity) and junk are unknown."""
    if text is None:
        return None
    t = text.strip()
    return int(t) if t.isdecimal() and len(t) < 6 else None


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _link_name(path: Path) -> str | None:
    try:
        if not path.exists():
            return None
        return os.path.basename(os.path.realpath(path))
    except (OSError, ValueError):
        return None


class _Dump:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.lines: list[str] = []

    def file(self, rel: str) -> None:
        text = read_text(self.root / rel, limit=256)
        if text is not None:
            first = text.splitlines()[0] if text else ""
            self.lines.append(f"{rel} = {first}")

    def link(self, rel: str) -> None:
        name = _link_name(self.root / rel)
        if name is not None:
            self.lines.append(f"{rel} -> {name}")

    def listing(self, rel: str) -> list[str]:
        names = _listdir(self.root / rel)
        self.lines.extend(f"{rel}/{n}/" for n in names)
        return names


def dump_sysfs(root: Path = LIVE_SYSFS) -> str:
    """The files of ``root`` the preflight reads, as text (see the module docstring)."""
    d = _Dump(root)
    for dev in d.listing("class/infiniband"):
        base = f"class/infiniband/{dev}"
        d.link(f"{base}/device")
        d.link(f"{base}/device/driver")
        d.file(f"{base}/device/vendor")
        d.file(f"{base}/device/numa_node")
        d.file(f"{base}/{EFA_GDR}")
        d.listing(f"{base}/device/net")
        for port in d.listing(f"{base}/ports"):
            for name in _PORT_FILES:
                d.file(f"{base}/ports/{port}/{name}")
    for marker in GDR_MARKERS:
        d.file(marker)
    for module in _MODULES:
        if (root / "module" / module).exists():
            d.lines.append(f"module/{module}/")
    for iface in d.listing("class/net"):
        d.file(f"class/net/{iface}/speed")
    for bdf in _listdir(root / "bus" / "pci" / "devices"):
        base = f"bus/pci/devices/{bdf}"
        vendor = read_text(root / base / "vendor", limit=16)
        cls = read_text(root / base / "class", limit=16) or ""
        if vendor in _GPU_VENDORS and cls.startswith(("0x03", "0x12")):
            for name in ("vendor", "class", "numa_node", "current_link_speed"):
                d.file(f"{base}/{name}")
            d.file(f"{base}/current_link_width")
    for node in _listdir(root / "devices" / "system" / "node"):
        if node.startswith("node") and node[4:].isdecimal():
            d.lines.append(f"devices/system/node/{node}/")
            d.file(f"devices/system/node/{node}/cpulist")
    if root == LIVE_SYSFS and Path("/dev/gdrdrv").exists():
        d.lines.append(f"{GDRDRV_DEV}/")
    return "\n".join(d.lines) + "\n"


@dataclass
class Sysfs:
    """A parsed dump: answers the questions a sysfs tree would."""

    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    def read(self, rel: str) -> str | None:
        return self.files.get(rel)

    def link(self, rel: str) -> str | None:
        return self.links.get(rel)

    def listdir(self, rel: str) -> list[str]:
        prefix = rel.rstrip("/") + "/"
        return sorted(
            {
                d[len(prefix) :]
                for d in self.dirs
                if d.startswith(prefix) and "/" not in d[len(prefix) :]
            }
        )

    def exists(self, rel: str) -> bool:
        return rel in self.files or rel in self.links or rel in self.dirs

    @property
    def empty(self) -> bool:
        return not (self.files or self.links or self.dirs)


def parse_sysfs(text: str) -> Sysfs:
    s = Sysfs()
    for raw in text.splitlines():
        m = _LINE.match(raw.strip())
        if m is None or raw.lstrip().startswith("#"):
            continue
        path, op, value = m.group(1), m.group(2), m.group(3) or ""
        if op == "=":
            s.files[path] = value.strip()
        elif op == "->":
            s.links[path] = value.strip()
        elif path.endswith("/"):
            s.dirs.add(path.rstrip("/"))
        else:
            continue
        parts = path.rstrip("/").split("/")
        for i in range(1, len(parts)):
            s.dirs.add("/".join(parts[:i]))
    return s


def _view(src: Path | Sysfs) -> Sysfs:
    return src if isinstance(src, Sysfs) else parse_sysfs(dump_sysfs(src))


def read_rdma_nics(src: Path | Sysfs = LIVE_SYSFS) -> list[NicInfo]:
    """Every ``class/infiniband`` device with its first active port (else its first)."""
    fs = _view(src)
    out: list[NicInfo] = []
    for dev in fs.listdir("class/infiniband"):
        base = f"class/infiniband/{dev}"
        port = _pick_port(fs, f"{base}/ports")
        bus = fs.link(f"{base}/device")

        def p(name: str, port: str | None = port) -> str | None:
            return fs.read(f"{port}/{name}") if port else None

        out.append(
            NicInfo(
                name=dev,
                driver=fs.link(f"{base}/device/driver"),
                vendor=fs.read(f"{base}/device/vendor"),
                state=p("state"),
                phys_state=p("phys_state"),
                link_layer=p("link_layer"),
                rate_gbps=parse_rate_gbps(p("rate")),
                numa=parse_numa(fs.read(f"{base}/device/numa_node")),
                gdr=_flag(fs.read(f"{base}/{EFA_GDR}")),
                netdevs=tuple(fs.listdir(f"{base}/device/net")),
                bus_id=bus if bus and _BDF.match(bus) else None,
            )
        )
    return out


def _pick_port(fs: Sysfs, ports: str) -> str | None:
    names = fs.listdir(ports)
    for p in names:
        if "ACTIVE" in (fs.read(f"{ports}/{p}/state") or "").upper():
            return f"{ports}/{p}"
    return f"{ports}/{names[0]}" if names else None


def _flag(text: str | None) -> bool | None:
    if text in ("1", "0"):
        return text == "1"
    return None


def gdr_status(src: Path | Sysfs = LIVE_SYSFS) -> GdrStatus:
    """GPUDirect RDMA as NCCL/UCX detect it: a peer-memory module or nv_mem registration."""
    fs = _view(src)
    gdrcopy = True if fs.exists("module/gdrdrv") or fs.exists(GDRDRV_DEV) else None
    for marker in GDR_MARKERS:
        if fs.exists(marker):
            return GdrStatus(True, f"{marker} present", gdrcopy)
    if fs.exists("module/nvidia"):
        return GdrStatus(
            False,
            "NVIDIA driver loaded but no nvidia_peermem/nv_peer_mem/nv_mem "
            "(DMA-BUF may still work with a recent kernel and driver)",
            gdrcopy,
        )
    return GdrStatus(None, "no NVIDIA driver module under module/: cannot tell", None)


def netdev_speeds(src: Path | Sysfs = LIVE_SYSFS) -> dict[str, int]:
    """Interface → link speed in Mb/s (down or virtual interfaces, which report -1, skipped)."""
    fs = _view(src)
    out: dict[str, int] = {}
    for iface in fs.listdir("class/net"):
        text = fs.read(f"class/net/{iface}/speed")
        if iface != "lo" and text and text.isdecimal() and 0 < int(text) < 10_000_000:
            out[iface] = int(text)
    return out


def numa_nodes(src: Path | Sysfs = LIVE_SYSFS) -> dict[int, str]:
    """NUMA node → its CPU list."""
    fs = _view(src)
    out: dict[int, str] = {}
    for node in fs.listdir("devices/system/node"):
        if node.startswith("node") and node[4:].isdecimal():
            out[int(node[4:])] = fs.read(f"devices/system/node/{node}/cpulist") or ""
    return out


def pci_numa(src: Path | Sysfs, bus_id: str) -> int | None:
    """``bus/pci/devices/<bdf>/numa_node`` for a GPU bus id (NVML's 8-digit domain ok)."""
    bdf = bus_id.lower()
    if len(bdf.split(":")[0]) == 8:
        bdf = bdf[4:]
    if isinstance(src, Sysfs):
        return parse_numa(src.read(f"bus/pci/devices/{bdf}/numa_node"))
    return parse_numa(read_text(src / "bus" / "pci" / "devices" / bdf / "numa_node"))
