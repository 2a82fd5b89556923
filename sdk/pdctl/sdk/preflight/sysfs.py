"""RDMA NICs, GPUDirect RDMA and netdev speeds from a sysfs tree (live ``/sys`` or recorded).

``root`` plays the part of ``/sys``: ``root/class/infiniband/<dev>/…``,
``root/module/nvidia_peermem``, ``root/class/net/<if>/speed``. Missing or unreadable
files give ``None`` ("unknown"); nothing here raises for odd content.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pdctl.sdk.preflight.model import GdrStatus, NicInfo

LIVE_SYSFS = Path("/sys")
GDR_MARKERS = (
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
    "module/nvidia_peermem/version",
    "module/nv_peer_mem/version",
)
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
VENDORS = {"0x15b3": "Mellanox/NVIDIA", "0x1d0f": "Amazon", "0x02c9": "Mellanox"}


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
    return int(t) if t.isdigit() and len(t) < 6 else None


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


def read_rdma_nics(root: Path = LIVE_SYSFS) -> list[NicInfo]:
    """Every ``/sys/class/infiniband`` device with its first active port (else its first)."""
    base = root / "class" / "infiniband"
    out: list[NicInfo] = []
    for dev in _listdir(base):
        d = base / dev
        device = d / "device"
        port = _pick_port(d / "ports")
        bus = _link_name(device)
        out.append(
            NicInfo(
                name=dev,
                driver=_link_name(device / "driver"),
                vendor=read_text(device / "vendor"),
                state=read_text(port / "state") if port else None,
                phys_state=read_text(port / "phys_state") if port else None,
                link_layer=read_text(port / "link_layer") if port else None,
                rate_gbps=parse_rate_gbps(read_text(port / "rate")) if port else None,
                numa=parse_numa(read_text(device / "numa_node")),
                gdr=_flag(read_text(d / "gdr")),
                netdevs=tuple(_listdir(device / "net")),
                bus_id=bus if bus and _BDF.match(bus) else None,
            )
        )
    return out


def _pick_port(ports: Path) -> Path | None:
    names = _listdir(ports)
    for p in names:
        state = read_text(ports / p / "state") or ""
        if "ACTIVE" in state.upper():
            return ports / p
    return ports / names[0] if names else None


def _flag(text: str | None) -> bool | None:
    if text in ("1", "0"):
        return text == "1"
    return None


def gdr_status(root: Path = LIVE_SYSFS) -> GdrStatus:
    """GPUDirect RDMA as NCCL/UCX detect it: a peer-memory module or nv_mem registration."""
    for marker in GDR_MARKERS:
        if (root / marker).exists():
            return GdrStatus(True, f"{marker} present", _gdrcopy(root))
    if (root / "module" / "nvidia").exists():
        return GdrStatus(
            False,
            "NVIDIA driver loaded but no nvidia_peermem/nv_peer_mem/nv_mem "
            "(DMA-BUF may still work with a recent kernel and driver)",
            _gdrcopy(root),
        )
    return GdrStatus(None, "no NVIDIA driver module under module/: cannot tell", None)


def _gdrcopy(root: Path) -> bool | None:
    if (root / "module" / "gdrdrv").exists():
        return True
    if root == LIVE_SYSFS:
        return Path("/dev/gdrdrv").exists()
    return None


def netdev_speeds(root: Path = LIVE_SYSFS) -> dict[str, int]:
    """Interface → link speed in Mb/s (down or virtual interfaces, which report -1, skipped)."""
    base = root / "class" / "net"
    out: dict[str, int] = {}
    for iface in _listdir(base):
        if iface == "lo":
            continue
        text = read_text(base / iface / "speed", limit=32)
        if text and text.isdigit() and 0 < int(text) < 10_000_000:
            out[iface] = int(text)
    return out


def pci_numa(root: Path, bus_id: str) -> int | None:
    """``/sys/bus/pci/devices/<bdf>/numa_node`` for a GPU bus id (NVML's 8-digit domain ok)."""
    bdf = bus_id.lower()
    if len(bdf.split(":")[0]) == 8:
        bdf = bdf[4:]
    return parse_numa(read_text(root / "bus" / "pci" / "devices" / bdf / "numa_node"))
