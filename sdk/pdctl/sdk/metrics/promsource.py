"""Prometheus as the monitor's source: the series pdctl derives from, read with PromQL.

Instead of scraping every instance, :class:`PrometheusSource` asks the operator's
Prometheus four instant queries per update, whatever the number of instances:

* ``up`` over the selector: the instances (their ``instance`` and ``role`` labels, as the
  scrape configuration pdctl generates sets them) and which ones Prometheus reaches;
* the series the monitor reads (:data:`~pdctl.sdk.metrics.monitor.WANTED`) except
  histogram buckets, summed per instance, name and the labels the derivations look at,
  evaluated now, and the cumulative ones (``_total``, ``_sum``, ``_count``) evaluated one
  window ago too (``offset``);
* the window's quantiles of every histogram per instance, computed in Prometheus:
  ``histogram_quantile`` over each bucket's increase between the same two instants
  (:func:`window_expr`), so an instance answers with a few figures, not its ~300
  bucket series;
* the finite bucket bounds of the token-length histograms (one answer for the fleet),
  which :class:`~pdctl.sdk.metrics.derive.Lengths` needs to place its p95.

The window is the plain difference between the two instants, as pdctl's own window
between two scrapes (a bucket's ``increase()`` would extrapolate to the window's edges,
series by series, and differ). Where an instance's histogram count fell (a restart), its
window is the new histogram alone, as :meth:`~pdctl.sdk.metrics.derive.Histogram.minus`
does. ``histogram_quantile`` and :meth:`~pdctl.sdk.metrics.derive.Histogram.quantile`
are the same method (prometheus/promql/quantile.go), so the quantiles equal direct
scraping's on the same buckets up to float rounding.

Each instance's answers become two :class:`~pdctl.sdk.metrics.derive.Scrape` s (the
newer one carrying the quantiles), so :class:`~pdctl.sdk.metrics.monitor.FleetMonitor`
derives the same figures from them as from its own scrapes. Prometheus answers an instant
query with each series' latest sample at or before the evaluation time (within its
lookback), so the figures match direct scraping within one scrape interval. The router's
series keep their upstream in ``exported_instance``/``exported_role`` (the target's labels
win); they are read back under their own names.

Sans-IO apart from :meth:`PrometheusSource.collect`: :func:`queries` builds the PromQL,
:func:`round_of` turns Prometheus' JSON answers into a :class:`PromRound`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import httpx

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.metrics.derive import Scrape, whole_window
from pdctl.sdk.metrics.promtext import Sample
from pdctl.sdk.metrics.snapshot import Target

KEPT_LABELS = ("le", "source", "stage", "order", "side", "reason", "state", "mode", "outcome")
"""The labels the derivations read (histogram buckets, token sources, KV-fetch stages,
rendezvous orders/sides/reasons, the router's index states, modes and outcomes); every
other label is summed away in Prometheus (engines, ranks, model names)."""
EXPORTED = ("exported_instance", "exported_role")
"""The router's own ``instance``/``role`` labels, as Prometheus renames them."""


class PrometheusError(PdctlError):
    """Prometheus could not answer, or answered something that is not a query result."""


Quantiles = dict[str, dict[float, float]]
"""Histogram base name → {q: value}, for one instance's window."""


@dataclass(frozen=True)
class PromRound:
    """One update's worth of answers, per instance."""

    at: float
    """Unix time the newest answers were evaluated at."""
    targets: tuple[Target, ...]
    new: dict[str, list[Sample]] = field(default_factory=dict)
    old: dict[str, list[Sample]] = field(default_factory=dict)
    down: dict[str, str] = field(default_factory=dict)
    """Instance → why it has no data (Prometheus cannot scrape it)."""
    queries: int = 0
    quantiles: dict[str, Quantiles] = field(default_factory=dict)
    """Instance → its window's quantiles, as Prometheus computed them."""
    bounds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Histogram base name → its finite bucket bounds (the token-length histograms)."""
    buckets: bool = False
    """The answers hold every bucket (pdctl computes the quantiles)."""
    whole: dict[str, Quantiles] = field(default_factory=dict)
    """Instance → the quantiles of its whole histograms (:func:`whole_query`), for the
    histograms whose window is all they hold."""


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
AT = "pdctl_at"
"""The label marking the series evaluated one window ago."""


class Queries(NamedTuple):
    """One update's PromQL (an empty one is not sent)."""

    up: str
    series: str
    quantiles: str
    bounds: str


def _offset(window_s: float) -> str:
    return f"{max(1, round(window_s * 1000))}ms"


def literals(values: Iterable[str]) -> str:
    """A PromQL regex (inside double quotes) matching exactly ``values``: Prometheus
    looks an alternation of literals up in its index instead of scanning every name."""
    return _escape("|".join(re.escape(v) for v in values))


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
    if buckets:
        plain = f'{names}, __name__!~".*_created"{extra}'
        cumulative = f'{names}, __name__=~".*(_total|_sum|_count|_bucket)"{extra}'
    else:
        plain = f'{names}, __name__!~".*(_created|_bucket)"{extra}'
        cumulative = f'{names}, __name__=~".*(_total|_sum|_count)"{extra}'
    series = (
        f"sum by ({by}) ({{{plain}}}) or label_replace(sum by ({by}) "
        f'({{{cumulative}}} offset {_offset(window_s)}), "{AT}", "old", "", "")'
    )
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


def _vector(body: Any, expr: str) -> list[dict[str, Any]]:
    if not isinstance(body, Mapping) or body.get("status") != "success":
        err = body.get("error") if isinstance(body, Mapping) else None
        raise PrometheusError(f"Prometheus refused {expr[:120]!r}: {err or 'not a result'}")
    data = body.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector":
        raise PrometheusError(f"Prometheus answered {expr[:120]!r} with no instant vector")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError(f"Prometheus answered {expr[:120]!r} without a result list")
    return result


def _escape(v: str) -> str:
    if "\\" not in v and '"' not in v and "\n" not in v:
        return v
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_READ = {k: k for k in KEPT_LABELS} | {k: k[len("exported_") :] for k in EXPORTED}


def _value(r: Mapping[str, Any]) -> float | None:
    try:
        return float(r["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _samples(
    result: list[dict[str, Any]], instance_label: str
) -> tuple[dict[str, list[Sample]], dict[str, list[Sample]]]:
    """(now, a window ago): each instance's samples, by the :data:`AT` label."""
    new: dict[str, list[Sample]] = {}
    old: dict[str, list[Sample]] = {}
    read = _READ
    for r in result:
        metric = r.get("metric") or {}
        name, inst = metric.get("__name__"), metric.get(instance_label)
        if not name or not inst:
            continue
        value = _value(r)
        if value is None:
            continue
        raw = ",".join(f'{read[k]}="{_escape(v)}"' for k, v in metric.items() if k in read and v)
        out = old if metric.get(AT) == "old" else new
        lst = out.get(inst)
        if lst is None:
            out[inst] = lst = []
        lst.append(Sample(name, raw, value))
    return new, old


def _quantiles(result: list[dict[str, Any]], instance_label: str) -> dict[str, Quantiles]:
    out: dict[str, Quantiles] = {}
    for r in result:
        metric = r.get("metric") or {}
        inst, hist, q = metric.get(instance_label), metric.get(HIST), metric.get(QLABEL)
        value = _value(r)
        if not inst or not hist or not q or value is None:
            continue
        try:
            qf = float(q)
        except ValueError:
            continue
        out.setdefault(inst, {}).setdefault(hist, {})[qf] = value
    return out


def _bounds(result: list[dict[str, Any]]) -> dict[str, tuple[float, ...]]:
    found: dict[str, set[float]] = {}
    for r in result:
        metric = r.get("metric") or {}
        name, le = metric.get("__name__", ""), metric.get("le")
        if not name.endswith("_bucket") or le is None:
            continue
        try:
            b = float(le)
        except ValueError:
            continue
        if math.isfinite(b):
            found.setdefault(name[: -len("_bucket")], set()).add(b)
    return {k: tuple(sorted(v)) for k, v in found.items()}


def round_of(
    up: Any,
    series: Any,
    quantiles: Any = None,
    bounds: Any = None,
    *,
    at: float,
    url: str,
    instance_label: str = "instance",
    role_label: str = "role",
    exprs: Queries | None = None,
) -> PromRound:
    """A :class:`PromRound` from the JSON bodies of the four queries (two in bucket
    mode: ``exprs`` with no quantile query)."""
    ex = exprs or Queries("up", "series", "quantiles", "bounds")
    targets: list[Target] = []
    down: dict[str, str] = {}
    for r in _vector(up, ex.up):
        metric = r.get("metric") or {}
        name = metric.get(instance_label)
        if not name:
            continue
        targets.append(Target(name, metric.get(role_label, "colocated"), url))
        if _value(r) != 1:
            down[name] = "Prometheus cannot scrape it (up == 0)"
    order = {"prefill": 0, "decode": 1, "colocated": 2, "router": 3}
    targets.sort(key=lambda t: (order.get(t.role, 2), t.name))
    new, old = _samples(_vector(series, ex.series), instance_label)
    return PromRound(
        at,
        tuple(targets),
        new,
        old,
        down,
        sum(1 for q in ex if q),
        _quantiles(_vector(quantiles, ex.quantiles), instance_label) if ex.quantiles else {},
        _bounds(_vector(bounds, ex.bounds)) if ex.bounds else {},
        buckets=not ex.quantiles,
    )


class PrometheusSource:
    """Reads a fleet's series from the Prometheus at ``url`` (``selector``: PromQL label
    matchers naming the fleet, e.g. ``fleet="demo"``)."""

    def __init__(
        self,
        url: str,
        *,
        selector: str = "",
        instance_label: str = "instance",
        role_label: str = "role",
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        buckets: bool = False,
    ) -> None:
        """``buckets``: read every histogram bucket and compute the quantiles in pdctl
        (two queries, ~300 series per vLLM instance: for a Prometheus-compatible server
        that refuses the quantile query's size, or to check its ``histogram_quantile``);
        by default Prometheus computes them."""
        self.url = url.rstrip("/")
        self.selector = selector_of(selector)
        self.instance_label = instance_label
        self.role_label = role_label
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.buckets = buckets
        self.queries_sent = 0

    async def _query(self, client: httpx.AsyncClient, expr: str, at: float) -> Any:
        self.queries_sent += 1
        try:
            r = await client.post(
                self.url + "/api/v1/query",
                data={"query": expr, "time": f"{at:.3f}"},
                headers=self.headers,
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as e:
            raise PrometheusError(f"Prometheus at {self.url} did not answer: {e}") from e
        try:
            return r.json()
        except ValueError:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {r.status_code} with no JSON "
                "(is this a Prometheus server?)"
            ) from None

    async def collect(
        self,
        client: httpx.AsyncClient,
        at: float,
        window_s: float,
        prefixes: Sequence[str],
        histograms: Sequence[str] = (),
        lengths: Sequence[str] = (),
    ) -> PromRound:
        """The fleet over the window ending at ``at``: four queries, concurrently, and a
        fifth where some instance's histograms are whole (restarted in the window, or
        younger than it: their quantiles are asked for whole)."""
        import asyncio

        inst = self.instance_label
        qs = queries(prefixes, self.selector, inst, window_s, histograms, lengths, self.buckets)
        bodies = await asyncio.gather(*(self._query(client, q, at) for q in qs if q))
        rnd = round_of(
            *bodies,
            at=at,
            url=self.url,
            instance_label=inst,
            role_label=self.role_label,
            exprs=qs,
        )
        if not rnd.targets:
            raise PrometheusError(
                f"no target of Prometheus at {self.url} matches {{{self.selector}}} "
                f"(up{{{self.selector}}} is empty): check --selector"
            )
        if self.buckets:
            return rnd
        need = [n for n in rnd.new if _whole(rnd, n, window_s, (*histograms, *lengths))]
        if not need:
            return rnd
        expr = whole_query(need, self.selector, inst, histograms, lengths)
        whole = _quantiles(_vector(await self._query(client, expr, at), expr), inst)
        return replace(rnd, whole=whole, queries=rnd.queries + 1)


def _whole(rnd: PromRound, name: str, window_s: float, histograms: Sequence[str]) -> bool:
    new = Scrape(rnd.new.get(name, ()), rnd.at)
    old = Scrape(rnd.old[name], rnd.at - window_s) if name in rnd.old else None
    return any(whole_window(new, old, h) for h in histograms)


def scrapes(rnd: PromRound, name: str, window_s: float) -> list[Scrape]:
    """The instance's scrapes for the monitor's window: [old, new], or [new] when
    Prometheus held nothing of it a window ago; [] when it has no data now."""
    new = rnd.new.get(name)
    if not new:
        return []
    old = rnd.old.get(name)
    out = [Scrape(old, rnd.at - window_s)] if old else []
    if rnd.buckets:
        out.append(Scrape(new, rnd.at))
        return out
    quantiles = dict(rnd.quantiles.get(name, {}))
    whole = rnd.whole.get(name, {})
    now = Scrape(new, rnd.at, quantiles, rnd.bounds)
    before = out[0] if out else None
    for h in {h[: -len("_count")] for h in now.by_name if h.endswith("_count")}:
        if whole_window(now, before, h):
            quantiles[h] = whole.get(h, {})  # the difference means nothing: the whole
    out.append(now)
    return out
