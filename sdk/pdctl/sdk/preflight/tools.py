"""``fi_info``, ``ucx_info -d``, ``ibv_devinfo``, ``lsmod`` and NIXL: parsers plus thin runners.

Parsers are pure and total. Runners call a tool only when it is on ``PATH``, with a short
timeout, and return ``None`` when it is absent, fails or hangs. NIXL is located with
``importlib.util.find_spec`` and its plugin files, never imported (importing it loads
CUDA libraries and takes seconds).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdctl.sdk.preflight.model import GdrStatus, GpuInfo, NicInfo

TOOL_TIMEOUT_S = 3.0
_KV = re.compile(r"^\s*([A-Za-z_]+):\s*(.*?)\s*$")
_UCX_TRANSPORT = re.compile(r"^#\s*Transport:\s*(\S+)")
_UCX_DEVICE = re.compile(r"^#\s*Device:\s*(\S+)")
_PLUGIN = re.compile(r"^libplugin_([A-Za-z0-9_]+)\.so")
_WIDTH = re.compile(r"^\s*(\d{1,2})X\b")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gbps")
_EFA_DOMAIN = re.compile(r"^(.*?)(?:-(?:rdm|dgrm|direct))?$")
_SMI_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_SMI_KV = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9 /()._-]*?)\s*:\s*(.*?)\s*$")


@dataclass(frozen=True)
class FiEntry:
    provider: str
    fabric: str = ""
    domain: str = ""
    version: str = ""
    type: str = ""
    protocol: str = ""


def parse_fi_info(text: str) -> list[FiEntry]:
    """``fi_info`` blocks (each starts at ``provider:``) → entries."""
    out: list[FiEntry] = []
    cur: dict[str, str] | None = None
    for line in text.splitlines():
        m = _KV.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if key == "provider":
            if cur is not None:
                out.append(FiEntry(**cur))
            cur = {"provider": value}
        elif cur is not None and key in ("fabric", "domain", "version", "type", "protocol"):
            cur[key] = value
    if cur is not None:
        out.append(FiEntry(**cur))
    return out


def parse_ucx_transports(text: str) -> list[tuple[str, str]]:
    """``ucx_info -d`` → (transport, device) pairs, e.g. ``("rc_mlx5", "mlx5_0:1")``.

    Its bandwidth figures are estimates, so only presence is kept.
    """
    out: list[tuple[str, str]] = []
    pending: str | None = None
    for line in text.splitlines():
        t = _UCX_TRANSPORT.match(line)
        if t:
            if pending is not None:
                out.append((pending, ""))
            pending = t.group(1)
            continue
        d = _UCX_DEVICE.match(line)
        if d and pending is not None:
            out.append((pending, d.group(1)))
            pending = None
    if pending is not None:
        out.append((pending, ""))
    return out


@dataclass(frozen=True)
class IbvPort:
    port: int
    state: str = ""
    link_layer: str = ""
    fields: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str:
        return dict(self.fields).get(key, "")

    @property
    def rate_gbps(self) -> float | None:
        """``active_width: 4X (2)`` x ``active_speed: 100.0 Gbps (128)`` → 400.0."""
        w = _WIDTH.match(self.get("active_width"))
        v = _SPEED.match(self.get("active_speed"))
        return int(w.group(1)) * float(v.group(1)) if w and v else None


@dataclass
class IbvDevice:
    hca_id: str
    fields: dict[str, str] = field(default_factory=dict)
    ports: list[IbvPort] = field(default_factory=list)

    @property
    def vendor_id(self) -> str | None:
        return self.fields.get("vendor_id")


def parse_ibv_devinfo(text: str) -> list[IbvDevice]:
    """``ibv_devinfo`` → devices with their ports (state, link layer)."""
    devices: list[IbvDevice] = []
    port: dict[str, str] | None = None

    def close_port() -> None:
        nonlocal port
        if port is not None and devices and port.get("port", "").isdecimal():
            devices[-1].ports.append(
                IbvPort(
                    int(port["port"]),
                    port.get("state", ""),
                    port.get("link_layer", ""),
                    tuple((k, v) for k, v in port.items() if k != "port"),
                )
            )
        port = None

    for line in text.splitlines():
        m = _KV.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if key == "hca_id":
            close_port()
            devices.append(IbvDevice(hca_id=value))
        elif not devices:
            continue
        elif key == "port":
            close_port()
            port = {"port": value}
        elif port is not None:
            port[key] = value
        else:
            devices[-1].fields[key] = value
    close_port()
    return devices


def nics_from_ibv(devices: Sequence[IbvDevice]) -> list[NicInfo]:
    """``ibv_devinfo`` devices as NICs (first active port), for hosts recorded without sysfs."""
    out: list[NicInfo] = []
    for d in devices:
        ports = [p for p in d.ports if "ACTIVE" in p.state.upper()] or d.ports
        p = ports[0] if ports else None
        transport = d.fields.get("transport", "")
        efa = d.vendor_id == "0x1d0f" or transport.upper().startswith("EFA")
        out.append(
            NicInfo(
                name=d.hca_id,
                driver="efa" if efa else None,
                vendor=d.vendor_id,
                state=p.state if p else None,
                phys_state=p.get("phys_state") or None if p else None,
                link_layer=p.link_layer or None if p else None,
                rate_gbps=p.rate_gbps if p else None,
            )
        )
    return out


def efa_devices(entries: Sequence[FiEntry]) -> list[str]:
    """EFA device names from ``fi_info`` domains: ``efa_0-rdm``, ``rdmap16s27-dgrm`` → device."""
    names: list[str] = []
    for e in entries:
        if not e.provider.split(";")[0].startswith("efa") or not e.domain:
            continue
        m = _EFA_DOMAIN.match(e.domain)
        name = m.group(1) if m else e.domain
        if name not in names:
            names.append(name)
    return names


@dataclass
class SmiGpu:
    bus_id: str
    name: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


@dataclass
class SmiQuery:
    driver: str | None = None
    cuda: str | None = None
    gpus: list[SmiGpu] = field(default_factory=list)

    def gpu_infos(self) -> list[GpuInfo]:
        """In ``nvidia-smi -q`` order, which is nvidia-smi's index order."""
        return [
            GpuInfo(
                index=i,
                name=g.name,
                bus_id=g.bus_id.lower()[-12:],
                pcie_gen=g.pcie_gen,
                pcie_width=g.pcie_width,
            )
            for i, g in enumerate(self.gpus)
        ]


def parse_nvidia_smi_q(text: str) -> SmiQuery:
    """``nvidia-smi -q``: driver/CUDA versions and per GPU its name and max PCIe gen/width.

    The effective maximum link is the smallest of ``Max``, ``Device Max`` and ``Host Max``
    under ``PCIe Generation`` (drivers differ in which they print); width ``16x`` → 16.
    """
    q = SmiQuery()
    gpu: SmiGpu | None = None
    section: list[tuple[int, str]] = []
    for line in text.splitlines():
        g = _SMI_GPU.match(line.strip())
        if g:
            gpu = SmiGpu(g.group(1))
            q.gpus.append(gpu)
            section = []
            continue
        m = _SMI_KV.match(line)
        if not m:
            head = line.strip()
            if head and gpu is not None:
                depth = len(line) - len(line.lstrip())
                section = [(d, n) for d, n in section if d < depth] + [(depth, head)]
            continue
        key, value = m.group(2), m.group(3)
        if gpu is None:
            if key == "Driver Version":
                q.driver = value
            elif key == "CUDA Version":
                q.cuda = value
            continue
        where = section[-1][1] if section else ""
        if key == "Product Name":
            gpu.name = value
        elif where == "PCIe Generation" and key in ("Max", "Device Max", "Host Max"):
            if value.isdecimal():
                gen = int(value)
                gpu.pcie_gen = gen if gpu.pcie_gen is None else min(gpu.pcie_gen, gen)
        elif where == "Link Width" and key in ("Max", "Device Max", "Host Max"):
            width = value.rstrip("xX")
            if width.isdecimal():
                w = int(width)
                gpu.pcie_width = w if gpu.pcie_width is None else min(gpu.pcie_width, w)
    return q


def parse_lsmod(text: str) -> dict[str, tuple[str, ...]]:
    """``lsmod`` → module name → modules using it."""
    out: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[1].isdecimal() or not parts[2].isdecimal():
            continue
        used = tuple(u for u in parts[3].split(",") if u) if len(parts) > 3 else ()
        out[parts[0]] = used
    return out


def gdr_from_lsmod(modules: dict[str, tuple[str, ...]]) -> GdrStatus:
    """GPUDirect RDMA as ``lsmod`` shows it (``gdrdrv`` may appear only as a user)."""
    users = {u for used in modules.values() for u in used}
    gdrcopy = "gdrdrv" in modules or "gdrdrv" in users
    for name in ("nvidia_peermem", "nv_peer_mem"):
        if name in modules:
            return GdrStatus(True, f"lsmod lists {name}", gdrcopy)
    if "nvidia" in modules:
        return GdrStatus(False, "lsmod lists nvidia but no nvidia_peermem/nv_peer_mem", gdrcopy)
    return GdrStatus(None, "lsmod lists no NVIDIA module", gdrcopy or None)


def backends_from_plugins(names: Sequence[str]) -> tuple[str, ...]:
    """NIXL plugin file names (``libplugin_UCX.so``) → backend names, sorted, unique."""
    return tuple(sorted({m.group(1) for n in names if (m := _PLUGIN.match(n))}))


def run_tool(argv: Sequence[str], timeout: float = TOOL_TIMEOUT_S) -> str | None:
    """stdout of a tool on PATH, or None when absent, failing or too slow."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


@dataclass(frozen=True)
class NixlInfo:
    installed: bool
    version: str | None
    backends: tuple[str, ...] | None
    """Backends whose plugin files were found; None when the plugin folder was not."""


def nixl_info() -> NixlInfo:
    """Is NIXL importable, which version, which backend plugins ship with it."""
    try:
        spec = importlib.util.find_spec("nixl")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return NixlInfo(False, None, None)
    version: str | None
    try:
        version = importlib.metadata.version("nixl")
    except importlib.metadata.PackageNotFoundError:
        version = None
    dirs: list[Path] = []
    if os.environ.get("NIXL_PLUGIN_DIR"):
        dirs.append(Path(os.environ["NIXL_PLUGIN_DIR"]))
    for loc in spec.submodule_search_locations or ():
        site = Path(loc).parent
        dirs.extend(sorted(site.glob(".nixl*.libs/plugins")))
    names: list[str] = []
    for d in dirs:
        try:
            names.extend(os.listdir(d))
        except OSError:
            continue
    return NixlInfo(True, version, backends_from_plugins(names) if dirs else None)
