"""The router's admission thresholds, changed at run time: a small form over what
``GET /v1/pdctl/state`` shows under ``admission``, sent as ``POST /v1/pdctl/admission``
through the SDK's client after a yes; the router's answer, or its refusal shown at the
field it names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from pdctl.sdk.client import (
    ADMISSION_FIELDS,
    RouterError,
    RouterState,
    admission_changes,
    refused_setting,
)
from pdctl.sdk.errors import PdctlError
from pdctl.tui.dialogs import ConfirmScreen

Send = Callable[[dict[str, int | float]], Awaitable[RouterState]]


def _shown(v: Any) -> str:
    return "" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def changed_text(changes: Mapping[str, int | float], before: Mapping[str, Any]) -> str:
    """``max_queued 512 → 64; max_kv_usage 0.98 → 0.9``."""
    return "; ".join(f"{k} {_shown(before.get(k))} → {_shown(v)}" for k, v in changes.items())


def answer_text(changes: Mapping[str, int | float], state: RouterState) -> str:
    """The router's answer in one line: the changed settings as it now holds them."""
    now = state.admission
    got = ", ".join(f"{k} {_shown(now.get(k))}" for k in changes)
    return f"router admission now: {got}"


class AdmissionScreen(ModalScreen[str | None]):
    """Enter (in a field) or Ctrl+S asks to apply; Esc closes without a change. Dismissed
    with the router's answer in one line once it took the change."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Cancel"),
        Binding("ctrl+s", "apply", "Apply"),
    ]

    def __init__(self, current: Mapping[str, Any], send: Send) -> None:
        super().__init__()
        self.current = dict(current)
        self.send = send
        self.errors: dict[str, str] = {}
        """Field -> what is wrong with it (shown next to it), from the last try."""
        self.sent: dict[str, int | float] | None = None
        """The changes last sent (tests read it)."""

    def compose(self) -> ComposeResult:
        with Vertical(id="admission"):
            yield Static(Text("Router admission thresholds", style="bold"))
            yield Static(
                Text(
                    "Changed on every router worker; a raised limit admits the queue at once.",
                    style="dim",
                )
            )
            for s in ADMISSION_FIELDS:
                with Horizontal(classes="adm-row"):
                    yield Label(s.name, classes="adm-name")
                    yield Input(
                        _shown(self.current.get(s.name)),
                        id=f"adm-{s.name}",
                        classes="adm-input",
                        type="integer" if s.integer else "number",
                    )
                    yield Label(s.help, id=f"adm-note-{s.name}", classes="adm-note")
            yield Static(id="adm-status")
            yield Static(Text("Enter / Ctrl+S: apply (asks first)   Esc: cancel", style="dim"))

    def on_mount(self) -> None:
        for inp in self.query(Input):
            inp.cursor_blink = False
        self.query_one(f"#adm-{ADMISSION_FIELDS[0].name}", Input).focus()

    def entered(self) -> dict[str, str]:
        return {s.name: self.query_one(f"#adm-{s.name}", Input).value for s in ADMISSION_FIELDS}

    def show_errors(self, errors: Mapping[str, str], status: str = "") -> None:
        """Each field's error next to it (its help text where it has none)."""
        self.errors = dict(errors)
        for s in ADMISSION_FIELDS:
            why = errors.get(s.name)
            note = self.query_one(f"#adm-note-{s.name}", Label)
            note.update(Text(why, style="bold red") if why else Text(s.help))
            self.query_one(f"#adm-{s.name}", Input).set_class(bool(why), "-invalid")
        self.status(status, error=bool(errors) or bool(status))

    def status(self, text: str, *, error: bool = False) -> None:
        self.query_one("#adm-status", Static).update(
            Text(text, style="bold red" if error else "green")
        )

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_apply()

    def action_apply(self) -> None:
        changes, errors = admission_changes(self.current, self.entered())
        if errors:
            self.show_errors(errors, "not sent: fix the fields marked")
            return
        if not changes:
            self.show_errors({}, "nothing changed")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_changes(changes)

        self.app.push_screen(
            ConfirmScreen("Change the router's admission?", changed_text(changes, self.current)),
            answered,
        )

    @work(exclusive=True, group="admission")
    async def send_changes(self, changes: dict[str, int | float]) -> None:
        self.sent = changes
        self.show_errors({})
        self.status("sending…")
        try:
            state = await self.send(changes)
        except PdctlError as e:
            said = e.message if isinstance(e, RouterError) and e.message else str(e)
            field = refused_setting(said)
            self.show_errors({field: said} if field else {}, f"the router refused: {said}")
            return
        self.current.update(state.admission)
        self.dismiss(answer_text(changes, state))

    def action_close(self) -> None:
        self.dismiss(None)
