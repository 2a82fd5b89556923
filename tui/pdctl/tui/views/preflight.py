"""The topology preflight report for the spec's placement (run on demand), for people:
the verdict, each finding with its evidence and fix, every pair's KV path and the GB/s to
expect, what was not checked and why; ``j`` shows the raw JSON tree instead."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from pdctl.sdk.preflight.digest import Digest, digest
from pdctl.tui import fmt
from pdctl.tui.views.base import Frame, View

NOT_RUN = "preflight has not run yet: Ctrl+P → 'Run preflight' (or :preflight again)"
VERDICT_STYLE = {
    "OK": "bold green",
    "UNKNOWN": "bold yellow",
    "MARGINAL": "bold yellow",
    "UNLIKELY TO PAY OFF": "bold red",
    "DO NOT DISAGGREGATE": "bold red",
}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


class PreflightView(View):
    NAME = "preflight"
    KEY = "6"
    ALIASES = ("pf", "p", "topology")
    HINT = "the verdict, findings and fixes, KV paths · j: the raw JSON · Ctrl+P → Run preflight"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("j", "json", "JSON / summary")]

    def compose(self) -> ComposeResult:
        yield Static(NOT_RUN, id="pf-head", classes="note")
        with VerticalScroll(id="pf-body"):
            yield Static(id="pf-digest", classes="note")
        yield Tree("report", id="pf-tree")

    def on_mount(self) -> None:
        self._shown: object = None
        self._digest: Digest | None = None
        self.raw = False
        """Show the JSON tree instead of the summary."""
        self.query_one(Tree).display = False
        self.query_one("#pf-body").display = False

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._digest is not None:
            wide = self.size.width >= WIDE
            self.query_one("#pf-digest", Static).update(body(self._digest, wide))

    def action_json(self) -> None:
        self.raw = not self.raw
        self._place()

    def _place(self) -> None:
        has = self._shown is not None and getattr(self._shown, "report", None) is not None
        tree, body = self.query_one(Tree), self.query_one("#pf-body")
        tree.display = has and self.raw
        body.display = has and not self.raw
        (tree if self.raw else body).focus()

    def show(self, frame: Frame) -> None:
        res = frame.preflight
        if res is self._shown:
            return
        self._shown = res
        head = self.query_one("#pf-head", Static)
        if res is None or res.report is None:
            head.update(NOT_RUN if res is None else Text(res.message, style="yellow"))
            self._place()
            return
        self._digest = digest(res.report)
        head.update(headline(self._digest))
        self._draw()
        tree: Tree[Any] = self.query_one(Tree)
        tree.clear()
        tree.root.set_label("report")
        _fill(tree.root, res.report)
        tree.root.expand_all()
        self._place()


def headline(d: Digest) -> Text:
    t = Text("preflight ", style="bold")
    t.append(d.verdict, style=VERDICT_STYLE.get(d.verdict, "bold"))
    if d.mode:
        t.append(f"  mode {d.mode}")
    if d.host:
        t.append(f"  on {d.host}")
    if d.expected_throughput_bps is not None:
        t.append(f"  expect {fmt.rate(d.expected_throughput_bps)} per prefill")
    why = d.headline.removeprefix(d.verdict).removeprefix(": ")
    if why:
        t.append(f"\n{why}")
    return t


WIDE = 120
"""Narrower screens stack each finding (evidence, then the fix under it) and keep the
path table to the columns that decide."""


def body(d: Digest, wide: bool = True) -> RenderableType:  # noqa: C901 - one section each
    """Findings, KV paths, what was not checked, assumptions, how to measure."""
    parts: list[RenderableType] = []
    if d.findings:
        parts.append(Text("findings", style="bold"))
        if wide:
            t = Table(box=None, expand=True)
            t.add_column("", no_wrap=True)
            t.add_column("code", no_wrap=True)
            t.add_column("what was seen", ratio=3)
            t.add_column("what to do", ratio=2)
            for f in d.findings:
                t.add_row(
                    Text(f.severity, style=SEVERITY_STYLE.get(f.severity, "")),
                    f.code,
                    f.evidence + (f"  ({', '.join(f.pairs)})" if f.pairs else ""),
                    Text(f.fix or "-", style="" if f.fix else "dim"),
                )
            parts.append(t)
        else:
            for f in d.findings:
                line = Text(f"{f.severity} ", style=SEVERITY_STYLE.get(f.severity, ""))
                line.append(f.code, style="bold")
                if f.pairs:
                    line.append(f"  {', '.join(f.pairs)}")
                parts.append(line)
                parts.append(Padding(Text(f.evidence), (0, 0, 0, 2)))
                if f.fix:
                    parts.append(Padding(Text(f"→ {f.fix}", style="green"), (0, 0, 0, 2)))
        parts.append(Text())
    if d.paths:
        parts.append(Text("KV path per P→D pair", style="bold"))
        t = Table(box=None, expand=True)
        cols = ["pair", "path", "expect"]
        cols += ["computed with", "KV/rank"] if wide else []
        cols += ["transfer", "prefill", "verdict"]
        for col in cols:
            t.add_column(col, no_wrap=col in ("path", "expect", "KV/rank"))
        for p in d.paths:
            row: list[RenderableType] = [p.pair, p.path, _gbps(p.expected_gbps)]
            if wide:
                row += [f"{_gbps(p.bandwidth_gbps)} {p.bandwidth_source}".strip(), _mb(p.kv_bytes)]
            row += [_s(p.transfer_s), _s(p.prefill_s)]
            row.append(Text(p.verdict, style=VERDICT_STYLE.get(p.verdict, "")))
            t.add_row(*row)
        parts.append(t)
        for p in d.paths:
            notes = [p.detail, *p.assumptions]
            if not wide:
                notes.append(f"computed with {_gbps(p.bandwidth_gbps)} {p.bandwidth_source}")
                notes.append(f"KV per rank {_mb(p.kv_bytes)}")
            notes = [n for n in notes if n.strip()]
            if notes:
                parts.append(Text(f"  {p.pair}: " + "; ".join(notes), style="dim"))
        parts.append(Text())
    else:
        parts += [Text("no P→D pair moves KV through a checked path", style="dim"), Text()]
    if d.unchecked:
        parts.append(Text("not checked", style="bold"))
        for u in d.unchecked:
            line = Text(f"  {u.name} ", style="bold")
            line.append(f"({u.state}) ", style="yellow" if u.state == "error" else "dim")
            line.append(u.why)
            parts.append(line)
        parts.append(Text())
    for a in d.assumptions:
        parts.append(Text(f"assumed: {a}", style="dim"))
    if d.measure:
        parts.append(Text(d.measure, style="dim"))
    return Group(*parts)


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.1f} MB"


def _gbps(v: float | None) -> str:
    return "-" if v is None else f"{v:g} GB/s"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _fill(node: TreeNode[Any], value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                _fill(node.add(Text(str(k))), v)
            else:
                node.add_leaf(Text(f"{k}: {_scalar(v)}"))
    elif isinstance(value, list):
        for n, v in enumerate(value):
            if isinstance(v, dict | list) and v:
                _fill(node.add(Text(f"[{n}]")), v)
            else:
                node.add_leaf(Text(_scalar(v)))
    else:
        node.add_leaf(Text(_scalar(value)))


def _scalar(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
