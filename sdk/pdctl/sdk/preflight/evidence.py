"""What logs already prove: measured transfer rates and the transports really chosen.

Reads vLLM's ``KV Transfer metrics:`` line, ``nixlbench`` tables, CUDA ``simpleP2P``
bandwidth, NCCL ``NCCL_DEBUG=INFO`` channel and topology-path lines, and UCX lines (lanes,
``UCX_PROTO_INFO`` tables, registration and NVLink messages: :mod:`.ucxlog`). Pure and
total: unknown lines are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pdctl.sdk.preflight.ucxlog import UcxLog, parse_ucx_line

MIB = 2**20
"""vLLM's "MB" in the KV Transfer metrics line is bytes / 2**20."""

_VLLM_KV = re.compile(r"KV Transfer metrics:\s*(.*)")
_VLLM_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9 ()/]*?)\s*=\s*([0-9.]+(?:[eE][-+]?\d+)?)")
_NIXLBENCH_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)")
_PEER_BW = re.compile(r"cudaMemcpyPeer.*?:\s*(\d+(?:\.\d+)?)\s*GB/s")
_NCCL_VIA = re.compile(r"NCCL INFO Channel .* via (\S.*?)\s*$")
_NCCL_PATH = re.compile(
    r"(GPU|NET|CPU|NVS|NIC)/([0-9A-Fa-f]+)\s*\((\d+)/(\d+(?:\.\d+)?)/([A-Z]+)\)"
)
_NCCL_PATH_FROM = re.compile(r"NCCL INFO (GPU/[0-9A-Fa-f]+)\s*:")


@dataclass(frozen=True)
class Measurement:
    bytes_per_s: float
    source: str
    detail: str
    transfer_s: float | None = None
    bytes_per_transfer: float | None = None
    descriptors: float | None = None


@dataclass(frozen=True)
class NcclPath:
    target: str
    hops: int
    gbytes_per_s: float
    kind: str


@dataclass
class Evidence:
    measurements: list[Measurement] = field(default_factory=list)
    nccl_transports: set[str] = field(default_factory=set)
    """Generalised NCCL channel transports, e.g. ``NET/IB/GDRDMA``, ``P2P/CUMEM``."""
    nccl_paths: dict[str, list[NcclPath]] = field(default_factory=dict)
    ucx: UcxLog = field(default_factory=UcxLog)

    @property
    def gdr_in_use(self) -> bool | None:
        if any(t.endswith("GDRDMA") for t in self.nccl_transports):
            return True
        return False if any(t.startswith("NET/") for t in self.nccl_transports) else None

    def best(self, source_prefix: str = "") -> Measurement | None:
        ms = [m for m in self.measurements if m.source.startswith(source_prefix)]
        return max(ms, key=lambda m: m.bytes_per_s) if ms else None

    def merge(self, other: Evidence) -> None:
        self.measurements.extend(other.measurements)
        self.nccl_transports |= other.nccl_transports
        for k, v in other.nccl_paths.items():
            self.nccl_paths.setdefault(k, []).extend(v)
        self.ucx.merge(other.ucx)


def parse_evidence(text: str) -> Evidence:
    ev = Evidence()
    nixlbench: list[tuple[int, float]] = []
    table: list[str | None] = [None]
    for line in text.splitlines():
        if parse_ucx_line(line, ev.ucx, table):
            continue
        if (m := _VLLM_KV.search(line)) is not None:
            vllm = _vllm_kv(m.group(1))
            if vllm is not None:
                ev.measurements.append(vllm)
        elif (m := _NIXLBENCH_ROW.match(line)) is not None:
            nixlbench.append((int(m.group(1)), float(m.group(3))))
        elif (m := _PEER_BW.search(line)) is not None:
            gbs = float(m.group(1))
            if gbs > 0:
                ev.measurements.append(
                    Measurement(gbs * 1e9, "cudaMemcpyPeer", f"simpleP2P: {gbs:g} GB/s")
                )
        elif (m := _NCCL_VIA.search(line)) is not None:
            ev.nccl_transports.add(_generalise_via(m.group(1)))
        elif (m := _NCCL_PATH_FROM.search(line)) is not None:
            ev.nccl_paths.setdefault(m.group(1), []).extend(
                NcclPath(f"{p[0]}/{p[1]}", int(p[2]), float(p[3]), p[4])
                for p in _NCCL_PATH.findall(line[m.end() :])
            )
    if nixlbench:
        block, gbs = max(nixlbench, key=lambda r: r[1])
        if gbs > 0:
            ev.measurements.append(
                Measurement(gbs * 1e9, "nixlbench", f"nixlbench: {gbs:g} GB/s at {block} B blocks")
            )
    return ev


def _vllm_kv(fields_text: str) -> Measurement | None:
    f = {k.strip(): float(v) for k, v in _VLLM_FIELD.findall(fields_text) if _finite(v)}
    mbps = f.get("Throughput (MB/s)")
    if not mbps or mbps <= 0:
        return None
    xfer_ms = f.get("Avg xfer time (ms)")
    mb = f.get("Avg MB per transfer")
    n = f.get("Num successful transfers")
    return Measurement(
        bytes_per_s=mbps * MIB,
        source="vLLM KV Transfer metrics",
        detail=f"{mbps:g} MB/s over {n:g} transfers (MB = 2**20 B; pooled over TP ranks)"
        if n is not None
        else f"{mbps:g} MB/s",
        transfer_s=xfer_ms / 1e3 if xfer_ms else None,
        bytes_per_transfer=mb * MIB if mb else None,
        descriptors=f.get("Avg number of descriptors"),
    )


def _finite(v: str) -> bool:
    try:
        x = float(v)
    except ValueError:
        return False
    return x == x and abs(x) != float("inf")


def _generalise_via(via: str) -> str:
    """``NET/IB/3/GDRDMA`` → ``NET/IB/GDRDMA`` (device numbers dropped)."""
    return "/".join(p for p in via.split("/") if not p.isdigit())
