"""The preflight's answer: plain dataclasses, JSON-ready through :meth:`PreflightReport.as_dict`.

Units: bytes, seconds, bytes per second internally; the JSON adds ``bandwidth_gbps`` in
GB/s (10⁹ bytes per second, the unit of ``pdctl metrics --expect-gbps``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pdctl.sdk.preflight.kvpath import PathClass
from pdctl.sdk.preflight.model import Inventory, Topology

Severity = Literal["error", "warning", "info"]
SCHEMA_VERSION = 1


class Verdict(StrEnum):
    OK = "OK"
    MARGINAL = "MARGINAL"
    UNLIKELY = "UNLIKELY TO PAY OFF"
    DO_NOT = "DO NOT DISAGGREGATE"
    UNKNOWN = "UNKNOWN"


VERDICT_RANK = {
    Verdict.OK: 0,
    Verdict.UNKNOWN: 1,
    Verdict.MARGINAL: 2,
    Verdict.UNLIKELY: 3,
    Verdict.DO_NOT: 4,
}


@dataclass(frozen=True)
class PreflightWarning:
    code: str
    severity: Severity
    message: str
    """What was seen, what it costs (with numbers), what to do."""
    pairs: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "pairs": list(self.pairs),
        }


@dataclass(frozen=True)
class PairResult:
    name: str
    """``prefill-0 -> decode-0`` (from a spec) or ``GPU0 -> GPU1``."""
    prefill_host: str
    decode_host: str
    prefill_gpus: tuple[int, ...]
    decode_gpus: tuple[int, ...]
    tp: int
    path: PathClass
    path_detail: str
    expected_bps: float | None
    """Per TP rank, from hardware nominal x η after stack checks (what to expect)."""
    bandwidth_bps: float | None
    """Per TP rank, what the transfer time is computed with (measured when available)."""
    bandwidth_source: str
    kv_bytes: int | None
    """Per TP rank, one prompt at the p50 length."""
    kv_bytes_p95: int | None
    transfer_s: float | None
    transfer_s_p95: float | None
    prefill_s: float | None
    ratio: float | None
    link_load: float | None
    verdict: Verdict
    same_host: bool
    assumptions: tuple[str, ...] = ()

    @property
    def transfers(self) -> bool:
        return self.path is not PathClass.SAME_GPU

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = self.path.value
        d["verdict"] = self.verdict.value
        d["prefill_gpus"] = list(self.prefill_gpus)
        d["decode_gpus"] = list(self.decode_gpus)
        d["assumptions"] = list(self.assumptions)
        d["bandwidth_gbps"] = _gbps(self.bandwidth_bps)
        d["expected_gbps"] = _gbps(self.expected_bps)
        return d


def _gbps(bps: float | None) -> float | None:
    return None if bps is None else round(bps / 1e9, 4)


@dataclass
class KvSummary:
    config: str | None
    kind: str | None
    dtype: str | None
    bytes_per_token: int | None
    prompt_len: int
    prompt_len_p95: int
    bytes_per_prompt: int | None
    bytes_per_prompt_p95: int | None
    notes: list[str] = field(default_factory=list)


@dataclass
class PreflightReport:
    inventory: Inventory
    kv: KvSummary
    pairs: list[PairResult]
    warnings: list[PreflightWarning]
    mode: str
    rate: float | None
    ttft_colocated_s: float | None
    source: str | None
    """The spec file the pairs come from, or None (every GPU pair of this host)."""
    assumptions: list[str] = field(default_factory=list)
    measure_hint: str = ""

    @property
    def verdict(self) -> Verdict:
        """The worst verdict over pairs that move KV (OK when nothing moves)."""
        moving = [p.verdict for p in self.pairs if p.transfers]
        if not moving:
            return Verdict.UNKNOWN if not self.pairs else Verdict.OK
        return max(moving, key=VERDICT_RANK.__getitem__)

    @property
    def exit_code(self) -> int:
        """0 OK, 1 warnings, 2 a blocking problem."""
        if any(w.severity == "error" for w in self.warnings):
            return 2
        if self.verdict is Verdict.DO_NOT:
            return 2
        return 1 if any(w.severity == "warning" for w in self.warnings) else 0

    def worst_pair(self) -> PairResult | None:
        """The transferring pair with the lowest expected bandwidth."""
        moving = [p for p in self.pairs if p.transfers and p.expected_bps is not None]
        if not moving:
            return None
        return min(moving, key=lambda p: (p.expected_bps or 0.0) * p.tp)

    def expected_throughput_bps(self) -> float | None:
        """KV bytes/s one prefill instance should move over its worst planned pair (all TP
        ranks together): the figure the fleet monitor's PA004 alert compares against."""
        worst = self.worst_pair()
        if worst is None or worst.expected_bps is None:
            return None
        return worst.expected_bps * worst.tp

    def as_dict(self) -> dict[str, Any]:
        inv = self.inventory
        topo = inv.topology
        return {
            "schema": SCHEMA_VERSION,
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "source": self.source,
            "mode": self.mode,
            "rate": self.rate,
            "ttft_colocated_s": self.ttft_colocated_s,
            "expected_throughput_bps": self.expected_throughput_bps(),
            "host": inv.host,
            "gpus": _gpus(topo),
            "topology_source": topo.source if topo else None,
            "nics": [{**asdict(n), "kind": n.kind, "active": n.active} for n in inv.nics],
            "gpudirect_rdma": asdict(inv.gdr),
            "netdev_speeds_mbps": inv.netdev_speeds_mbps,
            "tools": asdict(inv.tools),
            "checked": [asdict(c) for c in inv.checks],
            "kv": asdict(self.kv),
            "pairs": [p.as_dict() for p in self.pairs],
            "warnings": [w.as_dict() for w in self.warnings],
            "assumptions": self.assumptions,
            "measure": self.measure_hint,
        }


def _gpus(topo: Topology | None) -> list[dict[str, Any]]:
    if topo is None:
        return []
    return [
        {
            **asdict(g),
            "nvlink_peers": {
                str(o.index): topo.link(g.index, o.index)
                for o in topo.gpus
                if o.index != g.index and (topo.nvlink_count(g.index, o.index) or 0) > 0
            },
        }
        for g in topo.gpus
    ]
