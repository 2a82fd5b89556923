"""The topology preflight report for the spec's placement (run on demand)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from pdctl.tui.views.base import Frame, View

NOT_RUN = "preflight has not run yet: Ctrl+P → 'Run preflight' (or :preflight again)"
VERDICT_KEYS = ("verdict", "ok", "status", "summary")


class PreflightView(View):
    NAME = "preflight"
    KEY = "6"
    ALIASES = ("pf", "p", "topology")
    HINT = "topology report for this placement; Ctrl+P → Run preflight to refresh"

    def compose(self) -> ComposeResult:
        yield Static(NOT_RUN, id="pf-head", classes="note")
        yield Tree("report", id="pf-tree")

    def on_mount(self) -> None:
        self._shown: object = None
        self.query_one(Tree).display = False

    def show(self, frame: Frame) -> None:
        res = frame.preflight
        if res is self._shown:
            return
        self._shown = res
        head = self.query_one("#pf-head", Static)
        tree: Tree[Any] = self.query_one(Tree)
        if res is None:
            head.update(NOT_RUN)
            tree.display = False
            return
        if res.report is None:
            head.update(Text(res.message, style="yellow"))
            tree.display = False
            return
        t = Text("preflight report", style="bold")
        for k in VERDICT_KEYS:
            if k in res.report and not isinstance(res.report[k], dict | list):
                t.append(f"  {k}: {res.report[k]}")
        head.update(t)
        tree.clear()
        tree.root.set_label("report")
        _fill(tree.root, res.report)
        tree.root.expand_all()
        tree.display = True


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
