"""The incident timeline: every fleet event in time order (newest first), with where it
came from and who made it happen (:mod:`pdctl.sdk.events`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from pdctl.sdk.events import Event
from pdctl.tui.views.base import Frame, View
from pdctl.tui.widgets import Cell, Column, SyncTable

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "notice": "green", "info": "dim"}
COLUMNS = (
    Column("at", "time", 12),
    Column("kind", "event", 14),
    Column("subject", "about", 14),
    Column("message", "what happened", 30, grow=True),
    Column("source", "seen by", 10, wide=1),
    Column("actor", "by", 28, wide=2),
)
NO_EVENTS = (
    "no fleet events: this source keeps no journal (the fleet's state directory, "
    "written by `pdctl up`/`pdctl demo` and by watchers)"
)
MAX_ROWS = 500
"""Rows drawn: the newest (a filter searches every event this UI holds)."""


def clock(at: float) -> str:
    """Local wall time to the millisecond."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def rows(events: Sequence[Event]) -> list[tuple[str, Sequence[Cell]]]:
    out: list[tuple[str, Sequence[Cell]]] = []
    seen: dict[str, int] = {}
    for e in reversed(events):
        key = f"{e.at!r}|{e.kind}|{e.subject}"
        seen[key] = n = seen.get(key, 0) + 1
        style = SEVERITY_STYLE.get(e.severity, "")
        out.append(
            (
                f"{key}|{n}",
                (
                    clock(e.at),
                    Text(e.kind, style=style),
                    e.subject or "-",
                    e.message,
                    e.source,
                    e.actor or "",
                ),
            )
        )
    return out


class EventsView(View):
    NAME = "events"
    KEY = "8"
    ALIASES = ("timeline", "ev", "incidents")
    HINT = "newest first · / filters: kind:exited · source:router · instance:decode-0 · error"

    def compose(self) -> ComposeResult:
        yield Static(id="ev-head", classes="note")
        yield SyncTable(COLUMNS, id="ev-table")

    def show(self, frame: Frame) -> None:
        head = self.query_one("#ev-head", Static)
        if frame.events is None:
            head.update(Text(NO_EVENTS, style="yellow"))
            self.query_one(SyncTable).sync([])
            return
        shown = [
            e
            for e in frame.events
            if frame.filter.matches(
                {
                    "kind": e.kind,
                    "source": e.source,
                    "instance": e.subject,
                    "severity": e.severity,
                    "message": e.message,
                    "actor": e.actor,
                }
            )
        ]
        t = Text(f"{len(shown)} event(s)", style="bold")
        if len(shown) != len(frame.events):
            t.append(f" of {len(frame.events)}")
        if shown:
            t.append(f", since {clock(shown[0].at)}")
        worst = [e for e in shown if e.severity == "error"]
        if worst:
            t.append(f"  last error: {worst[-1].kind} {worst[-1].subject or ''}", style="bold red")
        head.update(t)
        self.query_one(SyncTable).sync(rows(shown[-MAX_ROWS:]))
