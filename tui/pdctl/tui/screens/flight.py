"""One request's flight: its TTFT split segment by segment, with what each one holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from pdctl.sdk.router import flightrec as fr
from pdctl.tui import fmt


def flight_table(r: Mapping[str, Any]) -> Table:
    """Segments of one ``/v1/pdctl/requests`` entry: name, span, share of TTFT, whose
    clock measured it, and what it holds."""
    ttft = r.get("ttft_ms") or 0.0
    glyph = {n: (g, s) for n, g, s, _ in fmt.SEGMENTS}
    t = Table(box=None, pad_edge=False, expand=False)
    for col, justify in (
        ("", "left"),
        ("segment", "left"),
        ("from", "right"),
        ("ms", "right"),
        ("of TTFT", "right"),
        ("measured by", "left"),
        ("holds", "left"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in r.get("segments") or ():
        ms = s["end_ms"] - s["start_ms"]
        g, style = glyph[fmt.segment_class(s["name"])]
        share = "" if s["name"] == fr.STREAMING or not ttft else f"{ms / ttft:.0%}"
        t.add_row(
            Text(g * 2, style=style),
            s["name"],
            f"{s['start_ms']:.1f}",
            f"{ms:.1f}",
            share,
            s["source"],
            fr.LEGEND.get(s["name"], ""),
        )
    return t


def flight_summary(r: Mapping[str, Any]) -> Text:
    t = Text()
    t.append(f"{r.get('id')}  ", style="bold")
    t.append(f"{r.get('mode')}  {r.get('prefill') or '-'} → {r.get('decode') or '-'}  ")
    ttft = r.get("ttft_ms")
    t.append("TTFT " + ("-" if ttft is None else f"{ttft:.1f} ms"), style="bold")
    push = r.get("push") or {}
    if push.get("order"):
        t.append(f"\n{push['order']}, the first waited {push.get('wait_ms') or 0:.1f} ms")
    if push.get("write_ms") is not None:
        t.append(
            f"; WRITE {push['write_ms']:.2f} ms (NIXL), {fmt.size(push.get('bytes'))}, "
            f"{push.get('descriptors') or 0:.0f} descriptors"
        )
    if not r.get("segments"):
        t.append("\nno segments yet: the request is running or the router has none", style="dim")
    return t


class FlightScreen(ModalScreen[None]):
    """Esc or q closes."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "close", "Close")]

    def __init__(self, request: Mapping[str, Any]) -> None:
        super().__init__()
        self.request = request

    def compose(self) -> ComposeResult:
        with Vertical(id="flight"):
            yield Static(flight_summary(self.request))
            yield Static(flight_table(self.request))
            yield Static(fmt.legend())
            yield Static(Text("Esc: back", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
