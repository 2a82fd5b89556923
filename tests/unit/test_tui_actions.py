"""Actions from the UI: confirmation, read-only, and their effect through the SDK (the
router's real control API; the replayed fleet's stop/restart)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from textual.command import CommandList

from pdctl.tui.app import PdctlApp
from pdctl.tui.dialogs import ConfirmScreen
from pdctl.tui.screens.main import MainScreen
from pdctl.tui.widgets import SyncTable
from tests.unit import tui_support
from tests.unit.tui_support import on_main, replay, until

clock = tui_support.clock

ROUND_S = 0.3
"""The replayed fleet's rounds, far enough apart that the app is idle between them: Pilot
waits for an idle app after every key it presses (up to 1 s per key), and back-to-back
rounds never leave it idle."""


def fleet_row(main: MainScreen, key: str) -> int:
    t = main.query_one("#fleet-table", SyncTable)
    t.focus()
    row = t._order.index(key)
    t.move_cursor(row=row)
    return row


def health(main: MainScreen, key: str) -> str:
    t = main.query_one("#fleet-table", SyncTable)
    return str(t.get_cell(key, "health"))


async def live(pilot, app: PdctlApp) -> MainScreen:
    await until(pilot, lambda: app.main.applied >= 2, "a few rounds")
    return app.main


async def test_drain_asks_first_then_resume_and_the_router_follows(clock):
    src = replay(clock, interval_s=ROUND_S)
    router = src.router_core
    app = PdctlApp(src)
    async with app.run_test(size=(140, 36)) as pilot:
        main = await live(pilot, app)
        fleet_row(main, "prefill-0")
        await pilot.press("D")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert on_main(app)
        assert not router.prefills[0].drained
        await pilot.press("D")
        await pilot.press("y")
        await until(pilot, lambda: router.prefills[0].drained, "the drain")
        await until(pilot, lambda: health(main, "prefill-0") == "UP drained", "drained shown")
        await until(
            pilot,
            lambda: any("drained: no request in flight" in n.message for n in app._notifications),
            "the drain to complete",
        )
        await pilot.press("D")  # resume: not destructive, no question
        assert on_main(app)
        await until(pilot, lambda: not router.prefills[0].drained, "the resume")
        await until(pilot, lambda: health(main, "prefill-0") == "UP", "resumed shown")


async def test_mode_toggle_for_ab_raises_the_sequential_alert(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src)
    async with app.run_test(size=(140, 36)) as pilot:
        main = await live(pilot, app)
        await pilot.press("M")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: src.router_core.mode == "push-sequential", "the mode switch")
        await until(
            pilot,
            lambda: (
                main.latest is not None and "PA005" in {a.code for a in main.latest.snapshot.alerts}
            ),
            "the sequential-dispatch alert",
        )
        await until(pilot, lambda: "PA005" in str(main.query_one("#alerts").render()), "the banner")
        assert main.query_one("#alerts").display


@pytest.mark.slow  # a command typed into the palette key by key
async def test_stop_and_restart_from_the_palette(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src)
    async with app.run_test(size=(140, 36)) as pilot:
        main = await live(pilot, app)
        fleet_row(main, "decode-0")
        await pilot.press("X")
        await pilot.press("y")
        await until(pilot, lambda: "decode-0" in src.down, "the stop")
        await until(pilot, lambda: health(main, "decode-0") == "DOWN", "DOWN shown")
        await pilot.press("ctrl+p")
        await pilot.press(*"Restart decode-0")
        await until(
            pilot,
            lambda: (
                bool(app.screen.query(CommandList))
                and app.screen.query_one(CommandList).option_count > 0
            ),
            "the palette's hits",
        )
        first = app.screen.query_one(CommandList).get_option_at_index(0)
        assert "Restart decode-0" in str(first.prompt)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: src.restarts.get("decode-0") == 1, "the restart")
        await until(pilot, lambda: health(main, "decode-0") == "UP", "UP again")


async def test_readonly_refuses_every_change(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src, readonly=True)
    async with app.run_test(size=(140, 36)) as pilot:
        main = await live(pilot, app)
        said: list[str] = []
        notify = main.notify

        def record(message: str, **kw: Any) -> None:
            said.append(message)  # notifications expire on screen; keep every one
            notify(message, **kw)

        main.notify = record  # type: ignore[method-assign]
        fleet_row(main, "decode-0")
        for key in ("X", "R", "D", "M"):
            await pilot.press(key)
            assert on_main(app)  # no question asked: refused outright
        await pilot.pause()
        assert not src.down
        assert not src.restarts
        assert src.router_core.mode == "push"
        assert not any(u.drained for u in src.router_core.upstreams)
        assert sum("read-only" in m for m in said) == 4, said


async def test_palette_lists_actions_for_the_fleet(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src)
    async with app.run_test(size=(140, 36)) as pilot:
        main = await live(pilot, app)
        labels = [label for label, _, _ in main.palette_entries()]
        for want in (
            "Run preflight",
            "Restart prefill-0",
            "Stop decode-0",
            "Drain prefill-0",
            "Drain decode-0",
            "Router mode → push-sequential",
            "View rendezvous",
        ):
            assert want in labels
        assert not any("router" in label.lower() and "Restart" in label for label in labels)
