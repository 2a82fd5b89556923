"""Drill-down: one instance's figures, process and routing state, and a live log tail."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from pdctl.sdk.fleet import tail
from pdctl.sdk.metrics.derive import Latency
from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.tui import actions, fmt
from pdctl.tui.messages import ActionRequested, LogLines
from pdctl.tui.source import Update

LOG_LINES = 200


def _kv(t: Text, key: str, value: str | Text) -> None:
    t.append(f"{key:<14}", style="bold")
    t.append(value)
    t.append("\n")


def _lat(t: Text, name: str, lat: Latency) -> None:
    _kv(t, name, f"{fmt.ms(lat.p50)} / {fmt.ms(lat.p90)} / {fmt.ms(lat.p99)} ms")


def identity(i: InstanceMetrics, u: Update) -> Text:
    t = Text()
    _kv(t, "role", i.role)
    _kv(t, "endpoint", i.url)
    _kv(t, "health", fmt.health(i.health))
    if i.error:
        _kv(t, "error", Text(i.error, style="red"))
    proc = u.fleet.get(i.name) if u.fleet else None
    if proc is not None:
        _kv(t, "process", f"{proc.state} (pid {proc.pid or '-'})")
        _kv(t, "restarts", str(proc.restarts))
        if proc.restart_policy:
            _kv(t, "restart policy", proc.restart_policy)
        if proc.next_restart_in_s is not None:
            _kv(t, "restarting in", f"{proc.next_restart_in_s:.0f} s (backoff)")
        if proc.last_failure:
            _kv(t, "last failure", Text(proc.last_failure, style="red"))
    if u.router is not None:
        try:
            r = u.router.instance(i.name)
        except KeyError:
            pass
        else:
            _kv(t, "routing", "drained" if r.drained else "receives requests")
            _kv(t, "in flight", f"{r.in_flight} (breaker {r.breaker})")
            if r.kv_index is not None:
                _kv(t, "KV index", f"{r.kv_index}, prefix hits {fmt.pct(r.prefix_hit_rate)}")
    if i.malformed_lines:
        _kv(t, "bad lines", str(i.malformed_lines))
    return t


def serving(i: InstanceMetrics) -> Text:
    t = Text("p50 / p90 / p99\n", style="dim")
    for name, lat in (("TTFT", i.ttft), ("ITL", i.itl), ("TPOT", i.tpot), ("e2e", i.e2e)):
        _lat(t, name, lat)
    _kv(t, "req/s", fmt.num(i.request_rate, 2))
    _kv(t, "run/wait", f"{fmt.count(i.running)}/{fmt.count(i.waiting)}")
    _kv(t, "KV cache", fmt.pct(i.kv_usage))
    for src, n in sorted(i.prompt_tokens_by_source_window.items()):
        _kv(t, f"tok {src[:9]}", f"{n:.0f} (window)")
    return t


def transfer(i: InstanceMetrics) -> Text:
    t = Text()
    tr = i.transfers
    if tr.bytes_total is not None:
        _kv(t, "KV moved", fmt.size(tr.bytes_total))
        _kv(t, "rate", fmt.rate(tr.throughput_bps))
        _lat(t, "xfer", tr.xfer_time)
        _lat(t, "post", tr.post_time)
        _kv(t, "desc/xfer", fmt.num(tr.descriptors_per_transfer))
        _kv(t, "failed", f"{(tr.failed_transfers or 0) + (tr.failed_notifications or 0):.0f}")
        _kv(t, "expired", f"{tr.expired_leases or 0:.0f}")
    for stage, n in sorted(i.kv_fetch_by_stage.items()):
        _kv(t, stage[:14], f"{n:.0f}")
    r = i.rendezvous
    if r is not None:
        _kv(t, "regs waiting", fmt.count(r.registrations_waiting))
        _kv(t, "P waiting", fmt.count(r.prefills_waiting))
        _kv(t, "WRITEs", fmt.count(r.writes_in_flight))
        _lat(t, "match wait", r.match_wait)
    elif i.role in ("prefill", "decode"):
        t.append("no connector rendezvous metrics\n", style="dim")
    return t


class InstanceScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back"),
        Binding("R", "act('restart')", "restart"),
        Binding("X", "act('stop')", "stop"),
        Binding("D", "act('drain|resume')", "drain/resume"),
    ]

    def __init__(self, name: str, latest: Update | None, log_path: Path | None) -> None:
        """``latest``: the newest round of data (later ones arrive by :meth:`show_update`);
        ``log_path``: the instance's log on this machine, if any."""
        super().__init__()
        self.instance = name
        self.latest = latest
        self.log_path = log_path

    def compose(self) -> ComposeResult:
        yield Static(id="inst-title")
        with Horizontal(id="inst-details"):
            yield Static(id="inst-identity", classes="detail")
            yield Static(id="inst-serving", classes="detail")
            yield Static(id="inst-transfer", classes="detail")
        yield Static(id="inst-log-title", classes="note")
        yield Log(id="inst-log", max_lines=2000, auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        if self.latest is not None:
            self.show_update(self.latest)
        self.follow_log()

    def show_update(self, u: Update) -> None:
        self.latest = u
        try:
            i = u.snapshot.instance(self.instance)
        except KeyError:
            return
        title = Text(f" {i.name} ", style="reverse bold")
        title.append("  Esc back · R restart · X stop · D drain/resume", style="dim")
        self.query_one("#inst-title", Static).update(title)
        self.query_one("#inst-identity", Static).update(identity(i, u))
        self.query_one("#inst-serving", Static).update(serving(i))
        self.query_one("#inst-transfer", Static).update(transfer(i))

    @work(exclusive=True, group="log")
    async def follow_log(self) -> None:
        """The last lines of the instance's log, then every new line as it is written."""
        path = self.log_path
        title = self.query_one("#inst-log-title", Static)
        if path is None:
            title.update(f"no log for {self.instance} (not launched by pdctl on this machine)")
            return
        title.update(f"log {path.name} (live)")
        lines = await asyncio.to_thread(tail, path, LOG_LINES)
        self.post_message(LogLines(self.instance, lines, reset=True))
        pos = await asyncio.to_thread(_size, path)
        while True:
            await asyncio.sleep(0.5)
            pos, new = await asyncio.to_thread(_read_from, path, pos)
            if new:
                self.post_message(LogLines(self.instance, new))

    def on_log_lines(self, message: LogLines) -> None:
        log = self.query_one(Log)
        if message.reset:
            log.clear()
        log.write_lines(message.lines)

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_act(self, kinds: str) -> None:
        a = actions.for_instance(self.latest, self.instance, tuple(kinds.split("|")))
        if a is not None:
            self.app.post_message(ActionRequested(a))


def _size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: Path, pos: int) -> tuple[int, list[str]]:
    """New complete lines since byte ``pos`` (from the start again if truncated)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < pos:
                pos = 0
            f.seek(pos)
            data = f.read()
    except OSError:
        return pos, []
    end = data.rfind(b"\n")
    if end < 0:
        return pos, []
    return pos + end + 1, data[: end + 1].decode(errors="replace").splitlines()
