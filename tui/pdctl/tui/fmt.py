"""Pure formatting for the TUI: numbers, units, text sparklines and request timelines.

Every function takes plain values and returns a ``str`` or a :class:`rich.text.Text`;
nothing here reads a clock or touches a widget. Missing values print as ``-``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from pdctl.sdk.router import flightrec as fr
from pdctl.sdk.router.bottleneck import PairVerdict

DASH = "-"
HEALTH_STYLE = {"UP": "green", "DOWN": "bold red", "STALE": "magenta"}
PROCESS_STYLE = {"backoff": "yellow", "failed": "bold red", "exited": "bold red"}
OUTCOME_STYLE = {"ok": "green", "error": "bold red", "cancelled": "yellow", "running": "cyan"}
BLOCKS = "▁▂▃▄▅▆▇█"


def ms(seconds: float | None) -> str:
    """Seconds shown as milliseconds (``-`` when unknown)."""
    if seconds is None:
        return DASH
    v = seconds * 1000
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def ms_pair(a: float | None, b: float | None) -> str:
    return f"{ms(a)}/{ms(b)}"


def num(v: float | None, digits: int = 1) -> str:
    return DASH if v is None else f"{v:.{digits}f}"


def count(v: float | None) -> str:
    return DASH if v is None else f"{v:.0f}"


def pct(v: float | None) -> str:
    """A 0..1 fraction as a percentage."""
    return DASH if v is None else f"{v * 100:.0f}%"


def size(v: float | None) -> str:
    """Bytes with a binary unit."""
    if v is None:
        return DASH
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return DASH  # unreachable


def rate(bps: float | None) -> str:
    """Bytes per second, scaled."""
    if bps is None:
        return DASH
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bps) >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} B/s"


def health(h: str, drained: bool = False) -> Text:
    t = Text(h, style=HEALTH_STYLE.get(h, ""))
    if drained:
        t.append(" drained", style="yellow")
    return t


def process(state: str, restarts: int = 0, next_restart_in_s: float | None = None) -> Text:
    """The supervisor's view of an instance: its state, ``↻N`` after N restarts, and the
    seconds left before a restart by policy."""
    label = state
    if next_restart_in_s is not None:
        label += f" {next_restart_in_s:.0f}s"
    if restarts:
        label += f" ↻{restarts}"
    return Text(label, style=PROCESS_STYLE.get(state, ""))


def spark(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as block characters scaled to their own range."""
    vals = [v for v in values[-width:] if not math.isnan(v)]
    if not vals:
        return " " * width
    lo, hi = min(vals), max(vals)
    span = hi - lo
    top = len(BLOCKS) - 1
    if span <= 0:
        level = 0 if hi == 0 else top // 2
        chars = BLOCKS[level] * len(vals)
    else:
        chars = "".join(BLOCKS[round((v - lo) / span * top)] for v in vals)
    return chars.rjust(width)


# ---------------------------------------------------------------------- timelines

SEGMENTS = (
    # (class, glyph, style, meaning): glyphs differ so the bar reads without colour
    ("router", "·", "dim", "router (and answers travelling through it)"),
    ("prefill", "█", "blue", "prefill queue + compute"),
    ("wait", "░", "magenta", "prefill done, waiting for decode's registration"),
    ("push", "▓", "yellow", "hand-offs around the WRITE: writer, notification, pick-up"),
    ("WRITE", "▒", "cyan", "NIXL's measured WRITE time"),
    ("decode", "▆", "green", "decode scheduling and first token"),
    ("decode, incl. wait", "▄", "green", "decode after prefill, not itemized"),
    ("stream", "─", "green", "rest of the answer"),
)

_CLASS = {
    fr.ROUTER: "router",
    fr.PREFILL_ANSWER: "router",
    fr.ROUTER_TO_DECODE: "router",
    fr.PREFILL_QUEUE: "prefill",
    fr.PREFILL: "prefill",
    fr.PREFILL_LEG: "prefill",
    fr.WAIT_REGISTRATION: "wait",
    fr.DECODE_ADMISSION: "wait",
    fr.REGISTRATION: "wait",
    fr.HANDOFF: "push",
    fr.NOTIFICATION: "push",
    fr.PICKUP: "push",
    fr.WRITE: "WRITE",
    fr.DECODE_SCHEDULE: "decode",
    fr.FIRST_TOKEN: "decode",
    fr.GENERATION: "decode",
    fr.DECODE: "decode",
    fr.DECODE_INCL_WAIT: "decode, incl. wait",
    fr.DECODE_INCL_READ: "decode, incl. wait",
    fr.STREAMING: "stream",
}


def segment_class(name: str) -> str:
    """The bar class of a flight-recorder segment (``decode, incl. wait`` if unknown)."""
    return _CLASS.get(name, "decode, incl. wait")


def phases(r: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """A requests entry as (class, start ms, end ms). The router's segments when it sent
    them; otherwise what its timeline alone shows: router, prefill leg, then decode
    including any wait (never called a transfer: nothing measured one)."""
    segs = r.get("segments")
    if isinstance(segs, list) and segs:
        return [
            (segment_class(str(s.get("name"))), float(s["start_ms"]), float(s["end_ms"]))
            for s in segs
            if isinstance(s, Mapping)
        ]
    sent = [v for v in (r.get("prefill_sent_ms"), r.get("decode_sent_ms")) if v is not None]
    first_leg = min(sent) if sent else None
    p0, p1 = r.get("prefill_sent_ms"), r.get("prefill_done_ms")
    fb, done = r.get("decode_first_byte_ms"), r.get("done_ms")
    out: list[tuple[str, float, float]] = []
    if first_leg is not None:
        out.append(("router", 0.0, first_leg))
    if p0 is not None and p1 is not None:
        out.append(("prefill", p0, p1))
    start = p1 if p1 is not None else first_leg
    if start is not None and fb is not None and fb > start:
        out.append(("decode, incl. wait" if p1 is not None else "decode", start, fb))
    start = fb if fb is not None else p1
    if start is not None and done is not None and done > start:
        out.append(("stream", start, done))
    return out


def timeline_bar(r: Mapping[str, Any], scale_ms: float, width: int) -> Text:
    """One request as a bar ``width`` cells wide, ``scale_ms`` long; a ``│`` marks the
    decode's first byte (its first token when streaming)."""
    cells = [" "] * width
    styles = [""] * width
    scale = scale_ms if scale_ms > 0 else 1.0

    def cell(t: float) -> int:
        return max(0, min(width - 1, int(t / scale * width)))

    glyph = {n: (g, s) for n, g, s, _ in SEGMENTS}
    for name, a, b in phases(r):
        g, s = glyph[name]
        end = max(cell(a) + 1, min(width, math.ceil(b / scale * width)))
        for i in range(cell(a), end):
            cells[i], styles[i] = g, s
    fb = r.get("decode_first_byte_ms")
    if fb is not None:
        i = cell(fb)
        cells[i], styles[i] = "│", "bold"
    t = Text()
    for c, s in zip(cells, styles, strict=True):
        t.append(c, style=s)
    return t


def legend() -> Text:
    t = Text("timeline: ")
    for name, g, s, _ in SEGMENTS:
        t.append(g * 2, style=s)
        t.append(f" {name}  ")
    t.append("│", style="bold")
    t.append(" first byte (TTFT)")
    return t


def ttft_split(stats: Mapping[str, Mapping[str, float]]) -> Text:
    """A pair's TTFT split: p50 of each segment (ms), in path order, glyph-marked."""
    t = Text()
    ttft = stats.get("ttft")
    if ttft is None:
        return t
    t.append(f"TTFT p50 {ttft['p50_ms']:.1f} ms = ", style="bold")
    glyph = {n: (g, s) for n, g, s, _ in SEGMENTS}
    first = True
    for name in fr.LEGEND:
        v = stats.get(name)
        if v is None or name == fr.STREAMING or v["p50_ms"] <= 0:
            continue
        g, s = glyph[segment_class(name)]
        t.append("" if first else " + ")
        t.append(g, style=s)
        t.append(f" {name} {v['p50_ms']:.1f}")
        first = False
    return t


BOTTLENECK_STYLE = {
    "prefill": "blue",
    "decode": "green",
    "transfer": "cyan",
    "router": "dim",
    "generation": "dim",
}


def bottleneck(v: PairVerdict, numbers: bool = True) -> Text:
    """One pair's verdict: the dominant part, its share, the advice, the numbers."""
    t = Text("  ⇒ ", style="bold")
    if v.bottleneck is None:
        t.append(v.advice, style="dim")
        return t
    t.append(f"{v.segment} {pct(v.share)}", style=f"bold {BOTTLENECK_STYLE.get(v.bottleneck, '')}")
    t.append(f": {v.advice}")
    if not numbers:
        return t
    shares = "  ".join(f"{g} {pct(s)}" for g, s in sorted(v.shares.items(), key=lambda x: -x[1]))
    t.append(f"\n     TTFT p50 {num(v.ttft_p50_ms)} ms over {v.requests} requests", style="dim")
    t.append(f" ({v.errors} errors); {shares}", style="dim")
    if v.transfer_bps is not None:
        t.append(f"; WRITE {rate(v.transfer_bps)}", style="dim")
    return t


def pair_matrix(
    rows: Sequence[str], cols: Sequence[str], cells: Mapping[tuple[str, str], PairVerdict]
) -> Table:
    """Prefills down, decodes across (:func:`pdctl.sdk.router.bottleneck.matrix`): each
    pair's TTFT p50, errors, transfer rate and what dominates."""
    title = "P→D pairs (prefill down, decode across): TTFT p50 · errors · WRITE rate · dominant"
    t = Table(title=title, title_justify="left", box=None, pad_edge=False)
    t.add_column("")
    for d in cols:
        t.add_column(d)
    for p in rows:
        row: list[Text | str] = [Text(p, style="bold")]
        for d in cols:
            v = cells.get((p, d))
            if v is None:
                row.append(Text("-", style="dim"))
                continue
            cell = Text(f"{num(v.ttft_p50_ms, 0)} ms · ")
            cell.append(f"{v.errors}", style="bold red" if v.errors else "")
            cell.append(f" · {rate(v.transfer_bps)} · ")
            cell.append(v.bottleneck or "?", style=BOTTLENECK_STYLE.get(v.bottleneck or "", ""))
            row.append(cell)
        t.add_row(*row)
    return t
