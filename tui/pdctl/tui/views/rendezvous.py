"""The push rendezvous: registrations and finished prefills waiting for each other, WRITEs
in flight, which side arrived first, how long matches waited, expiries; per P→D pair
from the router. Without pdctl's connector, what vLLM itself offers."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from pdctl.sdk.metrics import ENABLE
from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.tui import fmt
from pdctl.tui.history import History
from pdctl.tui.views.base import Frame, View
from pdctl.tui.widgets import Cell, Column, SyncTable

PREFILL_COLUMNS = (
    Column("name", "prefill", 16),
    Column("regs", "regs wait", 9),
    Column("pre", "P wait", 6),
    Column("writes", "WRITEs", 6),
    Column("order", "reg 1st", 7),
    Column("wait", "match p50/99", 12),
    Column("expired", "expired", 8),
    Column("trend", "WRITEs trend", 14, wide=1),
    Column("done", "match→done p99", 14, wide=2),
)
DECODE_COLUMNS = (
    Column("name", "decode", 16),
    Column("sent", "regs sent", 9),
    Column("await", "awaiting", 8),
    Column("notified", "reg→notified p50/99", 19),
    Column("fail", "failed", 6),
    Column("trend", "awaiting trend", 14, wide=3),
)
STOCK_COLUMNS = (
    Column("name", "decode", 16),
    Column("w2s", "waiting to start", 16),
    Column("prog", "in progress", 11),
    Column("cw", "done, waiting", 13),
    Column("ext", "tokens via KV", 13, wide=4),
    Column("local", "recomputed", 10, wide=5),
)
PAIR_COLUMNS = (
    Column("pair", "P → D", 30),
    Column("reqs", "requests", 8),
    Column("ok", "ok", 5),
    Column("err", "errors", 6),
    Column("ttft", "TTFT p50", 8),
    Column("overlap", "overlap p50", 11),
)

ABSENT = (
    "pdctl's connector metrics are absent: vLLM's own NixlPushConnector exports nothing "
    "about the rendezvous. Showing what vLLM offers (decode's kv_fetch_by_stage and "
    "prompt tokens by source). For live queues, arrival order and match waits: " + ENABLE
)

NOT_PUSH = (
    "a {mode} fleet has no push rendezvous: the decode reads the KV itself, whichever the "
    "connector. Showing what vLLM offers (decode's kv_fetch_by_stage and prompt tokens by "
    "source)."
)


class RendezvousView(View):
    NAME = "rendezvous"
    KEY = "2"
    ALIASES = ("rdv", "r", "rendezvous")
    HINT = "queues of the push rendezvous; / filters instances"

    def compose(self) -> ComposeResult:
        yield Static(id="rdv-note", classes="note")
        yield SyncTable(PREFILL_COLUMNS, id="rdv-prefill")
        yield SyncTable(DECODE_COLUMNS, id="rdv-decode")
        yield SyncTable(STOCK_COLUMNS, id="rdv-stock")
        yield SyncTable(PAIR_COLUMNS, id="rdv-pairs")

    def show(self, frame: Frame) -> None:
        snap, h, flt = frame.update.snapshot, frame.history, frame.filter
        insts = [
            i
            for i in snap.instances
            if i.role in ("prefill", "decode")
            and flt.matches({"instance": i.name, "role": i.role, "health": i.health})
        ]
        have = [i for i in insts if i.rendezvous is not None]
        missing = [i.name for i in insts if i.rendezvous is None and i.health == "UP"]
        note = self.query_one("#rdv-note", Static)
        mode = str((snap.router or {}).get("mode") or "push")
        if not have and not mode.startswith("push"):
            note.update(Text(NOT_PUSH.format(mode=mode), style="yellow"))
        elif not have:
            note.update(Text(ABSENT, style="yellow"))
        elif missing:
            note.update(
                Text(f"no connector metrics on: {', '.join(missing)}; {ENABLE}", style="yellow")
            )
        else:
            note.update("")
        note.display = not have or bool(missing)
        self._tables(have, insts, h)
        pairs: list[tuple[str, Sequence[Cell]]] = [
            (
                f"{p.prefill}>{p.decode}",
                (
                    f"{p.prefill} → {p.decode}",
                    str(p.requests),
                    str(p.ok),
                    Text(str(p.errors), style="bold red" if p.errors else ""),
                    "-" if p.ttft_p50_ms is None else f"{p.ttft_p50_ms:.0f} ms",
                    "-" if p.overlap_p50_ms is None else f"{p.overlap_p50_ms:.0f} ms",
                ),
            )
            for p in snap.pairs
            if flt.matches({"instance": f"{p.prefill} {p.decode}"})
        ]
        self.query_one("#rdv-pairs", SyncTable).sync(pairs)

    def _tables(
        self, have: list[InstanceMetrics], insts: list[InstanceMetrics], h: History
    ) -> None:
        pre_rows: list[tuple[str, Sequence[Cell]]] = []
        dec_rows: list[tuple[str, Sequence[Cell]]] = []
        for i in have:
            r = i.rendezvous
            assert r is not None
            if i.role == "prefill":
                pre_rows.append(
                    (
                        i.name,
                        (
                            i.name,
                            fmt.count(r.registrations_waiting),
                            fmt.count(r.prefills_waiting),
                            fmt.count(r.writes_in_flight),
                            fmt.pct(r.registration_first_ratio),
                            fmt.ms_pair(r.match_wait.p50, r.match_wait.p99),
                            Text(
                                f"{r.expired:.0f}/{r.expired_window:.0f}",
                                style="bold yellow" if r.expired_window else "",
                            ),
                            fmt.spark(h.series(i.name, "writes"), 12),
                            fmt.ms(r.match_to_write_done.p99),
                        ),
                    )
                )
            else:
                dec_rows.append(
                    (
                        i.name,
                        (
                            i.name,
                            fmt.count(r.registrations_sent),
                            fmt.count(r.awaiting_notifications),
                            fmt.ms_pair(
                                r.registration_to_notified.p50, r.registration_to_notified.p99
                            ),
                            Text(
                                f"{r.receive_failures:.0f}",
                                style="bold red" if r.receive_failures else "",
                            ),
                            fmt.spark(h.series(i.name, "awaiting"), 12),
                        ),
                    )
                )
        stock_rows: list[tuple[str, Sequence[Cell]]] = []
        if not have:
            for i in insts:
                if i.role != "decode":
                    continue
                st, w = i.kv_fetch_by_stage, i.prompt_tokens_by_source_window
                stock_rows.append(
                    (
                        i.name,
                        (
                            i.name,
                            fmt.count(st.get("waiting_to_start")),
                            fmt.count(st.get("in_progress")),
                            fmt.count(st.get("completed_waiting")),
                            fmt.count(w.get("external_kv_transfer")),
                            fmt.count(w.get("local_compute")),
                        ),
                    )
                )
        for name, rows, shown in (
            ("#rdv-prefill", pre_rows, bool(have)),
            ("#rdv-decode", dec_rows, bool(have)),
            ("#rdv-stock", stock_rows, not have),
        ):
            table = self.query_one(name, SyncTable)
            table.display = shown
            if shown:
                table.sync(rows)

    def selected_instance(self) -> str | None:
        for name in ("#rdv-prefill", "#rdv-decode", "#rdv-stock"):
            t = self.query_one(name, SyncTable)
            if t.has_focus:
                return t.selected_key()
        return None
