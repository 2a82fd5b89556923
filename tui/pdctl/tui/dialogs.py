"""Modal screens: confirmation before destructive actions, and the key help."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    """``y`` confirms, ``n``/Esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(Text(self.question, style="bold"))
            if self.detail:
                yield Static(Text(self.detail))
            yield Static(Text("y: yes   n / Esc: no", style="dim"))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


KEYS: Sequence[tuple[str, str]] = (
    (
        "1-8",
        "switch view (fleet, rendezvous, transfers, latency, requests, preflight, plan, events)",
    ),
    (":", "jump to a view by name (:rdv, :xfer, :lat, :req, :pf), :q quits"),
    ("/", "filter the rows (role:decode  group:decode-b  host:10.0.0.7  health:DOWN  any-word)"),
    ("g", "fleet: group by role, spec group, host, or one row per instance"),
    ("s / S", "fleet: sort by the next column / reverse; Enter on a group opens or closes it"),
    ("Esc", "clear the filter · back from details"),
    (
        "Enter",
        "details and live log of the instance under the cursor; on a request, where its TTFT went",
    ),
    ("Ctrl+P", "command palette: restart, stop, drain, router mode, admission, preflight, views"),
    ("R / X / D", "restart / stop / drain or resume the instance under the cursor"),
    ("M", "toggle the router's dispatch mode (push ↔ push-sequential)"),
    ("A", "the router's admission thresholds: a form, sent after a yes"),
    ("?", "this help"),
    ("q", "quit"),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, readonly: bool) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        t = Text("pdctl — keys\n\n", style="bold")
        for k, what in KEYS:
            t.append(f"{k:>10}  ", style="bold")
            t.append(what + "\n")
        if self.readonly:
            t.append("\nread-only: actions that change the fleet are disabled\n", style="yellow")
        t.append("\nEsc closes", style="dim")
        with Vertical(id="help"):
            yield Static(t)

    def action_close(self) -> None:
        self.dismiss(None)
