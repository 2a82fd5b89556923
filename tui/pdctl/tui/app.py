"""The pdctl terminal UI: a thin App that sets the theme and opens the main screen."""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import ClassVar

from textual.app import App
from textual.binding import Binding
from textual.theme import BUILTIN_THEMES

from pdctl.tui.commands import FleetCommands
from pdctl.tui.messages import ActionRequested
from pdctl.tui.screens.main import MainScreen
from pdctl.tui.source import Source

THEME = replace(BUILTIN_THEMES["ansi-dark"], name="pdctl")
"""The terminal's own 16 colours on its own background: reads on dark and light
terminals alike (NO_COLOR is honoured by Textual itself)."""


def settle_heap() -> None:
    """Collect once and move everything alive (modules, Textual, the screens and their
    widgets, the source) out of the cyclic collector's sight (:func:`gc.freeze`): its
    full collections, which the allocations of updates and keys trigger now and then,
    walked all of it again each time (~240 ms of CPU in the benchmark at 512 instances;
    a key that met one was answered that much later); they now walk only what came
    since."""
    gc.collect()
    gc.freeze()


class PdctlApp(App[None]):
    CSS_PATH = "pdctl.tcss"
    TITLE = "pdctl"
    COMMANDS: ClassVar = App.COMMANDS | {FleetCommands}
    BINDINGS: ClassVar = [Binding("q", "quit", "quit")]

    def __init__(
        self,
        source: Source,
        *,
        readonly: bool = False,
        theme: str | None = None,
        rounds: int | None = None,
        settle: bool = False,
    ) -> None:
        super().__init__()
        self.source = source
        self.readonly = readonly
        self.rounds = rounds
        self.settle = settle
        """:func:`settle_heap` once the main screen is up (``pdctl top`` and ``demo``; not
        in tests, which start many apps in one process)."""
        self.register_theme(THEME)
        self.theme = theme or THEME.name

    def on_mount(self) -> None:
        self.push_screen(MainScreen(self.source, readonly=self.readonly, rounds=self.rounds))
        if self.settle:
            self.call_after_refresh(settle_heap)

    def on_action_requested(self, message: ActionRequested) -> None:
        """An action asked for on a screen above the main one: the main screen checks
        (read-only, confirmation) and runs it."""
        self.main.request(message.action)

    @property
    def main(self) -> MainScreen:
        for s in self.screen_stack:
            if isinstance(s, MainScreen):
                return s
        raise LookupError("the main screen is not open")
