"""Candidates, their predictions and the recommendation, with the reason each one loses.

Candidates within a budget of GPUs (on CPU: instances x TP): colocated x k, and every
xPyD in push and in pull. The recommendation is the cheapest candidate whose TTFT and
TPOT at the SLO percentile meet the SLOs; ties go to colocated (nothing to move), then
to the higher predicted goodput. When none meets them, the highest predicted goodput
wins and the plan says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.plan.latency import (
    Correction,
    Prediction,
    Transfer,
    Workload,
    goodput_share,
    predict_colocated,
    predict_disagg,
)
from pdctl.sdk.plan.profile import Curves, Profile, ProfileError, fit
from pdctl.sdk.preflight.verdict import fmt_bps, fmt_bytes, fmt_s


@dataclass(frozen=True)
class Slos:
    ttft_s: float | None = None
    tpot_s: float | None = None
    """Applied to each request's TPOT (mean gap), as ``pdctl bench``'s goodput does."""
    pct: str = "p90"


@dataclass(frozen=True)
class Layout:
    mode: str
    """colocated | push | pull"""
    prefill: int
    decode: int = 0
    tp: int = 1

    @property
    def instances(self) -> int:
        return self.prefill + self.decode

    @property
    def gpus(self) -> int:
        return self.instances * self.tp

    @property
    def name(self) -> str:
        if self.mode == "colocated":
            return f"colocated x{self.prefill}"
        return f"{self.prefill}P{self.decode}D {self.mode}"


@dataclass
class Candidate:
    layout: Layout
    pred: Prediction
    goodput: float
    meets: bool
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        p = self.pred
        return {
            "layout": self.layout.name,
            "mode": self.layout.mode,
            "prefill": self.layout.prefill,
            "decode": self.layout.decode,
            "tp": self.layout.tp,
            "gpus": self.layout.gpus,
            "ttft_ms": _ms(p.ttft_s),
            "itl_ms": _ms(p.itl_s),
            "tpot_ms": _ms(p.tpot_s),
            "ttft_parts_ms": _ms(p.parts_s),
            "prefill_load": p.prefill_load,
            "decode_batch": p.decode_batch,
            "link_load": p.link_load,
            "stall_share": p.stall_share,
            "overloaded": p.overloaded,
            "goodput_rps": self.goodput,
            "meets_slos": self.meets,
            "why": self.why,
        }


@dataclass
class Plan:
    profile: str
    workload: Workload
    slos: Slos
    budget: int
    transfer: Transfer | None
    candidates: list[Candidate]
    best: Candidate
    verdict: str
    summary: str
    assumptions: list[str] = field(default_factory=list)
    correction: Correction | None = None
    """The live factors every prediction was scaled by (None: the profile's own)."""

    def as_dict(self) -> dict[str, Any]:
        w = self.workload
        t = self.transfer
        return {
            "profile": self.profile,
            "workload": {"isl": w.isl, "isl_p95": w.isl_p95 or w.isl, "osl": w.osl, "rate": w.rate},
            "slos": {
                "ttft_ms": None if self.slos.ttft_s is None else self.slos.ttft_s * 1e3,
                "tpot_ms": None if self.slos.tpot_s is None else self.slos.tpot_s * 1e3,
                "percentile": self.slos.pct,
            },
            "budget_gpus": self.budget,
            "kv_path": None
            if t is None
            else {
                "path": t.path,
                "bytes_per_s": t.bps,
                "overhead_s": t.overhead_s,
                "bytes_per_prompt_rank": t.bytes_per_token_rank * w.isl,
                "transfer_ms_at_isl": t.seconds(w.isl) * 1e3,
                "source": t.source,
            },
            "recommended": self.best.layout.name,
            "verdict": self.verdict,
            "summary": self.summary,
            "candidates": [c.as_dict() for c in self.candidates],
            "assumptions": self.assumptions,
            "correction": None if self.correction is None else self.correction.as_dict(),
        }


def _ms(d: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if math.isinf(v) else round(v * 1e3, 3)) for k, v in d.items()}


def layouts(
    budget: int, tp: int, modes: tuple[str, ...] = ("colocated", "push", "pull")
) -> list[Layout]:
    n = budget // tp
    out: list[Layout] = []
    if "colocated" in modes:
        out.extend(Layout("colocated", k, 0, tp) for k in range(1, n + 1))
    for mode in (m for m in modes if m != "colocated"):
        out.extend(Layout(mode, x, y, tp) for x in range(1, n) for y in range(1, n - x + 1))
    return out


def make_plan(
    profile: Profile,
    workload: Workload,
    slos: Slos,
    budget: int,
    transfer: dict[str, Transfer] | None,
    modes: tuple[str, ...] = ("colocated", "push", "pull"),
    curves: Curves | None = None,
    correction: Correction | None = None,
) -> Plan:
    """Predict every candidate and pick one. ``transfer`` maps mode (push/pull) to the
    KV path model; without it only colocated layouts are considered. ``correction``
    scales every prediction by live factors before the SLOs are checked."""
    if workload.rate <= 0:
        raise ProfileError("--rate must be positive (requests per second)")
    if budget < profile.tp:
        raise ProfileError(
            f"--budget {budget} is smaller than the profile's TP {profile.tp}: give at least "
            f"{profile.tp} GPUs"
        )
    c = curves or fit(profile)
    assumptions: list[str] = []
    if not transfer:
        modes = tuple(m for m in modes if m == "colocated")
        assumptions.append("no KV path (no probe in the profile, no --topology): colocated only")
    cands: list[Candidate] = []
    for lay in layouts(budget, profile.tp, modes):
        if lay.mode == "colocated":
            pred = predict_colocated(
                c, workload, lay.prefill, profile.max_num_seqs, profile.chunk_tokens
            )
        else:
            assert transfer is not None
            pred = predict_disagg(
                c,
                workload,
                lay.prefill,
                lay.decode,
                profile.max_num_seqs,
                transfer[lay.mode],
                lay.mode,
            )
        if correction is not None:
            pred = correction.apply(pred)
        share = goodput_share(pred, slos.ttft_s, slos.tpot_s)
        meets = (
            pred.overloaded is None
            and _ok(pred.ttft_s[slos.pct], slos.ttft_s)
            and _ok(pred.tpot_s[slos.pct], slos.tpot_s)
        )
        cands.append(Candidate(lay, pred, share * workload.rate, meets))
    best = _choose(cands)
    for cand in cands:
        cand.why = _why(cand, best, slos, workload, transfer)
    verdict = "do not disaggregate" if best.layout.mode == "colocated" else "disaggregate"
    summary = _summary(best, cands, verdict, transfer, workload)
    t_any = (transfer or {}).get("push") or (transfer or {}).get("pull")
    if correction is not None:
        assumptions.append(
            f"every prediction scaled by the live correction factors: {correction.words()}"
        )
    return Plan(
        profile.tag(),
        workload,
        slos,
        budget,
        t_any,
        cands,
        best,
        verdict,
        summary,
        assumptions,
        correction,
    )


def _ok(v: float, slo: float | None) -> bool:
    return slo is None or v <= slo


def _choose(cands: list[Candidate]) -> Candidate:
    meeting = [c for c in cands if c.meets]
    if meeting:
        return min(
            meeting,
            key=lambda c: (
                c.layout.gpus,
                c.layout.mode != "colocated",
                -c.goodput,
                c.layout.prefill,
            ),
        )
    return max(cands, key=lambda c: (c.goodput, -c.layout.gpus, c.layout.mode == "colocated"))


def _why(
    cand: Candidate, best: Candidate, slos: Slos, w: Workload, transfer: dict[str, Transfer] | None
) -> str:
    p = cand.pred
    if cand is best:
        return (
            "recommended" if cand.meets else "no layout meets the SLOs; highest predicted goodput"
        )
    if p.overloaded is not None:
        what = {
            "prefill": f"prefill cannot keep up (load {p.prefill_load:.2f} at "
            f"{w.rate / cand.layout.prefill:.2g} req/s each)",
            "KV link": f"the KV link cannot keep up (load {p.link_load:.2f})",
            "decode": f"decode batch hits max_num_seqs ({p.decode_batch:.0f})",
        }[p.overloaded]
        return what
    pct = slos.pct
    ttft, tpot = p.ttft_s[pct], p.tpot_s[pct]
    if not _ok(ttft, slos.ttft_s):
        assert slos.ttft_s is not None
        parts = p.parts_s
        top = max(parts, key=lambda k: parts[k])
        cause = {
            "wait": f"queueing for prefill {fmt_s(parts['wait'])} (load {p.prefill_load:.2f})",
            "prefill": f"prefill itself {fmt_s(parts['prefill'])}",
            "transfer": _transfer_words(parts.get("transfer", 0.0), transfer, cand, w),
            "link_wait": f"waiting for the KV link {fmt_s(parts.get('link_wait', 0.0))} "
            f"(load {p.link_load:.2f})",
            "first_step": f"first decode step {fmt_s(parts.get('first_step', 0.0))}",
        }[top]
        return f"TTFT {pct} {fmt_s(ttft)} > {fmt_s(slos.ttft_s)}: {cause}"
    if not _ok(tpot, slos.tpot_s):
        assert slos.tpot_s is not None
        if cand.layout.mode == "colocated" and p.stall_share > 0:
            cause = f"prompt chunks stall decode ({p.stall_share:.0%} of steps carry prefill)"
        else:
            cause = f"decode batch {p.decode_batch:.1f} per instance"
        return f"TPOT {pct} {fmt_s(tpot)} > {fmt_s(slos.tpot_s)}: {cause}"
    if cand.layout.gpus > best.layout.gpus:
        return f"meets the SLOs but needs {cand.layout.gpus} GPUs (recommended: {best.layout.gpus})"
    return f"meets the SLOs at the same cost; predicted goodput {cand.goodput:.3g} req/s"


def _transfer_words(
    s: float, transfer: dict[str, Transfer] | None, cand: Candidate, w: Workload
) -> str:
    t = (transfer or {}).get(cand.layout.mode)
    if t is None:
        return f"KV transfer {fmt_s(s)}"
    nbytes = t.bytes_per_token_rank * w.isl
    return f"KV transfer {fmt_s(s)} ({fmt_bytes(nbytes)} at {fmt_bps(t.bps)}, {t.path})"


def _summary(
    best: Candidate,
    cands: list[Candidate],
    verdict: str,
    transfer: dict[str, Transfer] | None,
    w: Workload,
) -> str:
    head = f"{verdict}: {best.layout.name} ({best.layout.gpus} GPUs)"
    if not best.meets:
        head += (
            " — no layout meets the SLOs at this rate; this one has the highest predicted goodput"
        )
    if best.layout.mode == "colocated":
        lost = [c for c in cands if c.layout.mode != "colocated" and "KV transfer" in c.why]
        if lost:
            t = lost[0].pred.parts_s.get("transfer", 0.0)
            head += (
                f"; disaggregated layouts lose on TTFT to the KV transfer ({fmt_s(t)} per "
                f"{w.isl}-token prompt)"
            )
    else:
        col = [c for c in cands if c.layout.mode == "colocated" and not c.meets]
        if col:
            head += f"; colocated loses: {col[-1].why}"
    return head
