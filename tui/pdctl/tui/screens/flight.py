"""One request's flight: its TTFT split segment by segment, with what each one holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from pdctl.sdk.router import flightrec as fr
from pdctl.tui import fmt

WIDE = 120
"""Screens at least this wide show every column; narrower ones drop the start offset and
the clock, and name what the largest segment holds under the table instead of per row."""


def flight_table(r: Mapping[str, Any], wide: bool = True) -> Table:
    """Segments of one ``/v1/pdctl/requests`` entry: name, span, share of TTFT, whose
    clock measured it, and what it holds (the last two only when ``wide``)."""
    ttft = r.get("ttft_ms") or 0.0
    glyph = {n: (g, s) for n, g, s, _ in fmt.SEGMENTS}
    t = Table(box=None, pad_edge=False, expand=False)
    cols = [("", "left"), ("segment", "left")]
    cols += [("from", "right")] if wide else []
    cols += [("ms", "right"), ("of TTFT", "right")]
    cols += [("measured by", "left"), ("holds", "left")] if wide else []
    for col, justify in cols:
        t.add_column(col, justify=justify, no_wrap=col != "holds")  # type: ignore[arg-type]
    for s in r.get("segments") or ():
        ms = s["end_ms"] - s["start_ms"]
        g, style = glyph[fmt.segment_class(s["name"])]
        share = "" if s["name"] == fr.STREAMING or not ttft else f"{ms / ttft:.0%}"
        row: list[Any] = [Text(g * 2, style=style), s["name"]]
        row += [f"{s['start_ms']:.1f}"] if wide else []
        row += [f"{ms:.1f}", share]
        row += [s["source"], fr.LEGEND.get(s["name"], "")] if wide else []
        t.add_row(*row)
    return t


def largest_segment(r: Mapping[str, Any]) -> Text:
    """The segment that took most of the TTFT, and what it holds (one line)."""
    segs = [s for s in r.get("segments") or () if s["name"] != fr.STREAMING]
    if not segs:
        return Text()
    top = max(segs, key=lambda s: s["end_ms"] - s["start_ms"])
    t = Text("largest: ", style="dim")
    t.append(top["name"], style="bold")
    t.append(f" ({top['source']}'s clock) — {fr.LEGEND.get(top['name'], '')}")
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
        with VerticalScroll(id="flight"):
            yield Static(flight_summary(self.request))
            yield Static(id="flight-table")
            yield Static(id="flight-largest")
            yield Static(fmt.legend())
            yield Static(Text("Esc: back", style="dim"))

    def on_resize(self) -> None:
        wide = self.size.width >= WIDE
        self.query_one("#flight-table", Static).update(flight_table(self.request, wide))
        largest = self.query_one("#flight-largest", Static)
        largest.update(Text() if wide else largest_segment(self.request))
        largest.set_class(wide, "hidden")

    def action_close(self) -> None:
        self.dismiss(None)
