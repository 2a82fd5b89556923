"""TTFT, ITL, TPOT and end-to-end latency per instance, with history for the one under
the cursor (or the fleet's front end)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Sparkline, Static

from pdctl.sdk.metrics import coverage_of
from pdctl.sdk.metrics.derive import Latency
from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.sdk.router.bottleneck import PairVerdict, matrix, verdicts
from pdctl.tui import fmt
from pdctl.tui.history import History
from pdctl.tui.views.base import Frame, View
from pdctl.tui.widgets import Cell, Cells, Column, SyncTable

COLUMNS = (
    Column("name", "instance", 16),
    Column("ttft", "TTFT p50/99", 11),
    Column("itl", "ITL p50/99", 11),
    Column("tpot", "TPOT p50/99", 11),
    Column("e2e", "e2e p50/99", 11),
    Column("n", "requests", 8, wide=1),
    Column("trend", "TTFT p50 trend", 14, wide=2),
)
PANELS: tuple[tuple[str, str, Callable[[InstanceMetrics], Latency]], ...] = (
    ("ttft", "TTFT", lambda i: i.ttft),
    ("itl", "ITL", lambda i: i.itl),
    ("tpot", "TPOT", lambda i: i.tpot),
    ("e2e", "e2e", lambda i: i.e2e),
)


WIDE = 120
"""Narrower: each pair's verdict without its numbers, and no P→D matrix (the rendezvous
view has the pairs' table)."""
MATRIX_MAX = 8
"""More prefills or decodes than this: no P→D matrix, a line that says so (it would not
fit the screen, push the table off it and cost a large fleet's every update a layout of
hundreds of wrapped cells; each pair's verdict is in the lines above it)."""
NO_SPLIT = "TTFT split: no disaggregated request through pdctl's router in the window"


def _label(name: str, lat: Latency) -> str:
    return f"{name} p50 {fmt.ms(lat.p50)} · p99 {fmt.ms(lat.p99)} ms"


def _cells(i: InstanceMetrics, h: History) -> tuple[Cell, ...]:
    """One instance's row (column order)."""
    return (
        i.name,
        fmt.ms_pair(i.ttft.p50, i.ttft.p99),
        fmt.ms_pair(i.itl.p50, i.itl.p99),
        fmt.ms_pair(i.tpot.p50, i.tpot.p99),
        fmt.ms_pair(i.e2e.p50, i.e2e.p99),
        fmt.count(i.e2e.count),
        fmt.spark(h.series(i.name, "ttft_p50"), 12),
    )


def _matrix(found: list[PairVerdict]) -> Table | Text:
    """The P→D matrix of the pairs, or (more than :data:`MATRIX_MAX` prefills or
    decodes) a line that says why it is not drawn."""
    prefills, decodes, cells = matrix(found)
    if len(prefills) <= MATRIX_MAX and len(decodes) <= MATRIX_MAX:
        return fmt.pair_matrix(prefills, decodes, cells)
    return Text(
        f"P→D matrix: {len(prefills)} prefills by {len(decodes)} decodes, more than "
        f"{MATRIX_MAX} of either: not drawn (each pair's verdict is above; the rendezvous "
        "view has the pairs' table)",
        style="dim",
    )


class LatencyView(View):
    NAME = "latency"
    KEY = "4"
    ALIASES = ("lat", "l")
    HINT = "history follows the row under the cursor; per pair: the TTFT split and what dominates"

    def compose(self) -> ComposeResult:
        with Grid(id="lat-grid"):  # two panels per row: labels above their sparklines
            for pair in (PANELS[:2], PANELS[2:]):
                for key, _, _ in pair:
                    yield Static(id=f"lat-{key}-label", classes="spark-label")
                for key, _, _ in pair:
                    yield Sparkline([], id=f"lat-{key}", summary_function=max)
        yield SyncTable(COLUMNS, id="lat-table")
        yield Static(id="lat-split", classes="note")
        yield Static(id="lat-matrix", classes="note")

    def on_resize(self) -> None:
        """The verdicts' layout depends on the width: redraw the last frame at the new one
        (a view shown for the first time is drawn before it has a size)."""
        last = getattr(self, "_last", None)
        if last is not None:
            self.show(last)

    def show(self, frame: Frame) -> None:
        self._last = frame
        snap, h = frame.update.snapshot, frame.history
        insts = sorted(  # the front end (what clients see) first
            (
                i
                for i in snap.instances
                if i.role != "router"
                and frame.filter.matches({"instance": i.name, "role": i.role, "health": i.health})
            ),
            key=lambda i: i.role == "prefill",
        )
        # drawn when near the screen (a page of 500 rows, not 500)
        rows: list[tuple[str, Cells]] = [(i.name, partial(_cells, i, h)) for i in insts]
        table = self.query_one(SyncTable)
        table.sync(rows)
        focus = self._focus(insts, table.selected_key())
        for key, name, get in PANELS:
            label = self.query_one(f"#lat-{key}-label", Static)
            spark = self.query_one(f"#lat-{key}", Sparkline)
            if focus is None:
                label.update(f"{name}: no instance")
                spark.data = []
                continue
            label.update(f"{focus.name} " + _label(name, get(focus)))
            spark.data = h.series(focus.name, f"{key}_p50")
        split = Text()
        wide = self.size.width >= WIDE
        found = {(v.prefill, v.decode): v for v in verdicts(frame.update.requests or (),
                                                            frame.expected_bps)}  # fmt: skip
        for pair in snap.pairs:
            if pair.segments:
                split.append(f"{pair.prefill} → {pair.decode}  ", style="bold")
                split.append_text(fmt.ttft_split(pair.segments))
                split.append("\n")
                v = found.get((pair.prefill, pair.decode))
                if v is not None:
                    split.append_text(fmt.bottleneck(v, numbers=wide))
                    split.append("\n")
        split.rstrip()
        gap = coverage_of(snap).note("ttft_split")
        if gap is not None:  # the router's segments only: say what is missing and why
            split = Text.assemble(split if split.plain else NO_SPLIT, "\n", (gap, "yellow"))
        self.query_one("#lat-split", Static).update(split if split.plain else NO_SPLIT)
        matrix = self.query_one("#lat-matrix", Static)
        show = wide and len(found) > 1
        matrix.update(_matrix(list(found.values())) if show else "")
        matrix.display = show

    @staticmethod
    def _focus(insts: list[InstanceMetrics], selected: str | None) -> InstanceMetrics | None:
        for i in insts:
            if i.name == selected:
                return i
        return insts[0] if insts else None

    def selected_instance(self) -> str | None:
        return self.query_one(SyncTable).selected_key()
