"""The metric names a PromQL expression reads (for tests over the shipped dashboards and
alert rules): every ``name{...}`` selector, and each alternative of a
``__name__=~"a_(x|y)_total"`` matcher with one group."""

from __future__ import annotations

import re

from pdctl.sdk.observability.dashboards import dashboards
from pdctl.sdk.observability.rules import RuleOptions, expressions
from pdctl.sdk.spec import FleetSpec

_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")
_NAME_RE = re.compile(r'__name__=~"([^"]+)"')
_GROUP = re.compile(r"\(([^()]*)\)")


def metric_names(expr: str) -> set[str]:
    out = {m for m in _SELECTOR.findall(expr) if m != "__name__"}
    for pattern in _NAME_RE.findall(expr):
        g = _GROUP.search(pattern)
        if g is None:
            out.add(pattern)
            continue
        for alt in g.group(1).split("|"):
            out.add(pattern[: g.start()] + alt + pattern[g.end() :])
    return out


def shipped_names(spec: FleetSpec | None = None) -> dict[str, set[str]]:
    """Metric name -> where it is read ("dashboard uid / panel", "rule PA00x")."""
    out: dict[str, set[str]] = {}
    for d in dashboards():
        for p in d.panels:
            for q in p.queries:
                for n in metric_names(q.expr):
                    out.setdefault(n, set()).add(f"{d.uid} / {p.title}")
    if spec is not None:
        opt = RuleOptions(expected_throughput_bps=1e9)
        for code, expr in expressions(spec, opt).items():
            for n in metric_names(expr):
                out.setdefault(n, set()).add(f"rule {code}")
    return out


def counters(names: set[str] | dict[str, set[str]]) -> set[str]:
    """The counters among ``names`` (``*_total``, as Prometheus names them)."""
    return {n for n in names if n.endswith("_total")}
