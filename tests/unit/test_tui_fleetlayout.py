"""The fleet table's layout for large fleets (pure): grouping, aggregate rows, sorting by
any column, outliers first, where the cursor goes when a group closes; and the same
driven through the running UI on a replayed fleet above the grouping threshold."""

from __future__ import annotations

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.sdk.metrics.derive import Latency
from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.tui import fmt
from pdctl.tui.history import History
from pdctl.tui.views.fleet import COLUMNS
from pdctl.tui.views.fleetlayout import (
    AUTO_GROUP_AT,
    GROUP_PREFIX,
    OUTLIER_PREFIX,
    Arrangement,
    Row,
    aggregate,
    group_of,
    host_of,
    instance_of,
    outliers,
    plan,
    sort_rows,
    subjects,
)
from pdctl.tui.widgets import Cell
from tests.unit import tui_support

clock = tui_support.clock


def row(
    name: str,
    role: str = "decode",
    host: str = "10.0.0.1",
    *,
    health: str = "UP",
    ttft99: float | None = 0.1,
    waiting: float | None = 0.0,
    kv: float | None = 0.2,
    rate: float | None = 1.0,
    inflight: float | None = 2.0,
) -> Row:
    m = InstanceMetrics(
        name=name,
        role=role,
        url=f"http://{host}:8200",
        health=health,
        ttft=Latency(p50=0.05, p99=ttft99),
        waiting=waiting,
        running=1.0,
        kv_usage=kv,
        request_rate=rate,
    )
    cells: tuple[Cell, ...] = tuple(f"{name}:{c.key}" for c in COLUMNS)
    return Row(m, lambda: cells, inflight)


def test_a_closed_group_draws_none_of_its_members() -> None:
    drawn: list[str] = []

    def lazy(name: str) -> Row:
        r = row(name)

        def draw() -> tuple[Cell, ...]:
            drawn.append(name)
            return r.cells

        return Row(r.metrics, draw, r.in_flight)

    members = [lazy(f"decode-{i}") for i in range(100)]
    plan(members, Arrangement(grouping="role"))
    assert drawn == []
    opened = plan(members, Arrangement(grouping="role", expanded=frozenset({"decode"})))
    assert drawn == []  # the members' rows are drawn by the table, when near the screen
    for _, cells in opened.rows:
        if callable(cells):
            cells()
    assert sorted(drawn) == sorted(m.name for m in members)


def test_group_and_host_come_from_the_name_and_the_url() -> None:
    assert group_of("decode-b-3") == "decode-b"
    assert group_of("decode-12") == "decode"
    assert group_of("router") == "router"
    assert group_of("fast-decode") == "fast-decode"  # no index: its own group
    assert host_of("http://10.0.0.7:8200") == "10.0.0.7"
    assert host_of("http://[fd00::7]:8200/v1") == "[fd00::7]"
    assert host_of("http://node-3.cluster.local") == "node-3.cluster.local"


def test_role_order_then_natural_names_then_any_column_either_way() -> None:
    rows = [row("decode-10"), row("decode-2"), row("prefill-1", "prefill"), row("router", "router")]
    assert [r.name for r in sort_rows(rows, Arrangement())] == [
        "router", "prefill-1", "decode-2", "decode-10",
    ]  # fmt: skip
    rows = [row("d-0", ttft99=0.3), row("d-1", ttft99=None), row("d-2", ttft99=0.9)]
    down = sort_rows(rows, Arrangement(sort="ttft"))
    up = sort_rows(rows, Arrangement(sort="ttft", descending=False))
    assert [r.name for r in down] == ["d-2", "d-0", "d-1"]  # unknown last either way
    assert [r.name for r in up] == ["d-0", "d-2", "d-1"]
    for c in COLUMNS:  # every column sorts without raising, text or number
        assert len(sort_rows(rows, Arrangement(sort=c.key))) == 3


def test_sort_cycles_through_every_column_and_back_to_role_order() -> None:
    a = Arrangement()
    seen = []
    for _ in range(len(COLUMNS) + 1):
        a = a.next_sort([c.key for c in COLUMNS])
        seen.append(a.sort)
    assert seen == [*(c.key for c in COLUMNS), None]


def test_grouping_is_automatic_from_the_threshold_and_cycles() -> None:
    a = Arrangement()
    assert a.resolved(AUTO_GROUP_AT - 1) == "none"
    assert a.resolved(AUTO_GROUP_AT) == "role"
    b = a.next_grouping(AUTO_GROUP_AT)
    assert b.grouping == "group"
    assert b.next_grouping(0).grouping == "host"
    assert b.next_grouping(0).next_grouping(0).grouping == "none"
    assert a.toggled("decode").expanded == {"decode"}
    assert a.toggled("decode").toggled("decode").expanded == frozenset()


def test_outliers_the_down_first_then_the_worst_of_each_kind_and_none_when_uniform() -> None:
    uniform = [row(f"decode-{i}") for i in range(6)]
    assert outliers(uniform) == []
    rows = [
        *uniform,
        row("decode-7", health="DOWN"),
        row("decode-8", ttft99=2.0, waiting=9.0),
        row("decode-9", kv=0.97),
        row("router", "router", health="DOWN"),  # the router is not an engine outlier
    ]
    got = {r.name: why for r, why in outliers(rows, per_kind=1)}
    assert list(got) == ["decode-7", "decode-8", "decode-9"]
    assert got["decode-8"] == "TTFT p99, queue"
    assert got["decode-9"] == "KV"


def test_an_aggregate_sums_what_adds_and_takes_the_worst_of_the_rest() -> None:
    members = [
        row("decode-0", kv=0.2, ttft99=0.1, rate=1.5, inflight=3),
        row("decode-1", kv=0.9, ttft99=0.4, rate=2.5, inflight=None, health="DOWN"),
        row("decode-2", host="10.0.0.2", kv=None, ttft99=None, rate=None, inflight=1),
    ]
    drawn = aggregate("decode", members, False, (1.0, 3.0, 2.0))
    cells = dict(zip([c.key for c in COLUMNS], drawn, strict=True))
    assert str(cells["name"]) == "▸ decode (3)"
    assert str(cells["health"]) == "2/3 UP"
    assert cells["endpoint"] == "2 hosts"
    assert cells["kv"] == "90%"
    assert cells["rate"] == "4.00"
    assert cells["inflight"] == "4"
    assert cells["load"] == "3/0"
    assert str(cells["ttft"]).endswith("/400")
    assert cells["trend"] == fmt.spark([1.0, 3.0, 2.0], 12)


def test_a_groups_trend_is_the_history_of_its_members_summed_request_rate() -> None:
    from pdctl.sdk.metrics.monitor import Snapshot, Summary

    h = History(groups=subjects)
    rows = [row("decode-0", rate=1.0), row("decode-1", rate=2.5, host="10.0.0.2")]
    rows.append(row("decode-2", rate=4.0, health="DOWN"))  # not UP: not in the sum
    for _ in range(2):
        h.record(Snapshot(0.0, 1.0, tuple(r.metrics for r in rows), {}, (), None, (), Summary()))
    assert h.series("role:decode", "req_rate") == [3.5, 3.5]
    assert h.series("host:10.0.0.2", "req_rate") == [2.5, 2.5]
    assert h.series("group:decode", "req_rate") == [3.5, 3.5]
    got = plan(rows, Arrangement(grouping="role"), lambda s: h.series(s, "req_rate"))
    group = dict(got.rows)[GROUP_PREFIX + "decode"]
    assert isinstance(group, tuple)  # a group's row is drawn at once
    cells = dict(zip([c.key for c in COLUMNS], group, strict=True))
    assert cells["trend"] == fmt.spark([3.5, 3.5], 12)


def test_a_plan_groups_opens_only_what_is_expanded_and_knows_where_the_cursor_goes() -> None:
    rows = [row("router", "router")]
    rows += [row(f"prefill-{i}", "prefill", f"10.0.1.{i % 2}") for i in range(4)]
    rows += [row(f"decode-{i}", "decode", f"10.0.2.{i % 3}") for i in range(6)]
    rows.append(row("decode-6", health="DOWN"))
    closed = plan(rows, Arrangement(grouping="role"))
    keys = [k for k, _ in closed.rows]
    assert keys == [
        OUTLIER_PREFIX + "decode-6",
        "router",
        GROUP_PREFIX + "prefill",
        GROUP_PREFIX + "decode",
    ]
    assert closed.outliers == 1
    assert instance_of(keys[0]) == "decode-6"
    assert instance_of(GROUP_PREFIX + "decode") is None
    assert closed.fallback["decode-3"] == GROUP_PREFIX + "decode"
    opened = plan(rows, Arrangement(grouping="role", expanded=frozenset({"decode"})))
    keys = [k for k, _ in opened.rows]
    assert keys[keys.index(GROUP_PREFIX + "decode") + 1 :] == [f"decode-{i}" for i in range(7)]
    by_host = plan(rows, Arrangement(grouping="host"))
    hosts = [k for k, _ in by_host.rows if k.startswith(GROUP_PREFIX)]
    assert hosts == [
        GROUP_PREFIX + h
        for h in ("10.0.0.1", "10.0.1.0", "10.0.1.1", "10.0.2.0", "10.0.2.1", "10.0.2.2")
    ]
    flat = plan(rows, Arrangement(grouping="none"))
    assert [k for k, _ in flat.rows] == [r.name for r in sort_rows(rows, Arrangement())]


async def test_a_large_fleet_opens_grouped_and_the_keys_drive_it(clock):
    from pdctl.tui.app import PdctlApp
    from pdctl.tui.widgets import SyncTable
    from tests.unit.tui_support import replay, settled

    src = replay(clock, prefills=AUTO_GROUP_AT // 2, decodes=AUTO_GROUP_AT // 2)
    src.down.add("decode-n2-5")
    decodes = sorted(
        (i.name for i in src.plan.instances if i.role == "decode"), key=lambda n: n.split("-")
    )
    app = PdctlApp(src, rounds=3)
    async with app.run_test(size=(160, 45)) as pilot:
        main = await settled(pilot, app)
        t = main.query_one("#fleet-table", SyncTable)
        groups = [k for k in t._order if k.startswith(GROUP_PREFIX)]
        assert groups == [GROUP_PREFIX + "prefill", GROUP_PREFIX + "decode"]
        assert t._order[0] == OUTLIER_PREFIX + "decode-n2-5"  # the stopped one, first
        assert "grouped by role" in str(main.query_one("#fleet-status").render())
        # open the decode group with Enter: its members follow its row, in name order
        t.move_cursor(row=t._order.index(GROUP_PREFIX + "decode"))
        await pilot.press("enter")
        await pilot.pause()
        at = t._order.index(GROUP_PREFIX + "decode")
        assert t._order[at + 1 :] == decodes
        # the cursor on a member; closing the group brings it to the group's row
        t.move_cursor(row=t._order.index(decodes[3]))
        assert main.view.selected_instance() == decodes[3]
        t.move_cursor(row=at)
        await pilot.press("enter")
        await pilot.pause()
        assert decodes[3] not in t._order
        assert t.selected_key() == GROUP_PREFIX + "decode"
        assert main.view.selected_instance() is None
        # g: by spec group (one per host here), s: sorted by the first column
        await pilot.press("g", "s")
        await pilot.pause()
        status = str(main.query_one("#fleet-status").render())
        assert "grouped by group · sorted by name" in status
        groups = [k for k in t._order if k.startswith(GROUP_PREFIX)]
        assert len(groups) == 8  # four hosts of eight per role
        assert groups[0] == GROUP_PREFIX + "prefill-n0"
        await pilot.press("g", "g")  # by host, then one row per instance
        await pilot.pause()
        flat = [k for k in t._order if not k.startswith((GROUP_PREFIX, OUTLIER_PREFIX))]
        assert len(flat) == AUTO_GROUP_AT + 1  # and the router
        assert "one row per instance" in str(main.query_one("#fleet-status").render())
