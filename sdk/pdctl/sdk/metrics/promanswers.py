"""Prometheus' JSON answers to the Prometheus source's queries, read: sans-IO.

:func:`round_of` turns the bodies of one update's queries (:func:`~pdctl.sdk.metrics.
promql.queries`) into a :class:`PromRound`: the instances ``up`` lists and which ones
Prometheus reaches, each instance's series now and a window ago (the series query is a
range query whose two steps are the window's ends; a window ago only the cumulative
series are kept), the quantiles Prometheus computed and the token-length bounds.
:func:`trends_of` reads the trends' range query. Answers that are not what was asked for
raise :class:`~pdctl.sdk.metrics.promql.PrometheusError`; a series or point that is not
a number is skipped. :mod:`~pdctl.sdk.metrics.promsource` sends the queries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pdctl.sdk.metrics.promql import (
    CUMULATIVE,
    EXPORTED,
    FIGURE,
    HIST,
    KEPT_LABELS,
    QLABEL,
    PrometheusError,
    Queries,
    Trends,
    escape,
)
from pdctl.sdk.metrics.promtext import Sample
from pdctl.sdk.metrics.snapshot import Target

Quantiles = dict[str, dict[float, float]]
"""Histogram base name → {q: value}, for one instance's window."""


class Answers(NamedTuple):
    """One instance's series at one instant, by name (a :meth:`Scrape.grouped`)."""

    values: dict[str, float]
    """The series of one sample without labels: their values (most series)."""
    samples: dict[str, list[Sample]]
    """The others: their samples, in the answer's order."""


@dataclass(frozen=True)
class PromRound:
    """One update's worth of answers, per instance."""

    at: float
    """Unix time the newest answers were evaluated at."""
    targets: tuple[Target, ...]
    new: dict[str, Answers] = field(default_factory=dict)
    """Instance → its series now."""
    old: dict[str, Answers] = field(default_factory=dict)
    """Instance → its cumulative series a window ago."""
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


def trends_of(body: Any, expr: str, instance_label: str = "instance") -> Trends:
    """A range query's answer (a matrix) as :data:`Trends`."""
    out: Trends = {}
    for r in _result(body, expr, "matrix"):
        if not isinstance(r, Mapping):
            continue
        metric = r.get("metric") or {}
        inst, fig = metric.get(instance_label), metric.get(FIGURE)
        if not inst or not fig:
            continue
        points: list[tuple[float, float]] = []
        for pt in r.get("values") or ():
            try:
                t, v = float(pt[0]), float(pt[1])
            except (IndexError, TypeError, ValueError):
                continue
            if math.isfinite(v):
                points.append((t, v))
        out.setdefault(fig, {})[inst] = points
    return out


def _result(body: Any, expr: str, kind: str) -> list[dict[str, Any]]:
    if not isinstance(body, Mapping) or body.get("status") != "success":
        err = body.get("error") if isinstance(body, Mapping) else None
        raise PrometheusError(f"Prometheus refused {expr[:120]!r}: {err or 'not a result'}")
    data = body.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != kind:
        what = "instant vector" if kind == "vector" else "range vector"
        raise PrometheusError(f"Prometheus answered {expr[:120]!r} with no {what}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError(f"Prometheus answered {expr[:120]!r} without a result list")
    return result


def _vector(body: Any, expr: str) -> list[dict[str, Any]]:
    return _result(body, expr, "vector")


_READ = {k: k for k in KEPT_LABELS} | {k: k[len("exported_") :] for k in EXPORTED}


def _value(r: Mapping[str, Any]) -> float | None:
    try:
        return float(r["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _add(got: Answers, name: str, raw: str, value: float) -> None:
    """One series' value into its instance's answers: a bare value while it is the only
    series of its name without labels, else a :class:`Sample` (both, once a second one
    of the name comes)."""
    values, samples = got
    if not raw and name not in values and name not in samples:
        values[name] = value
        return
    lst = samples.get(name)
    if lst is None:
        samples[name] = lst = []
        if name in values:  # a second series of the name: both become samples
            lst.append(Sample(name, "", values.pop(name)))
    lst.append(Sample(name, raw, value))


def _samples(
    result: list[dict[str, Any]], instance_label: str, split: float
) -> tuple[dict[str, Answers], dict[str, Answers]]:
    """(now, a window ago): each instance's series from the range query's two steps
    (a point after ``split``, the window's middle, is now), grouped by name as they are
    read (the scrapes index them as they are); a window ago only the cumulative ones."""
    new: dict[str, Answers] = {}
    old: dict[str, Answers] = {}
    read = _READ
    for r in result:
        try:
            metric = r["metric"]
            name, inst = metric["__name__"], metric[instance_label]
            points = r["values"]
        except (KeyError, TypeError):
            continue
        if not name or not inst or not isinstance(points, list):
            continue
        # most series carry only their name and instance: a bare value
        if len(metric) <= 2:
            raw = ""
        else:
            raw = ",".join(f'{read[k]}="{escape(v)}"' for k, v in metric.items() if k in read and v)
        for point in points:
            try:
                t, value = point[0], float(point[1])
                now = t > split
            except (IndexError, TypeError, ValueError):
                continue
            if not now and not name.endswith(CUMULATIVE):
                continue
            out = new if now else old
            got = out.get(inst)
            if got is None:
                out[inst] = got = Answers({}, {})
            values = got.values
            if raw or name in values or name in got.samples:
                _add(got, name, raw, value)
            else:  # the common case, inline
                values[name] = value
    return new, old


def _quantiles(result: list[dict[str, Any]], instance_label: str) -> dict[str, Quantiles]:
    out: dict[str, Quantiles] = {}
    qs: dict[str, float | None] = {}  # the few quantile labels, parsed once
    for r in result:
        try:
            metric = r["metric"]
            inst, hist, q = metric[instance_label], metric[HIST], metric[QLABEL]
            value = float(r["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if not inst or not hist or not q:
            continue
        qf = qs[q] if q in qs else qs.setdefault(q, _float(q))
        if qf is None:
            continue
        per = out.get(inst)
        if per is None:
            out[inst] = per = {}
        h = per.get(hist)
        if h is None:
            per[hist] = h = {}
        h[qf] = value
    return out


def whole_of(body: Any, expr: str, instance_label: str = "instance") -> dict[str, Quantiles]:
    """The answer to :func:`~pdctl.sdk.metrics.promql.whole_query`: instance → the
    quantiles of its whole histograms."""
    return _quantiles(_vector(body, expr), instance_label)


def _float(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


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
    window_s: float = 60.0,
) -> PromRound:
    """A :class:`PromRound` from the JSON bodies of the four queries (two in bucket
    mode: ``exprs`` with no quantile query); ``series``: the range query's answer, its
    steps ``at`` and ``window_s`` before."""
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
    split = at - window_s / 2
    new, old = _samples(_result(series, ex.series, "matrix"), instance_label, split)
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
