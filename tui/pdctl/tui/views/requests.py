"""The router's flight recorder: recent requests with a timeline bar each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from pdctl.tui import fmt
from pdctl.tui.views.base import Frame, View
from pdctl.tui.widgets import Cell, Column, SyncTable

BAR = 24
MIN_ROWS = 20
"""Rows shown: the newest that fit on screen (at least this many); a filter searches
every request the router returned."""
COLUMNS = (
    Column("id", "request", 8),
    Column("d", "decode", 10),
    Column("outcome", "outcome", 9),
    Column("ttfb", "TTFT ms", 7),
    Column("total", "end ms", 6),
    Column("bar", "timeline", BAR),
    Column("p", "prefill", 12, wide=1),
    Column("error", "error", 40, wide=2),
)
NO_ROUTER = "no router in this fleet: the flight recorder lives in pdctl's router"


class RequestsView(View):
    NAME = "requests"
    KEY = "5"
    ALIASES = ("req", "flight", "q")
    HINT = "Enter: where the TTFT went · / filters: outcome:error · instance:decode-0"

    def on_mount(self) -> None:
        self._by_id: dict[str, dict[str, Any]] = {}

    def compose(self) -> ComposeResult:
        yield Static(fmt.legend(), id="req-legend", classes="note")
        yield SyncTable(COLUMNS, id="req-table")

    def show(self, frame: Frame) -> None:
        reqs = frame.update.requests
        legend = self.query_one("#req-legend", Static)
        if reqs is None:
            legend.update(Text(NO_ROUTER, style="yellow"))
            self.query_one(SyncTable).sync([])
            return
        legend.update(fmt.legend())
        shown = [
            r
            for r in reqs
            if frame.filter.matches(
                {
                    "instance": f"{r.get('prefill') or ''} {r.get('decode') or ''}",
                    "outcome": r.get("outcome"),
                    "id": r.get("id"),
                    "mode": r.get("mode"),
                    "error": r.get("error"),
                }
            )
        ]
        shown = shown[: max(MIN_ROWS, self.size.height)]  # a screenful of the newest
        self._by_id = {str(r.get("id")): r for r in shown}
        scale = max((r.get("done_ms") or 0.0 for r in shown), default=0.0)
        rows: list[tuple[str, Sequence[Cell]]] = []
        for r in shown:
            outcome = str(r.get("outcome"))
            rid = str(r.get("id"))
            rows.append(
                (
                    rid,
                    (
                        rid.removeprefix("pdctl-")[-8:],
                        r.get("decode") or "-",
                        Text(outcome, style=fmt.OUTCOME_STYLE.get(outcome, "")),
                        _ms(r.get("ttft_ms", r.get("decode_first_byte_ms"))),
                        _ms(r.get("done_ms")),
                        fmt.timeline_bar(r, scale, BAR),
                        r.get("prefill") or "-",
                        (r.get("error") or "")[:60],
                    ),
                )
            )
        self.query_one(SyncTable).sync(rows)

    def selected_request(self) -> dict[str, Any] | None:
        return self._by_id.get(self.query_one(SyncTable).selected_key() or "")

    def selected_instance(self) -> str | None:
        """The decode instance of the request under the cursor (its prefill if none)."""
        r = self.selected_request()
        return None if r is None else (r.get("decode") or r.get("prefill"))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"
