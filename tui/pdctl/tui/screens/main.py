"""The main screen: owns the poll worker and the action workers, shows one view at a time
with the alert banner and the fleet summary above it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.suggester import SuggestFromList
from textual.widgets import ContentSwitcher, DataTable, Input, Static
from textual.worker import get_current_worker

from pdctl.sdk.client import RouterState
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.events import Event
from pdctl.sdk.metrics.monitor import RouterAdmission
from pdctl.tui import actions, fmt
from pdctl.tui.actions import Action
from pdctl.tui.commands import entries_for
from pdctl.tui.dialogs import ConfirmScreen, HelpScreen
from pdctl.tui.history import History
from pdctl.tui.messages import ActionDone, Polled, PollFailed, PreflightDone
from pdctl.tui.source import PreflightResult, Source, Update
from pdctl.tui.views import VIEWS, view_named
from pdctl.tui.views.base import Filter, Frame, View
from pdctl.tui.views.fleetlayout import subjects
from pdctl.tui.widgets import AlertBanner, SteadyFooter, Tabs

MAX_EVENTS = 5000
"""Fleet events held by the UI (the journal keeps more: `pdctl events`)."""


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("colon", "prompt('command')", "view", key_display=":"),
        Binding("slash", "prompt('filter')", "filter", key_display="/"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("escape", "clear_filter", "clear", show=False),
        *(Binding(v.KEY, f"view('{v.NAME}')", v.NAME, show=False) for v in VIEWS),
        Binding("R", "on_selected('restart')", "restart", show=False),
        Binding("X", "on_selected('stop')", "stop", show=False),
        Binding("D", "on_selected('drain|resume')", "drain", show=False),
        Binding("M", "toggle_mode", "mode", show=False),
        Binding("A", "admission", "admission", show=False),
    ]

    def __init__(self, source: Source, *, readonly: bool = False, rounds: int | None = None):
        super().__init__()
        self.source = source
        self.readonly = readonly
        self.rounds = rounds
        """Stop polling after this many rounds (tests and snapshots); None: forever."""
        self.history = History(groups=subjects)  # the fleet view's groups' trends
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        """The fleet's events this UI has read, oldest first."""
        self.latest: Update | None = None
        self.filter = Filter()
        self.preflight: PreflightResult | None = None
        self.current = VIEWS[0].NAME
        self.applied = 0
        self.posted: Update | None = None
        """The last update the poll worker sent (tests wait until it is applied)."""
        self.polling = True
        self._backlog: list[Update] = []
        self._lock = threading.Lock()
        self.handler_ms: deque[float] = deque(maxlen=10_000)
        self._prompt_mode = ""
        self._last_error = ""

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Tabs(id="tabs")
        yield AlertBanner(id="alerts")
        yield Static(id="summary")
        with ContentSwitcher(initial=self.current, id="views"):
            for v in VIEWS:
                yield v(id=v.NAME)
        yield Input(id="prompt", classes="hidden")
        yield SteadyFooter()

    def on_mount(self) -> None:
        self.query_one("#alerts", AlertBanner).display = False
        prompt = self.query_one("#prompt", Input)
        prompt.cursor_blink = False
        self._tabs()
        self.poll_loop()

    def _tabs(self) -> None:
        extra = f"/{self.filter.text}" if self.filter.text else ""
        if self.readonly:
            extra += "  [read-only]"
        self.query_one(Tabs).show(
            [(v.KEY, v.NAME) for v in VIEWS], self.current, f"{self.source.title}  {extra}".rstrip()
        )

    @property
    def view(self) -> View:
        return self.query_one(f"#{self.current}", View)

    # ------------------------------------------------------------------ data

    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def poll_loop(self) -> None:
        """Polls the source on its own thread and event loop (a large fleet's parsing
        never stalls the UI); posts one :class:`Polled` per round."""
        worker = get_current_worker()

        async def loop() -> None:
            n = 0
            try:
                while not worker.is_cancelled and (self.rounds is None or n < self.rounds):
                    t0 = time.monotonic()
                    try:
                        self.feed(await self.source.poll())
                    except Exception as e:  # the UI outlives any failed round
                        self.post_message(PollFailed(f"{type(e).__name__}: {e}"))
                    n += 1
                    # short naps, so that a cancelled worker ends promptly
                    while not worker.is_cancelled and (  # noqa: ASYNC110
                        time.monotonic() - t0 < self.source.interval_s
                    ):
                        await asyncio.sleep(0.05)
            finally:
                self.polling = False
                await self.source.close()

        asyncio.run(loop())

    def feed(self, update: Update) -> None:
        """Queue a round for the UI (thread-safe; the poll worker's way in)."""
        with self._lock:
            self._backlog.append(update)
            self.posted = update
        self.post_message(Polled(update))

    def on_polled(self, message: Polled) -> None:
        """Every round since the last one handled goes into the history (messages are
        coalesced when the UI falls behind); the newest is painted."""
        t0 = time.perf_counter()
        with self._lock:
            backlog, self._backlog = self._backlog, []
        if not backlog:  # already painted by the handler of a replaced message
            return
        for u in backlog[:-1]:
            if u.trends:
                self.history.backfill(u.trends, u.snapshot)
            self.history.record(u.snapshot)
        for u in backlog:  # every round's events, also of the rounds not painted
            self.events.extend(u.events)
        self.apply(backlog[-1])
        self.handler_ms.append((time.perf_counter() - t0) * 1000)

    def apply(self, update: Update) -> None:
        """Record the round and repaint what is visible (other views catch up when
        shown)."""
        self.latest = update
        self.applied += 1
        self._last_error = ""
        snap = update.snapshot
        if update.trends:
            self.history.backfill(update.trends, snap)
        self.history.record(snap)
        lines = 1 if self.app.size.height < 30 else 4
        self.query_one(AlertBanner).show(snap.alerts, snap.at, lines)
        # one line high whatever it says: no layout of the screen for it
        self.query_one("#summary", Static).update(self._summary(update), layout=False)
        self.view.show(self.frame())
        top = self.app.screen
        if top is not self and hasattr(top, "show_update"):
            top.show_update(update)

    def frame(self) -> Frame:
        assert self.latest is not None
        expected = self.source.expected_bps or (
            self.preflight.expected_bps if self.preflight else None
        )
        events = self.events if self.source.events is not None else None
        return Frame(self.latest, self.history, self.filter, expected, self.preflight, events)

    def _summary(self, u: Update) -> Text:
        s = u.snapshot.summary
        t = Text()
        for label, value in (
            ("req/s", fmt.num(s.request_rate, 2)),
            ("TTFT p99", f"{fmt.ms(s.ttft_p99_s)} ms"),
            ("KV moved", fmt.size(s.kv_bytes_moved)),
            ("transfer", fmt.rate(s.transfer_bps)),
            ("up", f"{s.instances_up}/{s.instances}"),
        ):
            t.append(f"{label} ", style="bold")
            t.append(f"{value}  ")
        mode = u.router.mode if u.router else (u.snapshot.router or {}).get("mode")
        if mode:
            t.append("router ", style="bold")
            t.append(mode)
        gate = admission_figures(u.router.admission if u.router else {}, u.snapshot.admission)
        if gate:
            t.append("  admission ", style="bold")
            shedding = bool(u.snapshot.admission and u.snapshot.admission.shed_per_s)
            t.append(gate, style="yellow" if "saturated:" in gate or shedding else "")
        for note in u.notes[:1]:
            t.append(f"  {note}", style="yellow")
        return t

    def on_poll_failed(self, message: PollFailed) -> None:
        if message.error != self._last_error:
            self._last_error = message.error
            self.notify(message.error, title="poll failed", severity="error")

    # ------------------------------------------------------------------ navigation

    def action_view(self, name: str) -> None:
        self.current = name
        self.query_one(ContentSwitcher).current = name
        self._tabs()
        if name == "preflight" and self.preflight is None:
            self.run_preflight()
        if self.latest is not None:
            self.view.show(self.frame())
        self._focus_view()

    def _focus_view(self) -> None:
        """The keys to the view: its first table, else its first focusable widget."""
        tables = self.view.query(DataTable)
        if tables:
            tables.first().focus()
        else:  # a view without a table still gets the keys (its bindings, scrolling)
            focusable = [w for w in self.view.query("*") if w.focusable]
            if focusable:
                focusable[0].focus()

    def action_prompt(self, mode: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self._prompt_mode = mode
        names = [n for v in VIEWS for n in (v.NAME, *v.ALIASES)] + ["q", "quit"]
        prompt.suggester = SuggestFromList(names) if mode == "command" else None
        prompt.placeholder = "view name (Tab completes)" if mode == "command" else "filter"
        prompt.value = self.filter.text if mode == "filter" else ""
        prompt.remove_class("hidden")
        prompt.focus()

    @on(Input.Submitted, "#prompt")
    def _submitted(self, event: Input.Submitted) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.add_class("hidden")
        text = event.value.strip()
        if self._prompt_mode == "filter":
            self.set_filter(text)
        elif text in ("q", "quit"):
            self.app.exit()
        elif text:
            v = view_named(text)
            if v is None:
                self.notify(f"no view named {text!r}", severity="warning")
            else:
                self.action_view(v.NAME)
        self._focus_view()  # the view's table, not the view (it takes no focus)

    def set_filter(self, text: str) -> None:
        self.filter = Filter(text)
        self._tabs()
        if self.latest is not None:
            self.view.show(self.frame())

    def action_clear_filter(self) -> None:
        prompt = self.query_one("#prompt", Input)
        if not prompt.has_class("hidden"):
            prompt.add_class("hidden")
        if self.filter.text:
            self.set_filter("")

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.readonly))

    @on(DataTable.RowSelected)
    def _drill_down(self, event: DataTable.RowSelected) -> None:
        request = self.view.selected_request()
        if request is not None:
            from pdctl.tui.screens.flight import FlightScreen

            self.app.push_screen(FlightScreen(request))
            return
        name = self.view.selected_instance()
        if name is None or self.latest is None:
            return
        try:
            self.latest.snapshot.instance(name)
        except KeyError:
            return
        from pdctl.tui.screens.instance import InstanceScreen

        self.app.push_screen(InstanceScreen(name, self.latest, self.source.log_path(name)))

    # ------------------------------------------------------------------ actions

    def palette_entries(self) -> list[tuple[str, str, Callable[[], None]]]:
        return entries_for(
            actions.available(self.latest), [v.NAME for v in VIEWS], self.request, self.action_view
        )

    def action_on_selected(self, kinds: str) -> None:
        """``kinds``: the action, or alternatives separated by ``|`` (drain|resume)."""
        name = self.view.selected_instance()
        a = actions.for_instance(self.latest, name, tuple(kinds.split("|"))) if name else None
        if a is None:
            self.notify("no instance under the cursor for that action", severity="warning")
            return
        self.request(a)

    def action_toggle_mode(self) -> None:
        modes = [a for a in actions.available(self.latest) if a.kind == "mode"]
        if not modes:
            self.notify("the router offers no other mode for this fleet", severity="warning")
            return
        self.request(modes[0])

    def action_admission(self) -> None:
        self.request(Action("admission"))

    def request(self, action: Action) -> None:
        """Run ``action`` after the read-only check and, when destructive, a yes."""
        if action.kind == "preflight":
            self.action_view("preflight")
            self.run_preflight()
            return
        if self.readonly and action.mutating:
            self.notify(f"read-only: {action.label} is disabled", severity="warning")
            return
        if action.kind == "admission":
            self.open_admission()
            return
        if not action.destructive:
            self.start_action(action)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.start_action(action)

        self.app.push_screen(ConfirmScreen(f"{action.label}?", action.help), answered)

    def open_admission(self) -> None:
        """The admission form over the router's settings as last polled."""
        router = self.latest.router if self.latest else None
        adm = router.admission if router else {}
        if not adm.get("enabled"):
            why = "no router state yet" if router is None else "admission control is off"
            self.notify(f"{why} (router.admission.enabled)", severity="warning")
            return
        from pdctl.tui.admission import AdmissionScreen

        def done(answer: str | None) -> None:
            if answer:
                self.notify(answer)

        async def send(changes: dict[str, int | float]) -> RouterState:
            return await actions.set_admission(self.source, changes)

        self.app.push_screen(AdmissionScreen(adm, send), done)

    @work(group="actions")
    async def start_action(self, action: Action) -> None:
        self.notify(f"{action.label}…", timeout=3)
        try:
            text = await actions.perform(action, self.source)
        except PdctlError as e:
            self.post_message(ActionDone(f"{action.label} failed: {e}", ok=False))
        else:
            self.post_message(ActionDone(text))

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(message.text, severity="information" if message.ok else "error")

    @work(exclusive=True, group="preflight")
    async def run_preflight(self) -> None:
        self.post_message(PreflightDone(await self.source.preflight()))

    def on_preflight_done(self, message: PreflightDone) -> None:
        self.preflight = message.result
        if self.current == "preflight" and self.latest is not None:
            self.view.show(self.frame())


def admission_figures(adm: dict[str, Any], window: RouterAdmission | None = None) -> str:
    """The router's admission control in a few words: its queue and stages, the
    instances their own gauges say are saturated, and, from the router's ``/metrics``
    over the window (``window``: the snapshot's), what it shed per second by reason and
    its TTFT predictions' median relative error ("" when admission is off or unknown and
    the router's metrics say nothing; ``-`` for a figure not measured)."""
    parts = []
    if adm.get("enabled"):
        parts.append(
            f"queued {adm.get('queued', 0)}/{adm.get('max_queued', '?')}"
            f" · prefill {adm.get('in_prefill', 0)} · decode {adm.get('in_flight', 0)}"
        )
        hot = adm.get("saturated") or []
        if hot:
            parts.append(f"saturated: {', '.join(map(str, hot))}")
    if window is not None and (parts or window.shed_per_s is not None):
        parts.append(shed_figures(window))
    if window is not None and (parts or window.prediction_error_p50 is not None):
        parts.append(prediction_figures(window))
    return " · ".join(parts)


def shed_figures(w: RouterAdmission) -> str:
    """``shed 3.2/s (decode_saturated 2.9, slo_unreachable 0.3)``: the reasons that shed
    any in the window, most first; ``shed -`` without a rate (one scrape, admission
    off, the router not scraped)."""
    if w.shed_per_s is None:
        return f"shed {fmt.DASH}"
    why = sorted(((v, k) for k, v in w.shed_by_reason.items() if v > 0), reverse=True)
    detail = ", ".join(f"{k} {fmt.num(v)}" for v, k in why)
    return f"shed {fmt.num(w.shed_per_s)}/s" + (f" ({detail})" if detail else "")


def prediction_figures(w: RouterAdmission) -> str:
    """``TTFT prediction |error| p50 18% (router)``: the median relative error of the
    router's predictions checked against the TTFT it measured, or why there is none."""
    if w.prediction_error_p50 is not None:
        return f"TTFT prediction |error| p50 {fmt.pct(w.prediction_error_p50)} (router)"
    none = ": no predictions in the window" if w.predictions == 0 else ""
    return f"TTFT prediction |error| {fmt.DASH} (router{none})"
