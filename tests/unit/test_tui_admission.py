"""The admission form (``A`` on the fleet view): the router's thresholds as
``/v1/pdctl/state`` shows them, sent through the SDK after a yes, against the replayed
fleet's real router in-process; its answer, its refusal at the named field, read-only."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from textual.widgets import Input, Label

from pdctl.sdk.client import ADMISSION_SETTINGS, admission_changes, refused_setting
from pdctl.tui.admission import AdmissionScreen
from pdctl.tui.app import PdctlApp
from pdctl.tui.dialogs import ConfirmScreen
from pdctl.tui.screens.main import MainScreen
from tests.unit import tui_support
from tests.unit.tui_support import on_main, replay, until

clock = tui_support.clock

ROUND_S = 0.3
"""Rounds far enough apart that the app is idle between them (as in test_tui_actions)."""


def said(main: MainScreen) -> list[str]:
    """Every notification from now on (they expire on screen)."""
    out: list[str] = []
    notify = main.notify

    def record(message: str, **kw: Any) -> None:
        out.append(message)
        notify(message, **kw)

    main.notify = record  # type: ignore[method-assign]
    return out


async def opened(pilot: Any, app: PdctlApp) -> tuple[MainScreen, AdmissionScreen]:
    await until(pilot, lambda: app.main.applied >= 2, "a few rounds")
    main = app.main
    await pilot.press("A")
    await until(pilot, lambda: isinstance(app.screen, AdmissionScreen), "the form")
    assert isinstance(app.screen, AdmissionScreen)
    return main, app.screen


def field(form: AdmissionScreen, name: str) -> Input:
    return form.query_one(f"#adm-{name}", Input)


async def test_the_form_shows_the_routers_settings_and_sends_a_change_after_a_yes(clock):
    src = replay(clock, interval_s=ROUND_S)
    assert src.router is not None
    app = PdctlApp(src)
    async with app.run_test(size=(140, 40)) as pilot:
        main, form = await opened(pilot, app)
        notes = said(main)
        before = (await src.router.state()).admission
        for name in ADMISSION_SETTINGS:  # the spec's defaults, as the router reports them
            assert field(form, name).value == f"{before[name]:g}"
        field(form, "max_queued").value = "64"
        field(form, "max_kv_usage").value = "0.9"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.detail == "max_queued 512 → 64; max_kv_usage 0.98 → 0.9"
        await pilot.press("y")
        await until(pilot, lambda: on_main(app), "the form to close")
        after = (await src.router.state()).admission
        assert (after["max_queued"], after["max_kv_usage"]) == (64, 0.9)
        assert after["max_queue_wait_s"] == before["max_queue_wait_s"]  # not sent: unchanged
        assert form.sent == {"max_queued": 64, "max_kv_usage": 0.9}
        await until(pilot, lambda: bool(notes), "the router's answer")
        assert notes == ["router admission now: max_queued 64, max_kv_usage 0.9"]


async def test_no_means_nothing_is_sent(clock):
    src = replay(clock, interval_s=ROUND_S)
    assert src.router is not None
    app = PdctlApp(src)
    async with app.run_test(size=(140, 40)) as pilot:
        _, form = await opened(pilot, app)
        field(form, "max_queued").value = "8"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("n")
        await until(pilot, lambda: app.screen is form, "back on the form")
        assert form.sent is None
        assert (await src.router.state()).admission["max_queued"] == 512
        await pilot.press("escape")
        await until(pilot, lambda: on_main(app), "the form to close")


async def test_the_routers_refusal_is_shown_at_the_field_it_names(clock):
    src = replay(clock, interval_s=ROUND_S)
    assert src.router is not None
    app = PdctlApp(src)
    async with app.run_test(size=(140, 40)) as pilot:
        _, form = await opened(pilot, app)
        field(form, "prefill_in_flight_per_instance").value = "0"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: bool(form.errors), "the refusal")
        assert app.screen is form  # still open, to fix the value
        why = "'prefill_in_flight_per_instance' must be an integer >= 1"
        assert form.errors == {"prefill_in_flight_per_instance": why}
        assert field(form, "prefill_in_flight_per_instance").has_class("-invalid")
        note = form.query_one("#adm-note-prefill_in_flight_per_instance", Label)
        assert why in str(note.render())
        assert (await src.router.state()).admission["prefill_in_flight_per_instance"] == 32


async def test_a_value_that_is_not_a_number_is_not_sent(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src)
    async with app.run_test(size=(140, 40)) as pilot:
        _, form = await opened(pilot, app)
        field(form, "max_queue_wait_s").value = "soon"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is form  # no question: nothing to send
        assert form.errors == {"max_queue_wait_s": "max_queue_wait_s must be a number"}
        assert form.sent is None


async def test_readonly_refuses_the_form(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src, readonly=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.main.applied >= 2, "a few rounds")
        notes = said(app.main)
        await pilot.press("A")
        await pilot.pause()
        assert on_main(app)
        assert notes == ["read-only: Admission thresholds is disabled"]


async def test_the_palette_offers_the_form(clock):
    src = replay(clock, interval_s=ROUND_S)
    app = PdctlApp(src)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.main.applied >= 2, "a few rounds")
        entries = {label: cb for label, _, cb in app.main.palette_entries()}
        app.main.call_later(entries["Admission thresholds"])  # as the palette calls it
        await until(pilot, lambda: isinstance(app.screen, AdmissionScreen), "the form")


def test_admission_changes_keeps_what_is_unchanged_or_empty():
    current = {"max_queued": 512, "max_kv_usage": 0.98, "max_queue_wait_s": 10.0}
    changes, errors = admission_changes(
        current,
        {
            "max_queued": "512",
            "max_kv_usage": "0.9",
            "max_queue_wait_s": " ",
            "max_waiting_per_instance": "x",
        },
    )
    assert changes == {"max_kv_usage": 0.9}
    assert errors == {"max_waiting_per_instance": "max_waiting_per_instance must be a whole number"}


def test_refused_setting_reads_the_routers_messages():
    assert refused_setting("'max_kv_usage' must be a number from 0 to 1") == "max_kv_usage"
    assert refused_setting("admission control is off (router.admission.enabled)") is None
    every = "unknown admission setting(s) x; send any of: " + ", ".join(ADMISSION_SETTINGS)
    assert refused_setting(every) is None  # names them all: none in particular
