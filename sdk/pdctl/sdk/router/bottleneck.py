"""Which part of the TTFT dominates, per P→D pair, and what to change: a verdict from the
router's flight recorder (``/v1/pdctl/requests`` entries with ``segments``).

Segments are grouped by what would fix them:

* ``prefill``: queue and compute on prefill (a prompt burst saturates it);
* ``decode``: decode admitting the request (the prefill-first wait for its registration),
  scheduling it after its KV arrived, its first step (a decode busy with long
  generations saturates it);
* ``transfer``: hand-off to the writer, NIXL's WRITE, the notification and its pick-up
  (a slow link, a TCP fallback);
* ``router``: the router's own work and answers travelling through it;
* ``generation``: a non-streamed answer's whole generation (not a bottleneck of the
  pair: the client did not stream).

Per pair the verdict names the group with the largest share of the median TTFT (median
over requests of each group's milliseconds), its largest segment, the numbers behind it
and the advice. Pure: no clock, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.router import flightrec as fr

GROUPS: dict[str, str] = {
    fr.PREFILL_QUEUE: "prefill",
    fr.PREFILL: "prefill",
    fr.PREFILL_LEG: "prefill",
    fr.WAIT_REGISTRATION: "decode",
    fr.DECODE_ADMISSION: "decode",
    fr.REGISTRATION: "decode",
    fr.DECODE_SCHEDULE: "decode",
    fr.FIRST_TOKEN: "decode",
    fr.DECODE_INCL_WAIT: "decode",
    fr.DECODE_INCL_READ: "decode",
    fr.DECODE: "decode",
    fr.HANDOFF: "transfer",
    fr.WRITE: "transfer",
    fr.NOTIFICATION: "transfer",
    fr.PICKUP: "transfer",
    fr.ROUTER: "router",
    fr.PREFILL_ANSWER: "router",
    fr.ROUTER_TO_DECODE: "router",
    fr.GENERATION: "generation",
}
"""Segment → the group that owns it (segments after the first byte are not TTFT)."""
MIN_REQUESTS = 3
"""Fewer finished requests with segments than this: no verdict (too few to say)."""


@dataclass(frozen=True)
class PairVerdict:
    prefill: str
    decode: str
    requests: int
    errors: int
    ttft_p50_ms: float | None
    bottleneck: str | None
    """The dominant group (prefill, decode, transfer, router, generation); None: too few
    requests to say."""
    share: float | None
    """The group's median milliseconds over the median TTFT."""
    segment: str | None
    """The group's largest segment (by median milliseconds)."""
    advice: str
    shares: dict[str, float] = field(default_factory=dict)
    """Every group's share (the numbers behind the verdict)."""
    transfer_bps: float | None = None
    """Median bytes per second of the pair's WRITEs (NIXL's own time), when measured."""
    expected_bps: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def headline(self) -> str:
        if self.bottleneck is None or self.share is None:
            return self.advice
        return f"{self.segment or self.bottleneck} {self.share:.0%}: {self.advice}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "requests": self.requests,
            "errors": self.errors,
            "ttft_p50_ms": self.ttft_p50_ms,
            "bottleneck": self.bottleneck,
            "share": self.share,
            "segment": self.segment,
            "advice": self.advice,
            "shares": self.shares,
            "transfer_bps": self.transfer_bps,
            "expected_bps": self.expected_bps,
        }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _gbps(bps: float | None) -> str:
    return "?" if bps is None else f"{bps / 1e9:.2g} GB/s"


def advice(group: str, segment: str, rate: float | None, expected: float | None) -> str:
    """What to change when ``group`` dominates (``segment``: its largest part)."""
    if group == "prefill":
        if segment == fr.PREFILL_QUEUE:
            return "prefill is saturated (requests queue there): add prefill instances"
        if segment == fr.PREFILL_LEG:
            return (
                "the prefill leg dominates (queue and compute not itemized without pdctl's "
                "connector): add prefill instances, or look at its queue"
            )
        return "prefill compute dominates: add prefill instances (or TP) for these prompts"
    if group == "decode":
        if segment in fr.WAIT_GROUP:
            return (
                "decode admits requests late (prefill waits for its registration): decode is "
                "saturated: add decode, or lower max_num_seqs on decode"
            )
        return "decode is saturated: add decode, or lower max_num_seqs on decode"
    if group == "transfer":
        if rate is not None and expected is not None and rate < 0.5 * expected:
            return f"KV moves at {_gbps(rate)} against {_gbps(expected)} expected: run preflight"
        if rate is not None:
            return f"KV transfer at {_gbps(rate)} dominates: check the path (pdctl preflight)"
        return "KV hand-off and transfer dominate: check the path (pdctl preflight)"
    if group == "router":
        return "the router's own time dominates: check the router's host and its CPU"
    if group == "generation":
        return "not streamed: TTFT holds the whole answer; stream (stream: true) to see TTFT"
    return "no single part dominates"


def _transfer_rate(r: Mapping[str, Any]) -> float | None:
    push = r.get("push")
    if not isinstance(push, Mapping):
        return None
    b, ms = _num(push.get("bytes")), _num(push.get("write_ms"))
    return b / (ms / 1000) if b and ms and ms > 0 else None


def verdict(
    prefill: str,
    decode: str,
    requests: Iterable[Mapping[str, Any]],
    expected_bps: float | None = None,
) -> PairVerdict:
    """The verdict for one pair over its requests (any order; unfinished ones skipped)."""
    rs = [r for r in requests if r.get("outcome") in ("ok", "error")]
    errors = sum(r.get("outcome") == "error" for r in rs)
    rows: list[tuple[float, dict[str, float], dict[str, float]]] = []
    rates: list[float] = []
    for r in rs:
        ttft = _num(r.get("ttft_ms"))
        segs = r.get("segments")
        if r.get("outcome") != "ok" or ttft is None or ttft <= 0 or not isinstance(segs, list):
            continue
        groups: dict[str, float] = {}
        by_seg: dict[str, float] = {}
        for s in segs:
            if not isinstance(s, Mapping):
                continue
            name, a, b = s.get("name"), _num(s.get("start_ms")), _num(s.get("end_ms"))
            if not isinstance(name, str) or a is None or b is None or name not in GROUPS:
                continue
            groups[GROUPS[name]] = groups.get(GROUPS[name], 0.0) + (b - a)
            by_seg[name] = by_seg.get(name, 0.0) + (b - a)
        if groups:
            rows.append((ttft, groups, by_seg))
        rate = _transfer_rate(r)
        if rate is not None:
            rates.append(rate)
    transfer = statistics.median(rates) if rates else None
    if len(rows) < MIN_REQUESTS:
        why = f"{len(rows)} finished request(s) with a TTFT split: too few for a verdict"
        return PairVerdict(prefill, decode, len(rs), errors, None, None, None, None, why,
                           transfer_bps=transfer, expected_bps=expected_bps)  # fmt: skip
    ttft_p50 = statistics.median(t for t, _, _ in rows)
    names = sorted({g for _, gs, _ in rows for g in gs})
    med = {g: statistics.median(gs.get(g, 0.0) for _, gs, _ in rows) for g in names}
    shares = {g: round(v / ttft_p50, 4) for g, v in med.items()}
    top = max(names, key=lambda g: (med[g], g))
    segs = sorted({s for _, _, bs in rows for s in bs if GROUPS[s] == top})
    seg_med = {s: statistics.median(bs.get(s, 0.0) for _, _, bs in rows) for s in segs}
    seg = max(segs, key=lambda s: (seg_med[s], s))
    return PairVerdict(
        prefill,
        decode,
        len(rs),
        errors,
        round(ttft_p50, 3),
        top,
        shares[top],
        seg,
        advice(top, seg, transfer, expected_bps),
        shares,
        transfer,
        expected_bps,
    )


def verdicts(
    requests: Iterable[Mapping[str, Any]], expected_bps: float | None = None
) -> list[PairVerdict]:
    """One verdict per P→D pair seen in ``requests`` (a prefill and a decode named)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in requests:
        p, d = r.get("prefill"), r.get("decode")
        if isinstance(p, str) and isinstance(d, str) and p and d:
            groups.setdefault((p, d), []).append(r)
    return [verdict(p, d, rs, expected_bps) for (p, d), rs in sorted(groups.items())]


def matrix(
    found: Iterable[PairVerdict],
) -> tuple[list[str], list[str], dict[tuple[str, str], PairVerdict]]:
    """Prefills (rows), decodes (columns) and the verdict of each pair that has one."""
    cells = {(v.prefill, v.decode): v for v in found}
    return (
        sorted({p for p, _ in cells}),
        sorted({d for _, d in cells}),
        cells,
    )
