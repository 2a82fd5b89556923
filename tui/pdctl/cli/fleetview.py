"""Rich rendering of a fleet's instances, shared by up, status and demo."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdctl.cli.common import STATE_STYLE, fmt_duration

if TYPE_CHECKING:
    from rich.table import Table

    from pdctl.sdk.fleet import FleetEvent, InstanceStatus


@dataclass
class Row:
    name: str
    role: str
    url: str
    state: str = "pending"
    pid: int | None = None
    since: float | None = None
    note: str = ""
    code: int | None = None


@dataclass
class FleetView:
    """Instance rows kept current from lifecycle events."""

    rows: dict[str, Row] = field(default_factory=dict)

    @classmethod
    def from_plan(cls, instances: Iterable[tuple[str, str, str]]) -> FleetView:
        return cls({n: Row(n, r, u) for n, r, u in instances})

    def apply(self, ev: FleetEvent) -> None:
        row = self.rows.get(ev.instance or "")
        if row is None:
            return
        kind = ev.kind
        if kind == "starting":
            row.state, row.since, row.note = "starting", ev.at, ev.message
            if ev.message.startswith("pid "):
                row.pid = int(ev.message.split()[1])
        elif kind in ("ready", "restarted"):
            row.state, row.note = "ready", ev.message
        elif kind == "exited":
            row.state, row.code = "exited", ev.code
            row.note = ev.log_tail[-1] if ev.log_tail else ev.message
        elif kind in ("stopping", "restarting"):
            row.state, row.note = "stopping", f"{kind} {ev.message}".strip()
        elif kind == "stopped":
            row.state, row.note = "stopped", ""
        elif kind == "unhealthy":
            row.state, row.note = "unhealthy", ev.message
        elif kind == "backoff":
            row.state, row.note = "backoff", ev.message
        elif kind == "gave-up":
            row.state, row.note = "failed", ev.message

    def table(self, title: str = "") -> Table:

        t = _table(title)
        for col in ("instance", "role", "endpoint", "state", "pid", "up", "note"):
            t.add_column(col, no_wrap=col != "note", overflow="fold")
        now = time.time()
        for r in self.rows.values():
            state = r.state if r.code is None else f"{r.state} ({r.code})"
            t.add_row(
                r.name,
                r.role,
                _endpoint(r.url),
                f"[{STATE_STYLE.get(r.state, 'white')}]{state}[/]",
                str(r.pid or "-"),
                fmt_duration(now - r.since) if r.since and r.state != "stopped" else "-",
                r.note[:80],
            )
        return t


def status_table(items: Iterable[InstanceStatus], title: str = "") -> Table:

    t = _table(title)
    for col in ("instance", "role", "endpoint", "state", "pid", "up", "restarts"):
        t.add_column(col, no_wrap=True)
    now = time.time()
    policies: dict[str, list[str]] = {}
    for s in items:
        state = s.state if s.exit_code is None else f"{s.state} ({s.exit_code})"
        if s.next_restart_in_s is not None:
            state += f" {s.next_restart_in_s:.0f}s"
        restarts = str(s.restarts)
        if s.last_restart_at is not None:
            restarts += f", {fmt_duration(now - s.last_restart_at)} ago"
        t.add_row(
            s.name,
            s.role,
            _endpoint(s.url),
            f"[{STATE_STYLE.get(s.state, 'white')}]{state}[/]",
            str(s.pid or "-"),
            fmt_duration(s.uptime_s),
            restarts,
        )
        if s.restart_policy:
            policies.setdefault(s.restart_policy, []).append(s.name)
    if policies:
        lines = [
            f"restart policy: {p}" + ("" if len(policies) == 1 else f" ({', '.join(names)})")
            for p, names in policies.items()
        ]
        t.caption = "\n".join(lines)
        t.caption_justify = "left"
    return t


def _table(title: str) -> Table:
    from rich import box
    from rich.table import Table

    return Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def _endpoint(url: str) -> str:
    return url.removeprefix("http://")
