"""The home view: router → render → prefill → decode, one row per instance, or grouped
(by role, group or host) with the outliers first on a large fleet."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from pdctl.sdk.client import RoutedInstance
from pdctl.sdk.fleet import InstanceStatus
from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.tui import fmt
from pdctl.tui.history import History
from pdctl.tui.views.base import Frame, View
from pdctl.tui.views.fleetlayout import (
    Arrangement,
    Row,
    group_of,
    group_of_key,
    host_of,
    instance_of,
    plan,
)
from pdctl.tui.widgets import Cell, Column, SyncTable

ROLE_STYLE = {
    "router": "bold",
    "render": "green",
    "prefill": "cyan",
    "decode": "magenta",
    "colocated": "blue",
}
TREE = {"router": "◆ ", "render": "├ ", "prefill": "├ ", "colocated": "├ ", "decode": "└ "}

COLUMNS = (
    Column("name", "instance", 16),
    Column("role", "role", 8, wide=5),
    Column("endpoint", "endpoint", 22, wide=6),
    Column("health", "health", 10),
    Column("state", "process", 11, wide=4),
    Column("load", "run/wait", 8),
    Column("kv", "KV", 4),
    Column("ttft", "TTFT p50/99", 11),
    Column("itl", "ITL p50", 7),
    Column("rate", "req/s", 6),
    Column("inflight", "in flight", 9, wide=2),
    Column("moved", "KV moved", 10, wide=1),
    Column("trend", "req/s trend", 14, wide=3),
    Column("cache", "KV index", 14, wide=7),
)


def cache_cell(state: str | None, hit: float | None) -> Cell:
    """cache_aware: the instance's KV index state and the share of routed prompt blocks
    it held ("-" with other policies)."""
    if state is None:
        return fmt.DASH
    style = {"EXACT": "green", "DEGRADED": "yellow"}.get(state, "dim")
    return Text(f"{state} {fmt.pct(hit)}", style=style)


def draw(
    i: InstanceMetrics,
    r: RoutedInstance | None,
    proc: InstanceStatus | None,
    load: Cell,
    inflight: float | None,
    h: History,
) -> tuple[Cell, ...]:
    """One instance's cells (column order)."""
    return (
        Text(TREE.get(i.role, "  ") + i.name),
        Text(i.role, style=ROLE_STYLE.get(i.role, "")),
        i.url.removeprefix("http://"),
        fmt.health(i.health, drained=bool(r and r.drained)),
        fmt.process(proc.state, proc.restarts, proc.next_restart_in_s) if proc else "-",
        load,
        fmt.pct(i.kv_usage),
        fmt.ms_pair(i.ttft.p50, i.ttft.p99),
        fmt.ms(i.itl.p50),
        fmt.num(i.request_rate, 2),
        fmt.count(inflight),
        fmt.size(i.transfers.bytes_total),
        fmt.spark(h.series(i.name, "req_rate"), 12),
        cache_cell(r.kv_index, r.prefix_hit_rate) if r else fmt.DASH,
    )


class FleetView(View):
    NAME = "fleet"
    KEY = "1"
    ALIASES = ("home", "f")
    HINT = (
        "Enter: details (on a group: open/close) · g group · s/S sort · / filter "
        "(role:decode group:decode-b host:10.0.0.7) · Ctrl+P actions"
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("g", "regroup", "group", show=False),
        Binding("s", "sort", "sort", show=False),
        Binding("S", "reverse", "reverse", show=False),
    ]

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.arrangement = Arrangement()
        self._frame: Frame | None = None
        self._rows: list[Row] = []
        """The frame's instances, drawn once: a key that only rearranges them (group,
        sort, open a group) reuses them and the cells already drawn."""
        self._count = 0

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-status", classes="status")
        yield SyncTable(COLUMNS, id="fleet-table")

    def on_mount(self) -> None:
        self.query_one("#fleet-status", Static).display = False

    @property
    def table(self) -> SyncTable:
        return self.query_one(SyncTable)

    def rows(self, frame: Frame) -> list[Row]:
        """Every instance the filter lets through, drawn."""
        u, h = frame.update, frame.history
        snap = u.snapshot
        routed = {i.name: i for i in u.router.instances} if u.router else {}
        out: list[Row] = []
        for i in snap.instances:
            r = routed.get(i.name)
            proc = u.fleet.get(i.name) if u.fleet else None
            fields = {
                "instance": i.name,
                "role": i.role,
                "group": group_of(i.name),
                "host": host_of(i.url),
                "health": i.health,
                "endpoint": i.url,
                "state": proc.state if proc else None,
                "drained": "drained" if r and r.drained else None,
            }
            if not frame.filter.matches(fields):
                continue
            if i.role == "router":
                inflight = sum(x.in_flight for x in u.router.instances) if u.router else None
                mode = (u.router.mode if u.router else None) or (snap.router or {}).get("mode")
                load: Cell = Text(mode or "-", style="bold")
            else:
                inflight = r.in_flight if r else None
                load = f"{fmt.count(i.running)}/{fmt.count(i.waiting)}"
            running = None if proc is None else proc.state == "running"
            flight = None if inflight is None else float(inflight)
            out.append(Row(i, partial(draw, i, r, proc, load, inflight, h), flight, running))
        return out

    def show(self, frame: Frame) -> None:
        if frame is not self._frame:
            self._frame, self._rows = frame, self.rows(frame)
        rows = self._rows
        self._count = len(rows)
        p = plan(rows, self.arrangement, partial(frame.history.series, figure="req_rate"))
        status = self.query_one("#fleet-status", Static)
        status.display = p.grouping != "none" or self.arrangement.sort is not None
        if status.display:
            line = f"{len(rows)} instances · {self.arrangement.describe(len(rows))}"
            if p.outliers:
                line += f" · {p.outliers} outlier(s) first (!)"
            if p.grouping != "none":
                line += " · groups: sums, the largest KV and TTFT p99, the median p50s"
            status.update(Text(line, style="dim"), layout=False)  # one line high
        self.table.sync(p.rows, fallback=p.fallback)

    def _redraw(self, arrangement: Arrangement) -> None:
        self.arrangement = arrangement
        if self._frame is not None:
            self.show(self._frame)

    def action_regroup(self) -> None:
        self._redraw(self.arrangement.next_grouping(self._count))

    def action_sort(self) -> None:
        self._redraw(self.arrangement.next_sort([c.key for c in COLUMNS]))

    def action_reverse(self) -> None:
        self._redraw(replace(self.arrangement, descending=not self.arrangement.descending))

    @on(DataTable.RowSelected)
    def _toggle_group(self, event: DataTable.RowSelected) -> None:
        group = group_of_key(self.table.selected_key())
        if group is None:
            return  # an instance: the screen drills down
        event.stop()
        self._redraw(self.arrangement.toggled(group))

    def selected_instance(self) -> str | None:
        return instance_of(self.table.selected_key())
