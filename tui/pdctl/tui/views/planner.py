"""The planner's recommendation for the live load, next to the current layout.

Renders the SDK's :class:`~pdctl.sdk.plan.recommend.LiveRecommendation` that the poll
worker computed (the UI thread plans nothing): the layout from the spec and the one the
planner recommends with the live correction factors applied, the live load, TTFT and ITL
p50 observed against the profile's prediction, and the planner's reason. Every number
says where it comes from.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from pdctl.sdk.plan.planner import Layout, Slos
from pdctl.sdk.plan.recommend import Figure, LiveRecommendation
from pdctl.tui import fmt
from pdctl.tui.views.base import Frame, View

DASH = fmt.DASH


def layout_words(lay: Layout) -> str:
    gpus = f"{lay.gpus} GPU{'s' if lay.gpus != 1 else ''}"
    return f"{lay.name} · TP {lay.tp} · {gpus}"


def value(fig: Figure) -> str:
    v = fig.value
    if v is None:
        return DASH
    if fig.unit == "s":
        return f"{fmt.ms(v)} ms"
    if fig.unit == "x":
        return f"x{v:.2f}"
    if fig.unit == "tokens":
        return f"{v:.0f} tokens" if v >= 10 else f"{v:.1f} tokens"
    return f"{v:.2f} {fig.unit}"


def _head(rec: LiveRecommendation) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    t.add_column(style="dim")
    t.add_row("current", layout_words(rec.current), "from the spec")
    mark = Text(layout_words(rec.recommended))
    if rec.change:
        mark.append("  ← change", style="bold yellow")
    else:
        mark.append("  = current", style="green")
    if not rec.meets:
        mark.append("  (no layout meets the SLOs)", style="red")
    where = f"{rec.profile_source}: " if rec.profile_source else ""
    t.add_row("planner", mark, f"profile {where}{rec.profile}")
    t.add_row("why", Text(rec.summary), "")
    if rec.change:
        t.add_row("", Text(f"{rec.current.name}: {rec.current_why}"), "")
    return t


def _load(rec: LiveRecommendation) -> Table:
    t = Table(title="live load", title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in ("", "value", "source", "from"):
        t.add_column(col, no_wrap=col != "from", style="bold" if not col else None)
    for label, key in (("rate", "rate"), ("ISL", "isl"), ("ISL p95", "isl_p95"), ("OSL", "osl")):
        f = rec.load[key]
        t.add_row(label, value(f), f.source, Text(f.detail, style="dim"))
    return t


def _latency(rec: LiveRecommendation) -> Table:
    t = Table(title="p50 latency", title_justify="left", box=None, padding=(0, 2, 0, 0))
    t.add_column("", style="bold", no_wrap=True)
    t.add_column(f"{rec.current.name}\nobserved", justify="right")
    t.add_column(f"{rec.current.name}\npredicted", justify="right")
    t.add_column("correction\nfactor", justify="right")
    t.add_column(f"{rec.recommended.name}\nexpected", justify="right")
    for label, key, fkey in (("TTFT", "ttft_p50", "ttft"), ("ITL", "itl_p50", "itl")):
        t.add_row(
            label,
            value(rec.observed[key]),
            value(rec.predicted[key]),
            value(rec.factors[fkey]),
            value(rec.expected[key]),
        )
    t.add_row(
        Text("source", style="dim"),
        Text(rec.observed["ttft_p50"].source, style="dim"),
        Text(rec.predicted["ttft_p50"].source, style="dim"),
        Text(rec.factors["ttft"].source, style="dim"),
        Text(rec.expected["ttft_p50"].source, style="dim"),
    )
    return t


def _details(rec: LiveRecommendation) -> Text:
    out = Text()
    for label, fig in (
        ("observed TTFT", rec.observed["ttft_p50"]),
        ("observed ITL", rec.observed["itl_p50"]),
        ("predicted", rec.predicted["ttft_p50"]),
        ("factor", rec.factors["ttft"]),
        ("expected", rec.expected["ttft_p50"]),
    ):
        out.append(f"{label}: ", style="bold")
        out.append(f"{fig.detail}\n", style="dim")
    out.append("settings: ", style="bold")
    out.append(f"{_slos(rec.slos)}; budget {rec.budget} GPUs\n", style="dim")
    for note in rec.notes:
        out.append(f"note: {note}\n", style="yellow" if "not among" in note else "dim")
    return out


def _slos(s: Slos) -> str:
    def one(name: str, v: float | None) -> str:
        return f"{name} {s.pct} ≤ {fmt.ms(v)} ms" if v is not None else f"no {name} SLO"

    return f"{one('TTFT', s.ttft_s)}, {one('TPOT', s.tpot_s)}"


class PlannerView(View):
    NAME = "plan"
    KEY = "7"
    ALIASES = ("planner", "recommend")
    HINT = "the planner's layout for the live load (PDCTL_PLAN_PROFILE or ./pdctl-profile.json)"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="plan-scroll"):
            yield Static(id="plan-body")

    def on_mount(self) -> None:
        self._shown: object = None

    def show(self, frame: Frame) -> None:
        u = frame.update
        key = (u.recommendation, u.recommendation_note)
        if key == self._shown:
            return
        self._shown = key
        body = self.query_one("#plan-body", Static)
        rec = u.recommendation
        if rec is None:
            body.update(Text(u.recommendation_note or "no recommendation yet", style="yellow"))
            return
        body.update(
            Group(
                _head(rec), Text(""), _load(rec), Text(""), _latency(rec), Text(""), _details(rec)
            )
        )
