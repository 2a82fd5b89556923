"""The pdctl terminal UI: a thin App that sets the theme and opens the main screen."""

from __future__ import annotations

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
    ) -> None:
        super().__init__()
        self.source = source
        self.readonly = readonly
        self.rounds = rounds
        self.register_theme(THEME)
        self.theme = theme or THEME.name

    def on_mount(self) -> None:
        self.push_screen(MainScreen(self.source, readonly=self.readonly, rounds=self.rounds))

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
