"""Typed messages from workers to screens."""

from __future__ import annotations

from textual.message import Message

from pdctl.tui.actions import Action
from pdctl.tui.source import PreflightResult, Update


class Polled(Message):
    """A new round of data. A newer one replaces an unhandled older one (coalescing)."""

    def __init__(self, update: Update) -> None:
        super().__init__()
        self.update = update

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Polled)


class PollFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PollFailed)


class ActionDone(Message):
    def __init__(self, text: str, ok: bool = True) -> None:
        super().__init__()
        self.text = text
        self.ok = ok


class PreflightDone(Message):
    def __init__(self, result: PreflightResult) -> None:
        super().__init__()
        self.result = result


class LogLines(Message):
    def __init__(self, name: str, lines: list[str], reset: bool = False) -> None:
        super().__init__()
        self.name = name
        self.lines = lines
        self.reset = reset


class ActionRequested(Message):
    """A screen asks for an operator action (the main screen checks and runs it)."""

    def __init__(self, action: Action) -> None:
        super().__init__()
        self.action = action
