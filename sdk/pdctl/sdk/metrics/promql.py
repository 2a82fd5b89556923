"""The PromQL the Prometheus source sends: pure text builders, no I/O.

:func:`queries` builds one update's queries (the instances, their series, the
window's quantiles, the token-length bounds), :func:`whole_query` the quantiles of whole
histograms (instances that restarted in the window), :func:`trends_query` the range query
behind the UI's sparklines. Histograms are selected by exact name (Prometheus looks a
literal alternation up in its index) and summed per instance before any arithmetic.
:mod:`~pdctl.sdk.metrics.promsource` sends them and reads the answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pdctl.sdk.errors import PdctlError

KEPT_LABELS = ("le", "source", "stage", "order", "side", "reason", "state", "mode", "outcome")
"""The labels the derivations read (histogram buckets, token sources, KV-fetch stages,
rendezvous orders/sides/reasons, the router's index states, modes and outcomes); every
other label is summed away in Prometheus (engines, ranks, model names)."""
EXPORTED = ("exported_instance", "exported_role")
"""The router's own ``instance``/``role`` labels, as Prometheus renames them."""


class PrometheusError(PdctlError):
    """Prometheus could not answer, or answered something that is not a query result."""


def escape(v: str) -> str:
    """``v`` inside a PromQL double-quoted string."""
    if "\\" not in v and '"' not in v and "\n" not in v:
        return v
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector_of(selector: str) -> str:
    """``fleet="demo"`` or ``{fleet="demo"}`` → the matchers without braces."""
    s = selector.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if s and '"' not in s and "'" not in s:
        raise PrometheusError(
            f"--selector {selector!r}: give PromQL label matchers, e.g. 'fleet=\"demo\"'"
        )
    return s


def name_regex(prefixes: Iterable[str]) -> str:
    """A ``__name__`` regex for series whose names start with one of ``prefixes``."""
    return "|".join(re.escape(p).replace("\\:", ":") + ".*" for p in prefixes)


LATENCY_QUANTILES = (0.5, 0.9, 0.99)
"""The quantiles of every latency histogram (:class:`~pdctl.sdk.metrics.derive.Latency`)."""
LENGTH_QUANTILE = 0.95
"""The one quantile of a token-length histogram (:class:`~pdctl.sdk.metrics.derive.Lengths`)."""
HIST = "pdctl_h"
"""The label naming the histogram in the quantile answers (its name less ``_bucket``)."""
QLABEL = "pdctl_q"
CUMULATIVE = ("_total", "_sum", "_count", "_bucket")
"""The name endings of the series whose value a window ago is read (counters and
histograms); of the others (gauges) only the value now."""


class Queries(NamedTuple):
    """One update's PromQL (an empty one is not sent). ``series`` is sent as a range
    query of two steps, the window's ends (:func:`window_ms`); the others as instant
    queries at its end."""

    up: str
    series: str
    quantiles: str
    bounds: str


def window_ms(window_s: float) -> int:
    """The window in whole milliseconds (Prometheus' resolution), at least 1."""
    return max(1, round(window_s * 1000))


def _offset(window_s: float) -> str:
    return f"{window_ms(window_s)}ms"


def literals(values: Iterable[str]) -> str:
    """A PromQL regex (inside double quotes) matching exactly ``values``: Prometheus
    looks an alternation of literals up in its index instead of scanning every name."""
    return escape("|".join(re.escape(v) for v in values))


def _buckets(
    histograms: Sequence[str], extra: str, inst: str, offset: str = "", where: str = ""
) -> str:
    """Each histogram's buckets summed per instance (every other label pooled, as
    :meth:`~pdctl.sdk.metrics.derive.Scrape.histogram` pools engines and ranks), its
    name moved to :data:`HIST` so histograms of one instance stay apart in arithmetic."""
    sel = f'{{__name__=~"{literals(h + "_bucket" for h in histograms)}"{where}{extra}}}'
    summed = f"sum by (__name__, {inst}, le) ({sel}{offset})"
    return f'label_replace({summed}, "{HIST}", "$1", "__name__", "(.+)_bucket")'


def window_expr(histograms: Sequence[str], extra: str, inst: str, window_s: float) -> str:
    """Each bucket's increase per instance over the window ending at the evaluation time:
    its value now less its value ``window_s`` before (no extrapolation). Where a
    histogram has no value a window ago or its count fell (a restart) the difference
    means nothing; :func:`whole_query` asks for those histograms whole."""
    now = _buckets(histograms, extra, inst)
    ago = _buckets(histograms, extra, inst, f" offset {_offset(window_s)}")
    return f"({now} - {ago})"


def _quantiles_of(parts: Sequence[tuple[float, str]]) -> str:
    # NaN (no observation in the window) fails every comparison: only numbers come back
    return " or ".join(
        f'(label_replace(histogram_quantile({q!r}, {expr}), "{QLABEL}", "{q!r}", "", "") >= -Inf)'
        for q, expr in parts
    )


def queries(
    prefixes: Sequence[str],
    selector: str = "",
    instance_label: str = "instance",
    window_s: float = 60.0,
    histograms: Sequence[str] = (),
    lengths: Sequence[str] = (),
    buckets: bool = False,
) -> Queries:
    """The PromQL of one update for ``selector``: the series named by ``prefixes``, the
    window's :data:`LATENCY_QUANTILES` of ``histograms`` and :data:`LENGTH_QUANTILE` of
    ``lengths`` (the token-length histograms) with the latter's bounds. ``buckets``:
    every bucket series instead of the quantiles (pdctl computes them; two queries, the
    quantile and bound ones empty)."""
    sel = selector_of(selector)
    extra = f", {sel}" if sel else ""
    by = ", ".join(("__name__", instance_label, *KEPT_LABELS, *EXPORTED))
    names = f'__name__=~"{name_regex(prefixes)}"'
    skip = "_created" if buckets else "(_created|_bucket)"
    # one range query of two steps (the window's ends): each series once, with its value
    # at both ends, where an instant query would name every cumulative series twice
    series = f'sum by ({by}) ({{{names}, __name__!~".*{skip}"{extra}}})'
    if buckets:
        return Queries(f"up{{{sel}}}", series, "", "")
    parts: list[tuple[float, str]] = []
    if histograms:
        lat = window_expr(histograms, extra, instance_label, window_s)
        parts += [(q, lat) for q in LATENCY_QUANTILES]
    if lengths:
        parts.append((LENGTH_QUANTILE, window_expr(lengths, extra, instance_label, window_s)))
    bounds = (
        f'count by (__name__, le) ({{__name__=~"{literals(h + "_bucket" for h in lengths)}"'
        f"{extra}}})"
        if lengths
        else ""
    )
    return Queries(f"up{{{sel}}}", series, _quantiles_of(parts), bounds)


def whole_query(
    instances: Iterable[str],
    selector: str = "",
    instance_label: str = "instance",
    histograms: Sequence[str] = (),
    lengths: Sequence[str] = (),
) -> str:
    """The quantiles of the whole histograms of ``instances`` (those with a histogram
    that restarted in the window, or that Prometheus held nothing of a window ago)."""
    sel = selector_of(selector)
    extra = f", {sel}" if sel else ""
    where = f', {instance_label}=~"{literals(sorted(instances))}"'
    parts: list[tuple[float, str]] = []
    if histograms:
        lat = _buckets(histograms, extra, instance_label, where=where)
        parts += [(q, lat) for q in LATENCY_QUANTILES]
    if lengths:
        parts.append((LENGTH_QUANTILE, _buckets(lengths, extra, instance_label, where=where)))
    return _quantiles_of(parts)


FIGURE = "pdctl_f"
"""The label naming the figure in the trends' answer."""
Trends = dict[str, dict[str, list[tuple[float, float]]]]
"""Figure → instance → [(unix time, value)], oldest first."""


def trends_query(
    selector: str,
    instance_label: str,
    window_s: float,
    completed: str,
    ttft: str,
) -> str:
    """The PromQL of the trends the UI draws, for a range query: per instance, its
    request rate (``completed`` over the window, less its value a window before, per
    second) and its TTFT p50 (``ttft``'s buckets over the window, as
    :func:`window_expr`), each point computed as one update computes it. A point whose
    window holds a restart (the counter or the ``+Inf`` bucket fell) is left out."""
    sel = selector_of(selector)
    extra = f", {sel}" if sel else ""
    inst = instance_label
    c = f'{{__name__="{escape(completed)}"{extra}}}'
    off = _offset(window_s)
    rate = f"((sum by ({inst}) ({c}) - sum by ({inst}) ({c} offset {off})) / {window_s!r})"
    # a bucket that fell (a restart) is dropped; without its +Inf bucket, no answer
    p50 = f"histogram_quantile(0.5, {window_expr([ttft], extra, inst, window_s)} >= 0)"
    return (
        f'(label_replace({rate} >= 0, "{FIGURE}", "req_rate", "", ""))'
        f' or (label_replace({p50} >= 0, "{FIGURE}", "ttft_p50", "", ""))'
    )
