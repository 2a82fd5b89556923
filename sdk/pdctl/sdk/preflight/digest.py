"""A preflight report for people: the verdict, each finding split into what was seen and
what to do, the KV path of every pair with the GB/s to expect, and what was not checked.

Pure: it reads the JSON form (:meth:`PreflightReport.as_dict`, i.e. ``pdctl preflight
--json``), so a report saved on another host reads the same. Findings follow the report's
own convention: a message is the evidence, then ``Do:`` and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIX_MARK = " Do: "
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    evidence: str
    """What was seen and what it costs, with the report's numbers."""
    fix: str
    """What to do ('' when the finding asks for nothing)."""
    pairs: tuple[str, ...] = ()


@dataclass(frozen=True)
class KvPath:
    """How one P→D pair's KV travels and how fast it should."""

    pair: str
    path: str
    detail: str
    expected_gbps: float | None
    """What the hardware should give per TP rank (nominal times efficiency, after the checks)."""
    bandwidth_gbps: float | None
    """What the transfer time was computed with (a measurement when there was one)."""
    bandwidth_source: str
    kv_bytes: int | None
    transfer_s: float | None
    prefill_s: float | None
    verdict: str
    assumptions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unchecked:
    """A place the preflight could not look (absent tool, error, skipped), and why."""

    name: str
    state: str
    why: str


@dataclass(frozen=True)
class Digest:
    verdict: str
    exit_code: int | None
    mode: str | None
    host: str | None
    findings: tuple[Finding, ...]
    paths: tuple[KvPath, ...]
    unchecked: tuple[Unchecked, ...]
    assumptions: tuple[str, ...]
    measure: str
    expected_throughput_bps: float | None

    @property
    def headline(self) -> str:
        """One line: the verdict and why (the worst finding, or the slowest path)."""
        worst = self.findings[0] if self.findings else None
        if worst is not None and worst.severity != "info":
            return f"{self.verdict}: {worst.evidence}"
        if self.paths:
            slowest = min(self.paths, key=lambda p: p.expected_gbps or float("inf"))
            gbps = "?" if slowest.expected_gbps is None else f"{slowest.expected_gbps:g}"
            return f"{self.verdict}: slowest KV path {slowest.pair} {slowest.path}, {gbps} GB/s"
        if worst is not None:
            return f"{self.verdict}: {worst.evidence}"
        return self.verdict


def split_fix(message: str) -> tuple[str, str]:
    """``evidence Do: fix`` → (evidence, fix); a message without ``Do:`` is all evidence."""
    head, sep, tail = message.partition(FIX_MARK)
    if not sep:
        return message.strip(), ""
    return head.strip(), tail.strip()


def _str(v: Any, default: str = "") -> str:
    return v if isinstance(v, str) else default


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dicts(v: Any) -> list[Mapping[str, Any]]:
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def _strs(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, Sequence) and not isinstance(v, str) else ()


def digest(report: Mapping[str, Any]) -> Digest:
    """Read a report's JSON form; missing or mistyped keys read as unknown, never raise."""
    findings = []
    for w in _dicts(report.get("warnings")):
        evidence, fix = split_fix(_str(w.get("message")))
        findings.append(
            Finding(
                _str(w.get("code"), "?"),
                _str(w.get("severity"), "info"),
                evidence,
                fix,
                _strs(w.get("pairs")),
            )
        )
    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    paths = tuple(
        KvPath(
            pair=_str(p.get("name"), "?"),
            path=_str(p.get("path"), "?"),
            detail=_str(p.get("path_detail")),
            expected_gbps=_num(p.get("expected_gbps")),
            bandwidth_gbps=_num(p.get("bandwidth_gbps")),
            bandwidth_source=_str(p.get("bandwidth_source")),
            kv_bytes=_int(p.get("kv_bytes")),
            transfer_s=_num(p.get("transfer_s")),
            prefill_s=_num(p.get("prefill_s")),
            verdict=_str(p.get("verdict"), "UNKNOWN"),
            assumptions=_strs(p.get("assumptions")),
        )
        for p in _dicts(report.get("pairs"))
    )
    unchecked = tuple(
        Unchecked(_str(c.get("name"), "?"), _str(c.get("state"), "?"), _str(c.get("detail")))
        for c in _dicts(report.get("checked"))
        if c.get("state") != "ok"
    )
    return Digest(
        verdict=_str(report.get("verdict"), "UNKNOWN"),
        exit_code=_int(report.get("exit_code")),
        mode=_str(report.get("mode")) or None,
        host=_str(report.get("host")) or None,
        findings=tuple(findings),
        paths=paths,
        unchecked=unchecked,
        assumptions=_strs(report.get("assumptions")),
        measure=_str(report.get("measure")),
        expected_throughput_bps=_num(report.get("expected_throughput_bps")),
    )
