"""KV transfers, from the WRITE initiators (prefill in push mode, decode in pull), and per
P->D pair: the requests that pushed KV, the digest check's results and the router's
output canary, each figure named with where it comes from."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Sparkline, Static

from pdctl.sdk.metrics.monitor import PairMetrics, Snapshot
from pdctl.tui import fmt
from pdctl.tui.history import FLEET
from pdctl.tui.views.base import Frame, View
from pdctl.tui.widgets import Cell, Column, SyncTable

COLUMNS = (
    Column("name", "initiator", 16),
    Column("moved", "KV moved", 10),
    Column("rate", "rate", 10),
    Column("xfer", "xfer p50/99 ms", 14),
    Column("post", "post p50/99", 11),
    Column("desc", "desc/xfer", 9, wide=3),
    Column("per", "bytes/req", 10, wide=4),
    Column("fail", "failed", 6),
    Column("expired", "expired", 7, wide=5),
    Column("expect", "vs expected", 11, wide=1),
    Column("trend", "rate trend", 14, wide=2),
)

PAIR_COLUMNS = (
    Column("pair", "P → D pair", 22),
    Column("pushed", "pushed", 7),
    Column("verify", "verify ok/bad/skip", 18),
    Column("dcheck", "D check ok/bad/miss/unsup", 25, wide=2),
    Column("canary", "canary match/diff/tie/err", 25),
)
PAIR_SOURCES = (
    "pushed, verify: the window's requests, from their flights (router); D check: the "
    "decode's pdctl:kv_verify_total since start, every pair into it; canary: the router's "
    "pdctl_router_canary_total since start"
)
CANARY_OFF = "off (router.canary.rate = 0)"


def _counts(values: Sequence[float | int], bad: int) -> Text:
    """``a/b/c`` with the ``bad``-th figure red when it is not 0."""
    out = Text()
    for k, v in enumerate(values):
        if k:
            out.append("/")
        out.append(f"{v:.0f}", style="bold red" if k == bad and v else "")
    return out


def pair_row(p: PairMetrics, snap: Snapshot) -> tuple[Cell, ...]:
    """One P->D pair's transfers, digest check and canary figures."""
    v = p.kv_verify
    pushed: Cell = str(p.transfers) if v else "-"
    verify: Cell = _counts([v.get(k, 0) for k in ("ok", "mismatch", "unsampled")], 1) if v else "-"
    dcheck: Cell = "-"
    try:
        rv = snap.instance(p.decode).rendezvous
    except KeyError:
        rv = None
    if rv is not None and rv.kv_verify is not None:
        kv = rv.kv_verify
        dcheck = _counts([kv.get(k, 0.0) for k in ("ok", "mismatch", "missing", "unsupported")], 1)
    c = p.canary
    canary: Cell = _counts([c.get(k, 0.0) for k in ("match", "diverged", "tied", "error")], 1)
    if not c:
        canary = CANARY_OFF if snap.router is not None else "-"
    return (f"{p.prefill} → {p.decode}", pushed, verify, dcheck, canary)


class TransfersView(View):
    NAME = "transfers"
    KEY = "3"
    ALIASES = ("xfer", "t", "kv")
    HINT = "NIXL figures are recorded by the WRITE initiator, pooled over its TP ranks"

    def compose(self) -> ComposeResult:
        yield Static(id="xfer-head", classes="note")
        yield Sparkline([], id="xfer-spark", summary_function=max)
        yield SyncTable(COLUMNS, id="xfer-table")
        yield Static(PAIR_SOURCES, id="xfer-pairs-note", classes="note")
        yield SyncTable(PAIR_COLUMNS, id="xfer-pairs")

    def show(self, frame: Frame) -> None:
        snap, h = frame.update.snapshot, frame.history
        s = snap.summary
        expected = frame.expected_bps
        head = Text()
        head.append("KV moved ", style="bold")
        head.append(fmt.size(s.kv_bytes_moved))
        head.append("  now ", style="bold")
        head.append(fmt.rate(s.transfer_bps))
        head.append("  expected ", style="bold")
        head.append(fmt.rate(expected) if expected else "unknown (run preflight, or --expect-gbps)")
        self.query_one("#xfer-head", Static).update(head)
        self.query_one("#xfer-spark", Sparkline).data = h.series(FLEET, "kv_rate")
        rows: list[tuple[str, Sequence[Cell]]] = []
        initiators = [i for i in snap.instances if i.transfers.bytes_total is not None]
        # the side that never initiates (decode in push mode) reports zeros: leave it out
        moving = [i for i in initiators if i.transfers.bytes_total] or initiators
        for i in moving:
            tr = i.transfers
            if not frame.filter.matches({"instance": i.name, "role": i.role}):
                continue
            failed = (tr.failed_transfers or 0) + (tr.failed_notifications or 0)
            vs: Cell = "-"
            if expected and tr.throughput_bps is not None and tr.transfers_window:
                ratio = tr.throughput_bps / expected
                vs = Text(f"{ratio:.0%}", style="bold yellow" if ratio < 0.25 else "green")
            rows.append(
                (
                    i.name,
                    (
                        i.name,
                        fmt.size(tr.bytes_total),
                        fmt.rate(tr.throughput_bps),
                        fmt.ms_pair(tr.xfer_time.p50, tr.xfer_time.p99),
                        fmt.ms_pair(tr.post_time.p50, tr.post_time.p99),
                        fmt.num(tr.descriptors_per_transfer),
                        fmt.size(tr.bytes_per_request),
                        Text(f"{failed:.0f}", style="bold red" if tr.failed_window else ""),
                        f"{tr.expired_leases or 0:.0f}",
                        vs,
                        fmt.spark(h.series(i.name, "kv_rate"), 12),
                    ),
                )
            )
        self.query_one("#xfer-table", SyncTable).sync(rows)
        pairs = [
            (f"{p.prefill}>{p.decode}", pair_row(p, snap))
            for p in snap.pairs
            if frame.filter.matches({"instance": f"{p.prefill} {p.decode}"})
        ]
        self.query_one("#xfer-pairs", SyncTable).sync(pairs)

    def selected_instance(self) -> str | None:
        return self.query_one("#xfer-table", SyncTable).selected_key()
