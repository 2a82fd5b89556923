"""The CLI's fleet tables: restart policy, restart count and backoff in `pdctl status`
and in the live view of `pdctl up`."""

from __future__ import annotations

import re
import time

from rich.console import Console

from pdctl.cli.fleetview import FleetView, status_table
from pdctl.sdk.fleet import FleetEvent, InstanceStatus


def render(table: object) -> str:
    c = Console(width=200, record=True, color_system=None)
    c.print(table)
    return c.export_text()


def test_status_table_shows_policy_restarts_and_backoff():
    st = InstanceStatus(
        name="prefill-0",
        role="prefill",
        url="http://127.0.0.1:8100",
        state="backoff",
        pid=None,
        exit_code=0,
        uptime_s=None,
        restarts=2,
        log="x.log",
        restart_policy="on-failure (max 5 in 300 s)",
        last_restart_at=time.time() - 30,
        next_restart_in_s=4.0,
    )
    text = render(status_table([st]))
    assert "backoff (0) 4s" in text
    assert re.search(r"2, 3\ds ago", text)
    assert "restart policy: on-failure (max 5 in 300 s)" in text


def test_live_view_follows_policy_events():
    view = FleetView.from_plan([("decode-0", "decode", "http://127.0.0.1:8200")])
    row = view.rows["decode-0"]
    view.apply(FleetEvent("exited", "decode-0", code=0, message="decode-0 exited with code 0"))
    view.apply(FleetEvent("backoff", "decode-0", code=0, message="restart 1/5 in 1 s"))
    assert (row.state, row.note) == ("backoff", "restart 1/5 in 1 s")
    view.apply(FleetEvent("gave-up", "decode-0", message="crash loop: 5 restarts in 300 s"))
    assert (row.state, row.note) == ("failed", "crash loop: 5 restarts in 300 s")
    view.apply(FleetEvent("unhealthy", "decode-0", message="/health answered 503"))
    assert row.state == "unhealthy"
