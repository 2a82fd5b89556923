"""The UI on a fleet known without a spec: `pdctl top --prefill URL --decode URL` shows
the instances the SDK scraped, and a Prometheus that fails is a note in the UI, not a
crash."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.cli.cmd_top import make_source
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.tui.app import PdctlApp
from pdctl.tui.source import MonitorSource
from tests.unit import tui_support
from tests.unit.test_tui_app import cells, table
from tests.unit.tui_support import PAYLOADS, replay, settled

pytestmark = pytest.mark.usefixtures("no_color_env")
clock = tui_support.clock


@pytest.fixture
def no_color_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)


def top_args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "replay": None,
        "prometheus": None,
        "selector": "",
        "instance_label": "instance",
        "role_label": "role",
        "prefill": [],
        "decode": [],
        "router": None,
        "file": None,
        "interval": 1.0,
        "window": 60.0,
        "scrape_timeout": 2.0,
        "expect_gbps": None,
    }
    return argparse.Namespace(**{**base, **kw})


async def test_top_on_endpoints_shows_the_scraped_instances():
    p = await MockServer(MockConfig(role="prefill", metrics_text=PAYLOADS.prefill)).start()
    d = await MockServer(MockConfig(role="decode", metrics_text=PAYLOADS.decode)).start()
    try:
        source = make_source(top_args(prefill=[p.url], decode=[d.url]))
        assert isinstance(source, MonitorSource)
        assert source.spec is None
        app = PdctlApp(source, rounds=2)
        async with app.run_test(size=(160, 40)) as pilot:
            main = await settled(pilot, app)
            t = table(app, "#fleet-table")
            assert set(t._order) >= {"prefill-0", "decode-0"}
            assert cells(t, "decode-0")["health"] == "UP"
            assert main.latest is not None
            assert main.latest.recommendation_note.startswith("no spec")
    finally:
        await p.stop()
        await d.stop()


async def test_a_failing_prometheus_is_a_note_not_a_crash():
    mon = FleetMonitor.from_prometheus("http://127.0.0.1:9", 'fleet="x"')
    source = MonitorSource(mon, title="fleet at Prometheus")
    try:
        u = await source.poll()
    finally:
        await source.close()
    assert u.snapshot.instances == ()
    assert any("did not answer" in n for n in u.notes), u.notes


@pytest.mark.parametrize("connector", [False, True])
async def test_latency_view_labels_the_ttft_split_without_the_connector(clock, connector):
    app = PdctlApp(replay(clock, connector=connector), rounds=2)
    async with app.run_test(size=(160, 40)) as pilot:
        main = await settled(pilot, app)
        await pilot.press("4")
        await pilot.pause()
        split = str(main.query_one("#lat-split").render()).replace("\n", " ")
        assert ("needs pdctl's connector" in split) is not connector, split
