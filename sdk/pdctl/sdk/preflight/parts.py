"""GPU parts → PCIe generation/width and per-link NVLink or xGMI rate (pure lookup).

Looked up by the product name NVML or ``nvidia-smi -q`` reports (``NVIDIA H100 80GB
HBM3``, ``NVIDIA GeForce RTX 5090``, ``AMD Instinct MI300X``). A name the table does not
know gives None: the report then says "unknown" instead of assuming a generation. Rates
are per direction; vendors quote bidirectional totals, halved here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Part:
    family: str
    pattern: re.Pattern[str]
    pcie_gen: int | None
    """The GPU's PCIe link generation as hosts of its platform run it (None: no PCIe host
    link, e.g. GB200's NVLink-C2C to Grace)."""
    pcie_width: int
    link_bps: float | None
    """Per NVLink / xGMI link, per direction (None: the part has none)."""
    link_kind: str
    source: str


def _p(
    family: str, rx: str, gen: int | None, width: int, link: float | None, kind: str, source: str
) -> Part:
    return Part(family, re.compile(rx, re.IGNORECASE), gen, width, link, kind, source)


_NV4 = "NVIDIA H100/H200 datasheets: NVLink 4, 18 links, 900 GB/s bidirectional; PCIe Gen5 x16"
PARTS: tuple[Part, ...] = (
    _p(
        "GB200/GB300",
        r"\bGB[23]00\b",
        None,
        16,
        50 * GB,
        "NVLink 5",
        "NVIDIA GB200 NVL72 datasheet: NVLink 5, 1.8 TB/s bidirectional per GPU (18 links); "
        "the CPU link is NVLink-C2C, not PCIe",
    ),
    _p(
        "B200/B300",
        r"\bB[123]00\b",
        5,
        16,
        50 * GB,
        "NVLink 5",
        "NVIDIA DGX/HGX B200 datasheets: NVLink 5, 1.8 TB/s bidirectional (18 links); hosts "
        "run the GPU link at PCIe Gen5 x16",
    ),
    _p(
        "H800",
        r"\bH800\b",
        5,
        16,
        25 * GB,
        "NVLink 4",
        "NVIDIA H800: NVLink 4, 8 links, 400 GB/s bidirectional; PCIe Gen5 x16",
    ),
    _p("H100/H200/H20", r"\b(GH200|H100|H200|H20)\b", 5, 16, 25 * GB, "NVLink 4", _NV4),
    _p(
        "A800",
        r"\bA800\b",
        4,
        16,
        25 * GB,
        "NVLink 3",
        "NVIDIA A800: NVLink 3, 8 links, 400 GB/s bidirectional; PCIe Gen4 x16",
    ),
    _p(
        "A100",
        r"\bA100\b",
        4,
        16,
        25 * GB,
        "NVLink 3",
        "NVIDIA A100 datasheet: NVLink 3, 12 links, 600 GB/s bidirectional; PCIe Gen4 x16",
    ),
    _p(
        "RTX 3090 / A6000 / A40 / A5000 (NVLink bridge)",
        r"RTX 3090|RTX A6000|\bA40\b|RTX A5000",
        4,
        16,
        14.0625 * GB,
        "NVLink 3 bridge",
        "NVIDIA RTX A6000/A40/RTX 3090 specifications: NVLink bridge 112.5 GB/s "
        "bidirectional over 4 links; PCIe Gen4 x16",
    ),
    _p(
        "V100",
        r"\bV100\b",
        3,
        16,
        25 * GB,
        "NVLink 2",
        "NVIDIA V100 datasheet: NVLink 2, 6 links, 300 GB/s bidirectional; PCIe Gen3 x16",
    ),
    _p(
        "RTX 5060 Ti / 5060",
        r"RTX 50[56]0",
        5,
        8,
        None,
        "",
        "NVIDIA GeForce RTX 5060 Ti/5060 specifications: PCIe Gen5 x8, no NVLink",
    ),
    _p(
        "RTX 50-series",
        r"RTX 50[789]0|RTX PRO [4-6]000 Blackwell",
        5,
        16,
        None,
        "",
        "NVIDIA GeForce RTX 5090/5080/5070 and RTX PRO Blackwell specifications: PCIe Gen5 "
        "x16, no NVLink",
    ),
    _p(
        "Ada / Ampere PCIe (L40S, L40, L4, RTX 40-series, A10)",
        r"\bL40S?\b|\bL4\b|RTX 40[6789]0|RTX [456]000 Ada|\bA10G?\b|\bA30\b",
        4,
        16,
        None,
        "",
        "NVIDIA L40S/L40/L4/A10/RTX 40-series specifications: PCIe Gen4 x16, no NVLink",
    ),
    _p(
        "MI300X/MI325X",
        r"MI3[02][05]X",
        5,
        16,
        64 * GB,
        "xGMI",
        "AMD Instinct MI300X/MI325X datasheets: 7 Infinity Fabric (xGMI) links at 128 GB/s "
        "bidirectional each (one per peer on 8-GPU platforms); PCIe Gen5 x16",
    ),
)


def lookup(name: str | None) -> Part | None:
    if not name:
        return None
    return next((p for p in PARTS if p.pattern.search(name)), None)
