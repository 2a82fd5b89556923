"""SVG snapshots of the main views, rendered headless from recorded payloads.

A mismatch writes ``tests/snapshots/<name>.actual.svg`` next to the expected file and
fails; ``pytest --update-goldens`` rewrites the expected files and lists them (review
them, e.g. in a browser, before committing). Deterministic: fixed clock, theme, data and sizes, no
cursor blink, no clock on screen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.tui.app import PdctlApp
from tests.conftest import REPO
from tests.unit import tui_support
from tests.unit.test_preflight_digest import worked_example
from tests.unit.tui_support import PREFLIGHT, replay, settled, tiny_planner

clock = tui_support.clock
pytestmark = pytest.mark.slow  # each renders a whole screen to SVG after eight rounds
SNAPSHOTS = REPO / "tests" / "snapshots"
ROUNDS = 8

# name -> (size, keys pressed after the data settled, connector series, P, D)
SCREENS: dict[str, tuple[tuple[int, int], tuple[str, ...], bool, int, int]] = {
    "fleet": ((120, 32), (), True, 2, 2),
    "fleet-80x24": ((80, 24), (), False, 1, 1),
    "rendezvous": ((120, 32), ("2",), True, 2, 2),
    "rendezvous-stock": ((100, 28), ("2",), False, 1, 1),
    "transfers": ((120, 32), ("3",), True, 2, 2),
    "latency": ((120, 32), ("4",), True, 2, 2),
    "requests": ((120, 32), ("5",), True, 2, 2),
    "plan": ((120, 36), ("7",), True, 1, 1),
    "flight": ((160, 45), ("5", "enter"), True, 2, 2),
    "flight-80x24": ((80, 24), ("5", "enter"), True, 2, 2),
    "preflight": ((160, 45), ("6",), True, 1, 1),
    "preflight-80x24": ((80, 24), ("6",), True, 1, 1),
    "preflight-json": ((120, 32), ("6", "j"), True, 1, 1),
    "events": ((160, 45), ("8",), True, 2, 2),
    "events-80x24": ((80, 24), ("8",), True, 1, 1),
}
# every view at the two sizes it must read at: a small terminal and a large one
for _view, _key in (
    ("fleet", ""), ("rendezvous", "2"), ("transfers", "3"), ("latency", "4"),
    ("requests", "5"), ("plan", "7"),
):  # fmt: skip
    for _size in ((80, 24), (160, 45)):
        SCREENS.setdefault(
            f"{_view}-{_size[0]}x{_size[1]}",
            (_size, (_key,) if _key else (), True, 2, 2),
        )
REPORTS = {n: worked_example() for n in ("preflight", "preflight-80x24", "preflight-json")}
"""Screens that show a real report (the published worked example) instead of a few keys."""


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wall-clock times on screen (the timeline) in one zone, whatever the machine's."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("name", sorted(SCREENS))
async def test_snapshot(name: str, clock, golden) -> None:
    size, keys, connector, p, d = SCREENS[name]
    report = REPORTS.get(name, PREFLIGHT)
    src = replay(
        clock, connector=connector, prefills=p, decodes=d, preflight=report, planner=tiny_planner
    )
    app = PdctlApp(src, rounds=ROUNDS)
    async with app.run_test(size=size) as pilot:
        main = await settled(pilot, app)
        if name.startswith("transfers") or name in REPORTS:
            main.run_preflight()
            await tui_support.until(pilot, lambda: main.preflight is not None, "preflight")
        await pilot.press(*keys)
        await pilot.pause()
        svg = app.export_screenshot(title=f"pdctl — {name}")
    golden.check(SNAPSHOTS / f"{name}.svg", svg, actual=SNAPSHOTS / f"{name}.actual.svg")


def test_every_screen_has_its_expected_snapshot() -> None:
    """Each screen compares with a committed file, and no file is left over from a screen
    that is gone (a missing one fails here even where the render tests are deselected)."""
    assert sorted(p.stem for p in SNAPSHOTS.glob("*.svg") if ".actual" not in p.name) == sorted(
        SCREENS
    )


def test_snapshot_files_are_the_screenshots_in_the_docs() -> None:
    """docs/screenshots holds copies of expected snapshots (kept in step)."""
    shots = sorted((REPO / "docs" / "screenshots").glob("*.svg"))
    assert shots, "docs/screenshots has no SVG"
    for shot in shots:
        assert shot.stem in SCREENS, f"{shot.name} is not one of the snapshot screens"
        assert shot.read_text() == (SNAPSHOTS / shot.name).read_text(), shot.name
