"""The planner's recommendation for a running fleet at its live load (pure).

:func:`recommend` takes one metrics :class:`~pdctl.sdk.metrics.monitor.Snapshot` (its
figures already cover the monitor's sliding window: that window is the history it
uses), the fleet's spec and a profile, and returns a :class:`LiveRecommendation`: the
current layout, the live load (rate, prompt and output lengths), TTFT and ITL p50
observed against the profile's prediction for the current layout, the correction
factors (observed / predicted), and the layout the planner recommends with every
prediction scaled by those factors, with the planner's reason. Every number is a
:class:`Figure` that names its source. The terminal UI's poll worker calls
:meth:`LivePlanner.recommend` and the UI renders the result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.metrics.monitor import Snapshot
from pdctl.sdk.plan.latency import Correction, Workload
from pdctl.sdk.plan.live import LiveFigures, correction_of, layout_of, live_figures
from pdctl.sdk.plan.planner import Candidate, Layout, Plan, Slos, make_plan
from pdctl.sdk.plan.profile import Profile, ProfileError, load_profile
from pdctl.sdk.plan.transfer import transfers
from pdctl.sdk.spec import FleetSpec

MEASURED = "measured"
PREDICTED = "predicted"
CORRECTED = "predicted x live factor"
INFERRED = "inferred"
SPEC = "spec"

DEFAULT_PROFILE = "pdctl-profile.json"
"""Where ``pdctl profile`` writes by default (its ``-o``), relative to the working
directory; the UI looks there when ``PDCTL_PLAN_PROFILE`` is not set."""
PROFILE_ENV = "PDCTL_PLAN_PROFILE"
HOW_TO = (
    "no planner profile: `pdctl profile -f SPEC --quick` writes ./pdctl-profile.json, "
    "which pdctl top reads from its working directory (or set PDCTL_PLAN_PROFILE=FILE); "
    "SLOs from PDCTL_PLAN_TTFT_SLO_MS, PDCTL_PLAN_ITL_SLO_MS, PDCTL_PLAN_SLO_PCT, budget "
    "from PDCTL_PLAN_BUDGET (default: the fleet's own GPUs)"
)


@dataclass(frozen=True)
class Figure:
    """One number and where it comes from: ``source`` is one of measured, predicted,
    predicted x live factor, inferred, spec; ``detail`` says which series or model."""

    value: float | None
    unit: str
    source: str
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "unit": self.unit,
            "source": self.source,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class LiveRecommendation:
    profile: str
    """The profile's tag (model, hardware, TP, vLLM)."""
    profile_source: str
    current: Layout
    """From the spec."""
    recommended: Layout
    verdict: str
    summary: str
    """The planner's reason line for its recommendation."""
    current_why: str
    """Why the planner does not recommend the current layout ("recommended" when it does)."""
    meets: bool
    load: dict[str, Figure]
    """rate, isl, isl_p95, osl."""
    observed: dict[str, Figure]
    """ttft_p50, itl_p50 of the running (current) layout."""
    predicted: dict[str, Figure]
    """ttft_p50, itl_p50 the profile predicts for the current layout at the live load."""
    factors: dict[str, Figure]
    """ttft, itl: observed / predicted."""
    expected: dict[str, Figure]
    """ttft_p50, itl_p50 of the recommended layout, scaled by the factors."""
    correction: Correction | None
    slos: Slos
    budget: int
    plan: Plan
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def change(self) -> bool:
        return self.recommended != self.current

    def as_dict(self) -> dict[str, Any]:
        def figs(d: dict[str, Figure]) -> dict[str, Any]:
            return {k: v.as_dict() for k, v in d.items()}

        return {
            "profile": self.profile,
            "profile_source": self.profile_source,
            "current": self.current.name,
            "recommended": self.recommended.name,
            "change": self.change,
            "verdict": self.verdict,
            "summary": self.summary,
            "current_why": self.current_why,
            "meets_slos": self.meets,
            "load": figs(self.load),
            "observed": figs(self.observed),
            "predicted": figs(self.predicted),
            "factors": figs(self.factors),
            "expected": figs(self.expected),
            "correction": None if self.correction is None else self.correction.as_dict(),
            "budget_gpus": self.budget,
            "notes": list(self.notes),
        }


def recommend(
    snap: Snapshot,
    profile: Profile,
    spec: FleetSpec,
    *,
    slos: Slos | None = None,
    budget: int | None = None,
    profile_source: str = "",
) -> LiveRecommendation:
    """Plan for the snapshot's live load with the correction factors measured on the
    current layout applied. Raises :class:`ProfileError` (with what to do) when the
    snapshot holds no request rate or no request lengths yet."""
    slos = slos or Slos()
    live = live_figures(snap)
    if live.isl_mean is None or live.osl_mean is None:
        raise ProfileError(
            "no prompt or output lengths in the metrics window yet "
            "(vllm:request_prompt_tokens / vllm:request_generation_tokens): let the fleet "
            "finish some requests"
        )
    current = layout_of(spec)
    gpus = max(budget or current.gpus, profile.tp)
    isl, osl = max(1, round(live.isl_mean)), max(1, round(live.osl_mean))
    p95 = round(live.isl_p95) if live.isl_p95 is not None and live.isl_p95 > isl else None
    work = Workload(isl, osl, live.rate, p95)
    tr = transfers(profile, isl)
    base = make_plan(profile, work, slos, gpus, tr)
    notes: list[str] = []
    corr = correction_of(base, current, live)
    if corr is None:
        notes.append(
            f"the current layout ({current.name}, TP {current.tp}) is not among the plan's "
            f"candidates (profile TP {profile.tp}, budget {gpus} GPUs, KV path "
            f"{'known' if tr else 'unknown'}): no correction factors"
        )
    elif corr.ttft is None and corr.itl is None:
        notes.append("no TTFT or ITL observed in the window: no correction factors")
        corr = None
    plan = base if corr is None else make_plan(profile, work, slos, gpus, tr, correction=corr)
    now_raw = _candidate(base, current)
    now = _candidate(plan, current)
    tag = f"profile {profile_source or profile.tag()}"
    where = f"current layout {current.name} at the live load"
    return LiveRecommendation(
        profile=profile.tag(),
        profile_source=profile_source,
        current=current,
        recommended=plan.best.layout,
        verdict=plan.verdict,
        summary=plan.summary,
        current_why=now.why if now is not None else "outside the plan's candidates",
        meets=plan.best.meets,
        load=_load(live, isl, p95),
        observed={
            "ttft_p50": Figure(
                live.ttft_p50_s,
                "s",
                MEASURED,
                "vllm:time_to_first_token_seconds p50 (bucket-interpolated), highest of "
                + _names(live.back),
            ),
            "itl_p50": Figure(
                live.itl_p50_s,
                "s",
                MEASURED,
                "vllm:inter_token_latency_seconds p50 (bucket-interpolated), median of "
                + _names(live.back),
            ),
        },
        predicted={
            k: Figure(
                None if now_raw is None else _finite(getattr(now_raw.pred, attr)["p50"]),
                "s",
                PREDICTED,
                f"{tag}, {where}",
            )
            for k, attr in (("ttft_p50", "ttft_s"), ("itl_p50", "itl_s"))
        },
        factors={
            k: Figure(
                None if corr is None else getattr(corr, k),
                "x",
                INFERRED,
                "observed / predicted p50"
                + ("" if corr is None or corr.window_s is None else f" over {corr.window_s:.0f} s"),
            )
            for k in ("ttft", "itl")
        },
        expected={
            k: Figure(
                _finite(getattr(plan.best.pred, attr)["p50"]),
                "s",
                PREDICTED if corr is None else CORRECTED,
                f"{tag}, {plan.best.layout.name}"
                + ("" if corr is None else f" x the {label} factor"),
            )
            for k, attr, label in (("ttft_p50", "ttft_s", "TTFT"), ("itl_p50", "itl_s", "ITL"))
        },
        correction=corr,
        slos=slos,
        budget=gpus,
        plan=plan,
        notes=tuple(notes + plan.assumptions),
    )


def _load(live: LiveFigures, isl: int, p95: int | None) -> dict[str, Figure]:
    span = "" if live.span_s is None else f" over {live.span_s:.0f} s"
    return {
        "rate": Figure(
            live.rate,
            "req/s",
            MEASURED,
            f"vllm:request_success_total{span}, summed over {_names(live.front)}",
        ),
        "isl": Figure(
            live.isl_mean,
            "tokens",
            MEASURED,
            f"mean of vllm:request_prompt_tokens{span} on {_names(live.front)}; planned as "
            f"the median ({isl})",
        ),
        "isl_p95": Figure(
            p95,
            "tokens",
            INFERRED,
            "interpolated in vllm:request_prompt_tokens' buckets"
            if p95 is not None
            else "not resolved by the histogram's buckets: prompts planned as one length",
        ),
        "osl": Figure(
            live.osl_mean,
            "tokens",
            MEASURED,
            f"mean of vllm:request_generation_tokens{span} on {_names(live.back)}",
        ),
    }


def _candidate(plan: Plan, layout: Layout) -> Candidate | None:
    return next((c for c in plan.candidates if c.layout == layout), None)


def _finite(v: float) -> float | None:
    return None if v == float("inf") else v


def _names(names: tuple[str, ...]) -> str:
    if len(names) <= 3:
        return ", ".join(names) or "no instance"
    return f"{', '.join(names[:2])} and {len(names) - 2} more"


@dataclass(frozen=True)
class LivePlanner:
    """A profile and the planner's settings, bound to one fleet's spec."""

    profile: Profile
    spec: FleetSpec
    profile_source: str = ""
    slos: Slos = field(default_factory=Slos)
    budget: int | None = None
    """GPUs; None: the current layout's."""

    def recommend(self, snap: Snapshot) -> LiveRecommendation:
        return recommend(
            snap,
            self.profile,
            self.spec,
            slos=self.slos,
            budget=self.budget,
            profile_source=self.profile_source,
        )

    @classmethod
    def discover(
        cls,
        spec: FleetSpec,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> tuple[LivePlanner | None, str]:
        """The planner from ``PDCTL_PLAN_*`` and the profile at ``PDCTL_PLAN_PROFILE`` or
        ``./pdctl-profile.json``; else None and what to do (:data:`HOW_TO`, or why the
        profile or a setting was refused)."""
        env = os.environ if environ is None else environ
        given = env.get(PROFILE_ENV)
        path = Path(given) if given else (cwd or Path.cwd()) / DEFAULT_PROFILE
        if not given and not path.exists():
            return None, HOW_TO
        try:
            profile = load_profile(path)
            slos, budget = settings_from(env)
        except PdctlError as e:
            return None, f"planner: {e}"
        return cls(profile, spec, str(path), slos, budget), ""


def settings_from(env: Mapping[str, str]) -> tuple[Slos, int | None]:
    """SLOs and budget from ``PDCTL_PLAN_TTFT_SLO_MS``, ``PDCTL_PLAN_ITL_SLO_MS``,
    ``PDCTL_PLAN_SLO_PCT`` and ``PDCTL_PLAN_BUDGET``."""

    def number(name: str) -> float | None:
        text = env.get(name)
        if not text:
            return None
        try:
            v = float(text)
        except ValueError:
            v = -1.0
        if v <= 0:
            raise ProfileError(f"{name}={text!r}: give a positive number")
        return v

    pct = env.get("PDCTL_PLAN_SLO_PCT", "p90")
    if pct not in ("p50", "p90", "p99"):
        raise ProfileError(f"PDCTL_PLAN_SLO_PCT={pct!r}: use p50, p90 or p99")
    ttft, itl, budget = (
        number("PDCTL_PLAN_TTFT_SLO_MS"),
        number("PDCTL_PLAN_ITL_SLO_MS"),
        number("PDCTL_PLAN_BUDGET"),
    )
    if budget is not None and budget != int(budget):
        raise ProfileError(f"PDCTL_PLAN_BUDGET={budget:g}: give a whole number of GPUs")
    return (
        Slos(
            ttft_s=None if ttft is None else ttft / 1e3,
            tpot_s=None if itl is None else itl / 1e3,
            pct=pct,
        ),
        None if budget is None else int(budget),
    )
