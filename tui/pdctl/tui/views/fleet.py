"""The home view: router → render → prefill → decode, one row per instance."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult

from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.tui import fmt
from pdctl.tui.views.base import Frame, View
from pdctl.tui.widgets import Cell, Column, SyncTable

ROLE_ORDER = {"router": 0, "render": 1, "prefill": 2, "colocated": 2, "decode": 3}
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


def ordered(instances: Sequence[InstanceMetrics]) -> list[InstanceMetrics]:
    return sorted(instances, key=lambda i: ROLE_ORDER.get(i.role, 3))


class FleetView(View):
    NAME = "fleet"
    KEY = "1"
    ALIASES = ("home", "f")
    HINT = "Enter: details and log · / filter (role:decode, health:DOWN) · Ctrl+P actions"

    def compose(self) -> ComposeResult:
        yield SyncTable(COLUMNS, id="fleet-table")

    @property
    def table(self) -> SyncTable:
        return self.query_one(SyncTable)

    def show(self, frame: Frame) -> None:
        u, h = frame.update, frame.history
        snap = u.snapshot
        routed = {i.name: i for i in u.router.instances} if u.router else {}
        rows: list[tuple[str, Sequence[Cell]]] = []
        for i in ordered(snap.instances):
            r = routed.get(i.name)
            proc = u.fleet.get(i.name) if u.fleet else None
            fields = {
                "instance": i.name,
                "role": i.role,
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
            rows.append(
                (
                    i.name,
                    (
                        Text(TREE.get(i.role, "  ") + i.name),
                        Text(i.role, style=ROLE_STYLE.get(i.role, "")),
                        i.url.removeprefix("http://"),
                        fmt.health(i.health, drained=bool(r and r.drained)),
                        fmt.process(proc.state, proc.restarts, proc.next_restart_in_s)
                        if proc
                        else "-",
                        load,
                        fmt.pct(i.kv_usage),
                        fmt.ms_pair(i.ttft.p50, i.ttft.p99),
                        fmt.ms(i.itl.p50),
                        fmt.num(i.request_rate, 2),
                        fmt.count(inflight),
                        fmt.size(i.transfers.bytes_total),
                        fmt.spark(h.series(i.name, "req_rate"), 12),
                        cache_cell(r.kv_index, r.prefix_hit_rate) if r else fmt.DASH,
                    ),
                )
            )
        self.table.sync(rows)

    def selected_instance(self) -> str | None:
        return self.table.selected_key()
