"""Live figures of a running fleet against the plan's prediction (correction factors).

From one metrics :class:`~pdctl.sdk.metrics.monitor.Snapshot`: the request rate (the
prefill or colocated instances' ``request_rate`` summed), TTFT p50 (the highest of the
decode or colocated instances', which is what a client sees last), ITL p50 (their
median), and the prompt and output lengths of the requests finished in the window
(prompts on the prefill or colocated instances, outputs on the decode or colocated
ones). The correction factors are observed / predicted for the fleet's current layout
at the observed rate, as Dynamo's SLA planner keeps them (pure).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.metrics.derive import Lengths
from pdctl.sdk.metrics.monitor import Snapshot
from pdctl.sdk.plan.latency import Correction, Workload
from pdctl.sdk.plan.planner import Layout, Plan, Slos, make_plan
from pdctl.sdk.plan.profile import Profile, ProfileError
from pdctl.sdk.plan.transfer import transfers
from pdctl.sdk.spec import FleetSpec


@dataclass(frozen=True)
class LiveFigures:
    rate: float
    ttft_p50_s: float | None
    itl_p50_s: float | None
    instances: int
    isl_mean: float | None = None
    """Mean prompt tokens (exact: the histograms' sum / count), count-weighted."""
    isl_p95: float | None = None
    """The highest instance's bucket-interpolated p95, when the buckets resolve it."""
    osl_mean: float | None = None
    span_s: float | None = None
    """The longest span between the two scrapes behind the figures (seconds)."""
    front: tuple[str, ...] = ()
    """The instances the rate and prompt lengths come from."""
    back: tuple[str, ...] = ()
    """The instances TTFT, ITL and output lengths come from."""


def layout_of(spec: FleetSpec) -> Layout:
    """The spec's layout in the planner's terms (TP of its first group)."""
    n_p = sum(g.count for g in spec.prefill)
    n_d = sum(g.count for g in spec.decode)
    tp = (spec.prefill or spec.decode)[0].tp
    if spec.fleet.mode == "colocated":
        return Layout("colocated", n_p + n_d, 0, tp)
    return Layout(spec.fleet.mode, n_p, n_d, tp)


def live_figures(snap: Snapshot) -> LiveFigures:
    up = [i for i in snap.instances if i.health == "UP"]
    front = [i for i in up if i.role in ("prefill", "colocated")]
    back = [i for i in up if i.role in ("decode", "colocated")]
    rates = [i.request_rate for i in front if i.request_rate is not None]
    if not rates:
        raise ProfileError(
            "the fleet reports no request rate yet: let it serve traffic for a while (the "
            "rate needs two scrapes); pdctl plan can take --rate instead"
        )
    ttfts = [i.ttft.p50 for i in back if i.ttft.p50 is not None]
    itls = [i.itl.p50 for i in back if i.itl.p50 is not None]
    spans = [i.span_s for i in up if i.span_s is not None]
    p95s = [i.prompt_tokens.p95 for i in front if i.prompt_tokens.p95 is not None]
    return LiveFigures(
        rate=sum(rates),
        ttft_p50_s=max(ttfts) if ttfts else None,
        itl_p50_s=statistics.median(itls) if itls else None,
        instances=len(up),
        isl_mean=_mean([i.prompt_tokens for i in front]),
        isl_p95=max(p95s) if p95s else None,
        osl_mean=_mean([i.output_tokens for i in back]),
        span_s=max(spans) if spans else None,
        front=tuple(i.name for i in front),
        back=tuple(i.name for i in back),
    )


def _mean(lengths: Sequence[Lengths]) -> float | None:
    n = sum(x.count for x in lengths if x.mean is not None)
    if n <= 0:
        return None
    return sum(x.mean * x.count for x in lengths if x.mean is not None) / n


def correction_of(
    plan: Plan, current: Layout, live: LiveFigures, window_s: float | None = None
) -> Correction | None:
    """Observed / predicted TTFT and ITL p50 of ``current`` in an uncorrected ``plan``
    at the live rate; None when the current layout is not among the plan's candidates.
    ``window_s`` defaults to the live figures' span."""
    cand = next((c for c in plan.candidates if c.layout == current), None)
    if cand is None:
        return None
    return Correction(
        _ratio(live.ttft_p50_s, cand.pred.ttft_s["p50"]),
        _ratio(live.itl_p50_s, cand.pred.itl_s["p50"]),
        current.name,
        live.rate,
        live.span_s if window_s is None else window_s,
    )


def corrections(plan: Plan, current: Layout, live: LiveFigures) -> dict[str, Any]:
    """Observed / predicted TTFT and ITL p50 of the current layout (None where unknown)."""
    cand = next((c for c in plan.candidates if c.layout == current), None)
    if cand is None:
        return {"layout": current.name, "note": "the current layout is outside the budget"}
    p_ttft, p_itl = cand.pred.ttft_s["p50"], cand.pred.itl_s["p50"]
    return {
        "layout": current.name,
        "rate": live.rate,
        "window_s": live.span_s,
        "observed_ms": {"ttft_p50": _ms(live.ttft_p50_s), "itl_p50": _ms(live.itl_p50_s)},
        "predicted_ms": {"ttft_p50": _ms(p_ttft), "itl_p50": _ms(p_itl)},
        "ttft_factor": _ratio(live.ttft_p50_s, p_ttft),
        "itl_factor": _ratio(live.itl_p50_s, p_itl),
    }


def _ms(v: float | None) -> float | None:
    return None if v is None or v == float("inf") else round(v * 1e3, 3)


def _ratio(obs: float | None, pred: float) -> float | None:
    if obs is None or pred <= 0 or pred == float("inf"):
        return None
    return round(obs / pred, 3)


@dataclass(frozen=True)
class PlanWatch:
    """What the metrics stream needs to compare a live fleet with the planner."""

    profile: Profile
    spec: FleetSpec
    isl: int
    osl: int
    isl_p95: int | None = None

    def check(self, snap: Snapshot) -> dict[str, Any]:
        """Correction factors of the current layout at the snapshot's rate."""
        try:
            live = live_figures(snap)
        except ProfileError as e:
            return {"note": str(e)}
        current = layout_of(self.spec)
        work = Workload(self.isl, self.osl, live.rate, self.isl_p95)
        tr = transfers(self.profile, self.isl)
        plan = make_plan(self.profile, work, Slos(), current.gpus, tr)
        return corrections(plan, current, live)
