"""The terminal UI driven headless (Pilot) against the SDK fed with recorded vLLM
payloads: views, navigation, filtering, drill-down and the degraded small layout."""

from __future__ import annotations

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.tui import fmt
from pdctl.tui.app import PdctlApp
from pdctl.tui.dialogs import HelpScreen
from pdctl.tui.screens.instance import InstanceScreen
from pdctl.tui.views.rendezvous import ABSENT
from pdctl.tui.views.requests import MIN_ROWS
from pdctl.tui.widgets import SyncTable
from tests.unit import tui_support
from tests.unit.tui_support import on_main, replay, settled, until

clock = tui_support.clock

ROUNDS = 5


def table(app: PdctlApp, sel: str) -> SyncTable:
    return app.main.query_one(sel, SyncTable)


def cells(t: SyncTable, key: str) -> dict[str, str]:
    row = t.get_row(key)
    return {str(c.key.value): str(v) for c, v in zip(t.ordered_columns, row, strict=True)}


async def test_fleet_view_shows_router_prefill_decode_from_the_sdk(clock):
    app = PdctlApp(replay(clock), rounds=ROUNDS)
    async with app.run_test(size=(160, 40)) as pilot:
        main = await settled(pilot, app)
        t = table(app, "#fleet-table")
        assert t._order == ["router", "prefill-0", "decode-0"]
        snap = main.latest.snapshot if main.latest else None
        assert snap is not None
        d = snap.instance("decode-0")
        row = cells(t, "decode-0")
        # recorded decode TTFT p50 is 40 ms (its buckets), shown as the SDK computed it
        assert row["ttft"] == fmt.ms_pair(d.ttft.p50, d.ttft.p99) == f"40/{fmt.ms(d.ttft.p99)}"
        assert row["health"] == "UP"
        assert row["load"] == f"{d.running:.0f}/{d.waiting:.0f}"
        assert row["rate"] == f"{d.request_rate:.2f}"
        assert d.request_rate
        assert d.request_rate > 0  # counters moved, one second per round
        assert cells(t, "router")["load"] == "push"
        moved = cells(t, "prefill-0")["moved"]
        assert moved == fmt.size(snap.instance("prefill-0").transfers.bytes_total)
        assert moved.endswith("MiB")
        summary = str(main.query_one("#summary").render())
        assert "KV moved" in summary
        assert fmt.size(snap.summary.kv_bytes_moved) in summary
        assert main.history.series("decode-0", "req_rate")[-1] == d.request_rate
        assert len(main.history.series("fleet", "kv_rate")) == ROUNDS


@pytest.mark.slow  # every view, and names typed key by key
async def test_keys_switch_views_and_colon_jumps_by_name(clock):
    app = PdctlApp(replay(clock), rounds=2)
    async with app.run_test(size=(100, 30)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("3")
        assert main.current == "transfers"
        for typed, view in (("rdv", "rendezvous"), ("lat", "latency"), ("req", "requests")):
            await pilot.press("colon", *typed, "enter")
            assert main.current == view
        await pilot.press("colon", *"nonsense", "enter")
        assert main.current == "requests"
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert on_main(app)
        await pilot.press("1")
        assert main.current == "fleet"
        await pilot.press("colon", "q", "enter")
        await pilot.pause()
    assert app.return_code == 0


@pytest.mark.slow  # three filters typed key by key, each repainting the tables
async def test_filter_narrows_rows_and_escape_clears(clock):
    app = PdctlApp(replay(clock), rounds=ROUNDS)
    async with app.run_test(size=(120, 36)) as pilot:
        main = await settled(pilot, app)
        t = table(app, "#fleet-table")
        await pilot.press("slash", *"role:decode", "enter")
        assert t._order == ["decode-0"]
        assert app.focused is t  # the keys back to the table
        await pilot.press("escape")
        assert t._order == ["router", "prefill-0", "decode-0"]
        await pilot.press("5", "slash", *"outcome:error", "enter")
        reqs = table(app, "#req-table")
        assert main.latest is not None
        errors = [r for r in main.latest.requests or () if r["outcome"] == "error"]
        assert errors
        assert reqs._order == [r["id"] for r in errors]
        await pilot.press("slash", *"instance:nope-0", "enter")
        assert reqs._order == []
        await pilot.press("escape")
        newest = [r["id"] for r in main.latest.requests or ()]
        assert len(reqs._order) >= MIN_ROWS  # a screenful of the newest
        assert reqs._order == newest[: len(reqs._order)]


async def test_enter_drills_down_with_live_log_and_escape_goes_back(clock, tmp_path):
    log = tmp_path / "decode-0.log"
    log.write_text("=== pdctl: starting decode-0\nINFO engine ready\n")
    app = PdctlApp(replay(clock, logs={"decode-0": log}), rounds=2)
    async with app.run_test(size=(120, 36)) as pilot:
        await settled(pilot, app)
        t = table(app, "#fleet-table")
        t.focus()
        t.move_cursor(row=2)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, InstanceScreen)
        assert screen.instance == "decode-0"
        from textual.widgets import Log, Static

        logw = screen.query_one(Log)
        await until(pilot, lambda: logw.line_count >= 2, "the log tail")
        assert "INFO engine ready" in logw.lines
        with log.open("a") as f:
            f.write("INFO new line after opening\n")
        await until(pilot, lambda: "INFO new line after opening" in logw.lines, "a new log line")
        details = str(screen.query_one("#inst-serving", Static).render())
        assert "TTFT" in details
        assert "40.0 / " in details or "40 / " in details
        await pilot.press("escape")
        assert on_main(app)


async def test_rendezvous_without_connector_says_so_and_shows_vllm_stages(clock):
    app = PdctlApp(replay(clock), rounds=2)
    async with app.run_test(size=(120, 36)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("2")
        note = str(main.query_one("#rdv-note").render())
        assert note.replace("\n", " ").startswith(ABSENT[:40])
        stock = table(app, "#rdv-stock")
        assert stock.display
        assert stock._order == ["decode-0"]
        assert not table(app, "#rdv-prefill").display
        assert table(app, "#rdv-pairs")._order == ["prefill-0>decode-0"]


async def test_rendezvous_with_connector_series(clock):
    app = PdctlApp(replay(clock, connector=True), rounds=ROUNDS)
    async with app.run_test(size=(140, 40)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("2")
        assert not main.query_one("#rdv-note").display
        p = cells(table(app, "#rdv-prefill"), "prefill-0")
        r = main.latest.snapshot.instance("prefill-0").rendezvous if main.latest else None
        assert r is not None
        assert p["order"] == "75%"  # 3 registration-first matches per prefill-first one
        assert p["regs"] == f"{ROUNDS % 3}"
        assert p["wait"] == fmt.ms_pair(r.match_wait.p50, r.match_wait.p99)
        d = cells(table(app, "#rdv-decode"), "decode-0")
        assert d["sent"] == f"{4 * ROUNDS}"
        assert not table(app, "#rdv-stock").display


async def test_80x24_keeps_the_essential_columns_and_wide_terminals_get_more(clock):
    app = PdctlApp(replay(clock), rounds=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot, app)
        small = [str(c.key.value) for c in table(app, "#fleet-table").ordered_columns]
        assert small[:2] == ["name", "health"]
        assert {"ttft", "itl", "rate", "kv", "load"} <= set(small)
        assert "endpoint" not in small
        assert sum(c.get_render_width(table(app, "#fleet-table")) for c in
                   table(app, "#fleet-table").ordered_columns) <= 80  # fmt: skip
    app = PdctlApp(replay(clock), rounds=2)
    async with app.run_test(size=(200, 50)) as pilot:
        await settled(pilot, app)
        big = [str(c.key.value) for c in table(app, "#fleet-table").ordered_columns]
        assert {"role", "endpoint", "state", "moved", "trend"} <= set(big)


async def test_transfers_view_compares_with_the_preflight_expectation(clock):
    from tests.unit.tui_support import PREFLIGHT

    app = PdctlApp(replay(clock, preflight=PREFLIGHT), rounds=3)
    async with app.run_test(size=(180, 40)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("6")
        await until(pilot, lambda: main.preflight is not None, "the preflight report")
        from textual.widgets import Tree

        tree = main.query_one("#pf-tree", Tree)
        labels = [str(n.label) for n in tree.root.children]
        assert "verdict: OK" in labels
        await pilot.press("3")
        row = cells(table(app, "#xfer-table"), "prefill-0")
        tr = main.latest.snapshot.instance("prefill-0").transfers if main.latest else None
        assert tr is not None
        assert tr.throughput_bps
        assert row["expect"] == f"{tr.throughput_bps / PREFLIGHT['expected_throughput_bps']:.0%}"
        assert "decode-0" not in table(app, "#xfer-table")._order  # never initiates in push


async def test_preflight_view_reads_for_people_and_keeps_the_json_behind_j(clock):
    from textual.widgets import Static, Tree

    from tests.unit.test_preflight_digest import worked_example

    report = worked_example()
    app = PdctlApp(replay(clock, preflight=report), rounds=2)
    async with app.run_test(size=(80, 24)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("6")
        await until(pilot, lambda: main.preflight is not None, "the preflight report")
        await pilot.pause()
        head = str(main.query_one("#pf-head", Static).render())
        assert "DO NOT DISAGGREGATE" in head
        body = main.query_one("#pf-digest", Static)
        text = "\n".join(
            "".join(s.text for s in line) for line in body.render_lines(body.region.reset_offset)
        )
        flat = " ".join(text.split())
        for w in report["warnings"]:  # every finding: its code, evidence and fix
            assert w["code"] in flat
            evidence, _, fix = w["message"].partition(" Do: ")
            assert " ".join(evidence.split())[:40] in flat
            if fix:
                assert " ".join(fix.split())[:30] in flat
        assert "KV path per P→D pair" in flat
        assert "12.5 GB/s" in flat  # the path's expected rate
        assert "not checked" in flat
        tree = main.query_one("#pf-tree", Tree)
        assert not tree.display
        await pilot.press("j")
        assert tree.display
        assert not main.query_one("#pf-body").display
        assert "exit_code: 2" in [str(n.label) for n in tree.root.children]
        await pilot.press("j")
        assert not tree.display


async def test_preflight_missing_from_a_replay_says_so(clock):
    app = PdctlApp(replay(clock), rounds=1)
    async with app.run_test(size=(100, 30)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("6")
        await until(pilot, lambda: main.preflight is not None, "the preflight answer")
        await pilot.pause()
        assert "no preflight report" in str(main.query_one("#pf-head").render())


async def test_enter_on_a_request_opens_its_ttft_split(clock):
    from pdctl.tui.screens.flight import FlightScreen

    app = PdctlApp(replay(clock), rounds=ROUNDS)
    async with app.run_test(size=(120, 36)) as pilot:
        await settled(pilot, app)
        await pilot.press("5")
        reqs = table(app, "#req-table")
        await until(pilot, lambda: bool(reqs._order), "requests")
        reqs.focus()
        reqs.move_cursor(row=0)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, FlightScreen)
        assert screen.request["id"] == reqs._order[0]
        await pilot.press("escape")
        assert on_main(app)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_ttft_split_is_drawn_not_an_empty_frame(clock, size):
    """A width:auto frame around 1fr children collapsed to its border (6x4, nothing in
    it): the frame holds the table, and every segment name is on the screen."""
    from textual.widgets import Static

    from pdctl.tui.screens.flight import FlightScreen

    app = PdctlApp(replay(clock), rounds=ROUNDS)
    async with app.run_test(size=size) as pilot:
        await settled(pilot, app)
        await pilot.press("5")
        reqs = table(app, "#req-table")
        await until(pilot, lambda: bool(reqs._order), "requests")
        reqs.focus()
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FlightScreen)
        frame = screen.query_one("#flight")
        assert frame.size.width > 40
        assert frame.size.height > 6
        split = screen.query_one("#flight-table", Static)
        assert split.size.width > 20
        assert frame.region.contains_region(split.region)
        lines = split.render_lines(split.region.reset_offset)
        drawn = "\n".join("".join(seg.text for seg in line) for line in lines)
        names = [s["name"] for s in screen.request["segments"]]
        assert names
        for name in names:
            assert name in drawn


async def test_the_timeline_view_shows_a_restart_in_order_and_filters(clock):
    src = replay(clock)
    await src.restart("decode-0")  # before the UI starts: it reads what was kept
    app = PdctlApp(src, rounds=3)
    async with app.run_test(size=(160, 45)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("8")
        await pilot.pause()
        t = table(app, "#ev-table")
        kinds = [str(t.get_row(k)[1]) for k in t._order]
        assert kinds.index("restarted") < kinds.index("restarting") < kinds.index("control")
        main.set_filter("kind:restarted")
        await pilot.pause()
        (row,) = [t.get_row(k) for k in t._order]
        assert row[2] == "decode-0"
        main.set_filter("source:operator")
        await pilot.pause()
        assert [str(t.get_row(k)[1]) for k in t._order] == ["control"]


async def test_the_timeline_shows_the_routers_refusals_and_control_actions(clock, tmp_path):
    from pdctl.sdk.events import EventSource
    from pdctl.sdk.router.audit import AuditLog

    log = AuditLog(tmp_path / "run" / "router-audit.jsonl")
    log.record(who="-", action="GET /v1/pdctl/requests", peer="10.1.2.3:999", result=401,
               detail={"reason": "missing_key"})  # fmt: skip
    log.record(who="ops", action="POST /v1/pdctl/drain", peer="127.0.0.1:1", result=200,
               detail={"request": {"instance": "decode-0", "drain": True}})  # fmt: skip
    log.close()
    src = replay(clock)
    src.events = EventSource(tmp_path)  # the fleet's state directory, as a live fleet has
    app = PdctlApp(src, rounds=3)
    async with app.run_test(size=(160, 45)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("8")
        await pilot.pause()
        t = table(app, "#ev-table")
        rows = [[str(c) for c in t.get_row(k)] for k in t._order]
        drawn = {r[1]: " ".join(r) for r in rows}
        assert "10.1.2.3:999: 401 (missing_key)" in drawn["auth-failure"]
        assert "decode-0" in drawn["audited"]
        assert "ops via the router" in drawn["audited"]
        main.set_filter("kind:auth-failure")
        await pilot.pause()
        assert [str(t.get_row(k)[1]) for k in t._order] == ["auth-failure"]


async def test_latency_view_names_each_pairs_bottleneck_and_draws_the_matrix(clock):
    from textual.widgets import Static

    app = PdctlApp(replay(clock, prefills=2, decodes=2), rounds=ROUNDS)
    async with app.run_test(size=(160, 45)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("4")
        await pilot.pause()
        split = str(main.query_one("#lat-split", Static).render())
        # the replay's requests carry only the router's view: the prefill leg dominates
        assert "⇒ prefill leg " in split
        assert "add prefill instances" in split
        matrix = main.query_one("#lat-matrix", Static)
        assert matrix.display
        lines = matrix.render_lines(matrix.region.reset_offset)
        drawn = "\n".join("".join(seg.text for seg in line) for line in lines)
        assert "decode-1" in drawn
        assert "prefill-1" in drawn
        assert "· prefill" in drawn


def test_the_latency_views_matrix_of_many_pairs_is_a_line_that_says_why():
    """Past MATRIX_MAX prefills or decodes the P→D matrix would not fit: one line says
    so (a large fleet's every update would lay out hundreds of wrapped cells)."""
    from rich.table import Table
    from rich.text import Text

    from pdctl.sdk.router.bottleneck import PairVerdict
    from pdctl.tui.views.latency import MATRIX_MAX, _matrix

    def pairs(n: int) -> list[PairVerdict]:
        return [
            PairVerdict(f"prefill-{p}", f"decode-{p}", 10, 0, 50.0, "prefill", 0.6, "p", "a")
            for p in range(n)
        ]

    assert isinstance(_matrix(pairs(MATRIX_MAX)), Table)
    line = _matrix(pairs(MATRIX_MAX + 1))
    assert isinstance(line, Text)
    assert f"{MATRIX_MAX + 1} prefills by {MATRIX_MAX + 1} decodes" in line.plain
    assert "not drawn" in line.plain


async def test_transfers_view_shows_each_pair_with_the_source_of_each_figure(clock):
    app = PdctlApp(replay(clock, connector=True, prefills=2, decodes=2), rounds=ROUNDS)
    async with app.run_test(size=(160, 40)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("3")
        await pilot.pause()
        t = table(app, "#xfer-pairs")
        snap = main.latest.snapshot if main.latest else None
        assert snap is not None
        assert t._order == [f"{p.prefill}>{p.decode}" for p in snap.pairs]
        assert t._order == ["prefill-0>decode-0", "prefill-1>decode-1"]
        for p in snap.pairs:
            row = cells(t, f"{p.prefill}>{p.decode}")
            assert row["pair"] == f"{p.prefill} → {p.decode}"
            # the router's canary counter for this pair (the replay's synthetic results)
            c = p.canary
            assert c, "the replay's router counts canary results"
            assert row["canary"] == "/".join(
                f"{c.get(k, 0):.0f}" for k in ("match", "diverged", "tied", "error")
            )
            # the decode's own digest-check counters (every pair into it)
            rv = snap.instance(p.decode).rendezvous
            assert rv is not None
            assert rv.kv_verify is not None
            kv = rv.kv_verify
            assert row["dcheck"] == "/".join(
                f"{kv[k]:.0f}" for k in ("ok", "mismatch", "missing", "unsupported")
            )
            assert kv["ok"] > 0
            # no flight measured a push in the replay: unknown, not zero
            assert row["pushed"] == row["verify"] == "-"
        note = str(main.query_one("#xfer-pairs-note").render())
        for source in ("flights", "pdctl:kv_verify_total", "pdctl_router_canary_total"):
            assert source in note
