"""The plan view: the poll worker's source attaches the SDK's recommendation (at most
once per ``recommend_every_s`` of its clock), the view renders it or says how to get a
profile."""

from __future__ import annotations

import html

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.sdk.plan import Layout
from pdctl.sdk.plan.recommend import HOW_TO
from pdctl.tui.app import PdctlApp
from pdctl.tui.views import view_named
from pdctl.tui.views.planner import PlannerView
from tests.unit import tui_support
from tests.unit.tui_support import FakeClock, replay, settled, tiny_planner

clock = tui_support.clock


def test_the_view_answers_to_its_names():
    assert view_named("7") is PlannerView
    assert view_named("plan") is PlannerView
    assert view_named(":recommend") is PlannerView


async def test_source_recommends_once_traffic_is_seen_then_every_few_seconds(clock: FakeClock):
    src = replay(clock, planner=tiny_planner)
    first = await src.poll()  # one scrape: no rate yet
    assert first.recommendation is None
    assert "no request rate" in first.recommendation_note
    second = await src.poll()  # retried at once while there is none
    rec = second.recommendation
    assert rec is not None
    assert rec.current == Layout("push", 1, 1)
    assert rec.correction is not None
    assert rec.correction.window_s == 1.0  # two scrapes one (fake) second apart
    kept = [(await src.poll()).recommendation for _ in range(4)]  # 1 s per round
    assert all(r is rec for r in kept)
    fresh = (await src.poll()).recommendation  # 5 s after the last one
    assert fresh is not None
    assert fresh is not rec
    assert fresh.correction is not None
    assert fresh.correction.window_s == 6.0
    await src.close()


async def test_without_a_profile_the_view_says_how_to_make_one(clock: FakeClock):
    app = PdctlApp(replay(clock), rounds=3)
    async with app.run_test(size=(120, 30)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("7")
        await pilot.pause()
        assert main.current == "plan"
        body = str(main.query_one("#plan-body").render())
        assert body == HOW_TO
        assert "pdctl profile -f SPEC --quick" in body


async def test_the_view_shows_both_layouts_and_labels_every_number(clock: FakeClock):
    app = PdctlApp(replay(clock, planner=tiny_planner), rounds=3)
    async with app.run_test(size=(140, 40)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("7")
        await pilot.pause()
        rec = main.latest.recommendation if main.latest else None
        assert rec is not None
        shot = html.unescape(app.export_screenshot()).replace("\xa0", " ")
        for text in ("1P1D push", rec.recommended.name, "measured", "predicted", "inferred"):
            assert text in shot, text
        assert "from the spec" in shot
        assert "tiny-profile.json" in shot
