"""``nvidia-smi topo -m`` / ``topo -p2p`` (and ``rocm-smi --showtopo``) text → :class:`Topology`.

Pure and total: any text gives a Topology (possibly empty, with notes), never an
exception. Copies of the output often lose their tabs, so rows are split on any
whitespace; empty cells (the tab-separated form's blank ``GPU NUMA ID`` gap) vanish.
"""

from __future__ import annotations

import re

from pdctl.sdk.preflight.model import P2P_LETTERS, GpuInfo, Topology

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU = re.compile(r"^GPU(\d{1,4})$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d{1,4})\s*:\s*(\S+)\s*$")
_P2P_MODE = re.compile(r"-p2p\s+([rwnap])\b")
_TOPO_CELL = re.compile(r"^(X|NV\d{1,3}|PIX|PXB|PHB|NODE|SYS|SOC)$")
_CPU_LIST = re.compile(r"^(N/A|[\d,\-]+)$")
_ROCM_NUMA = re.compile(r"GPU\[(\d{1,4})\].*Numa Node:\s*(\d{1,4})")
_P2P_CELLS = frozenset((*P2P_LETTERS, "X"))
_PEER_ACCESS = re.compile(
    r"Peer access from .*\(GPU(\d{1,4})\)\s*->.*\(GPU(\d{1,4})\)\s*:\s*(Yes|No)"
)


def parse_topo(text: str, source: str = "nvidia-smi topo -m") -> Topology:
    """Parse a saved ``nvidia-smi topo -m`` output, optionally followed by ``-p2p`` matrices.

    A ``-p2p`` matrix takes its capability from the nearest preceding line that contains
    ``-p2p <r|w|n|a|p>`` (the command line, or a ``# -p2p r`` comment); without one it is
    stored under ``?``. CUDA ``simpleP2P`` "Peer access from … (GPUa) -> … (GPUb) : Yes"
    lines are stored under ``cuda``.
    """
    if "ROCm System Management Interface" in text:
        return parse_rocm_showtopo(text, source="rocm-smi --showtopo")
    topo = Topology(source=source)
    numa: dict[int, int | None] = {}
    cpus: dict[int, str | None] = {}
    header_gpus: list[int] = []
    cols: list[str] = []
    kind = ""
    mode = "?"
    seen_topo = False
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        m = _P2P_MODE.search(line)
        if m:
            mode = m.group(1)
            kind = ""
            continue
        peer = _PEER_ACCESS.search(line)
        if peer:
            a, b = int(peer.group(1)), int(peer.group(2))
            if a != b:
                topo.p2p.setdefault("cuda", {})[(a, b)] = "OK" if peer.group(3) == "Yes" else "NS"
            continue
        legend = _NIC_LEGEND.match(line)
        if legend:
            topo.nic_names[legend.group(1)] = legend.group(2)
            continue
        tokens = line.split()
        if not tokens:
            kind = ""
            continue
        if _is_header(tokens):
            cols = _header_columns(tokens)
            if "CPU" in tokens:
                if seen_topo:
                    topo.notes.append("a second topo -m matrix was ignored")
                    kind = ""
                    continue
                seen_topo = True
                kind = "topo"
                header_gpus = [int(g.group(1)) for c in cols if (g := _GPU.match(c))]
                topo.nic_labels = [c for c in cols if not _GPU.match(c)]
            else:
                kind = "p2p"
            continue
        if not kind or tokens[0] not in cols:
            kind = "" if tokens[0].endswith(":") else kind
            continue
        if kind == "topo":
            _topo_row(topo, tokens, cols, numa, cpus)
        else:
            _p2p_row(topo, tokens, cols, mode)
    gpus = header_gpus or sorted({i for d in topo.p2p.values() for pair in d for i in pair})
    topo.gpus = [GpuInfo(index=i, numa=numa.get(i), cpu_affinity=cpus.get(i)) for i in gpus]
    return topo


def _is_header(tokens: list[str]) -> bool:
    if not _GPU.match(tokens[0]):
        return False
    return len(tokens) == 1 or not (_TOPO_CELL.match(tokens[1]) or tokens[1] in _P2P_CELLS)


def _header_columns(tokens: list[str]) -> list[str]:
    cols: list[str] = []
    for t in tokens:
        if t == "CPU":
            break
        cols.append(t)
    return cols


def _topo_row(
    topo: Topology,
    tokens: list[str],
    cols: list[str],
    numa: dict[int, int | None],
    cpus: dict[int, str | None],
) -> None:
    label = tokens[0]
    cells = tokens[1 : 1 + len(cols)]
    rest = tokens[1 + len(cols) :]
    row_gpu = _GPU.match(label)
    for col, cell in zip(cols, cells, strict=False):
        if not _TOPO_CELL.match(cell):
            topo.notes.append(f"row {label}: unexpected cell {cell[:16]!r} under {col}")
            continue
        if cell == "X":
            continue
        col_gpu = _GPU.match(col)
        if row_gpu and col_gpu:
            a, b = int(row_gpu.group(1)), int(col_gpu.group(1))
            if a == b:  # a GPU's own cell is "X"; anything else there is not a link
                topo.notes.append(f"row {label}: {cell!r} on its own column ignored")
                continue
            topo.links.setdefault((min(a, b), max(a, b)), "SYS" if cell == "SOC" else cell)
        elif row_gpu:
            topo.gpu_nic[(int(row_gpu.group(1)), col)] = cell
        elif col_gpu:
            topo.gpu_nic.setdefault((int(col_gpu.group(1)), label), cell)
    if row_gpu:
        idx = int(row_gpu.group(1))
        cpus[idx] = rest[0] if rest and _CPU_LIST.match(rest[0]) else None
        numa[idx] = int(rest[1]) if len(rest) > 1 and rest[1].isdecimal() else None


def _p2p_row(topo: Topology, tokens: list[str], cols: list[str], mode: str) -> None:
    row_gpu = _GPU.match(tokens[0])
    if not row_gpu:
        return
    a = int(row_gpu.group(1))
    table = topo.p2p.setdefault(mode, {})
    for col, cell in zip(cols, tokens[1:], strict=False):
        col_gpu = _GPU.match(col)
        if not col_gpu or cell not in _P2P_CELLS:
            continue
        b = int(col_gpu.group(1))
        if cell != "X" and a != b:
            table[(a, b)] = cell


def parse_rocm_showtopo(text: str, source: str = "rocm-smi --showtopo") -> Topology:
    """AMD ``rocm-smi --showtopo``: the link-type matrix (``PCIE``/``XGMI``) and NUMA nodes."""
    topo = Topology(source=source)
    section = ""
    cols: list[int] = []
    gpus: set[int] = set()
    numa: dict[int, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("="):
            section = line.strip("= ").lower()
            cols = []
            continue
        m = _ROCM_NUMA.search(line)
        if m:
            numa[int(m.group(1))] = int(m.group(2))
            continue
        tokens = line.split()
        if not tokens or "link type" not in section:
            continue
        if all(_GPU.match(t) for t in tokens):
            cols = [int(t[3:]) for t in tokens]
            gpus.update(cols)
            continue
        row = _GPU.match(tokens[0])
        if not row or not cols:
            continue
        a = int(row.group(1))
        for b, cell in zip(cols, tokens[1:], strict=False):
            if a != b and cell.isalpha():
                topo.links.setdefault((min(a, b), max(a, b)), cell.upper())
    topo.gpus = [GpuInfo(index=i, numa=numa.get(i)) for i in sorted(gpus)]
    if any(c == "XGMI" for c in topo.links.values()):
        topo.notes.append(
            "XGMI links: the rate per link needs the GPU model (rocm-smi --showtopo names none)"
        )
    return topo
