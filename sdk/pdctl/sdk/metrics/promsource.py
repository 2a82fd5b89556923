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

import gc
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import httpx

from pdctl.sdk.metrics.derive import Scrape, whole_window
from pdctl.sdk.metrics.promql import (
    AT,
    EXPORTED,
    FIGURE,
    HIST,
    KEPT_LABELS,
    QLABEL,
    PrometheusError,
    Queries,
    Trends,
    escape,
    queries,
    selector_of,
    trends_query,
    whole_query,
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
    if not isinstance(body, Mapping) or body.get("status") != "success":
        err = body.get("error") if isinstance(body, Mapping) else None
        raise PrometheusError(f"Prometheus refused {expr[:120]!r}: {err or 'not a result'}")
    data = body.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        raise PrometheusError(f"Prometheus answered {expr[:120]!r} with no range vector")
    out: Trends = {}
    for r in data.get("result") or ():
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


_READ = {k: k for k in KEPT_LABELS} | {k: k[len("exported_") :] for k in EXPORTED}


def _value(r: Mapping[str, Any]) -> float | None:
    try:
        return float(r["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _samples(
    result: list[dict[str, Any]], instance_label: str
) -> tuple[dict[str, Answers], dict[str, Answers]]:
    """(now, a window ago): each instance's series, by the :data:`AT` label, grouped by
    name as they are read (the scrapes index them as they are)."""
    new: dict[str, Answers] = {}
    old: dict[str, Answers] = {}
    read = _READ
    for r in result:
        try:
            metric = r["metric"]
            name, inst = metric["__name__"], metric[instance_label]
            value = float(r["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if not name or not inst:
            continue
        n = len(metric)
        at_old = n > 2 and metric.get(AT) == "old"
        # most series carry only their name and instance (and the mark): a bare value
        if n <= 2 + at_old:
            raw = ""
        else:
            raw = ",".join(f'{read[k]}="{escape(v)}"' for k, v in metric.items() if k in read and v)
        out = old if at_old else new
        got = out.get(inst)
        if got is None:
            out[inst] = got = Answers({}, {})
        values, samples = got
        if not raw and name not in values and name not in samples:
            values[name] = value
            continue
        lst = samples.get(name)
        if lst is None:
            samples[name] = lst = []
            if name in values:  # a second series of the name: both become samples
                lst.append(Sample(name, "", values.pop(name)))
        lst.append(Sample(name, raw, value))
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
        self.bytes_received = 0
        """The answers' bodies, in bytes (what an update costs to decode)."""

    async def _query(self, client: httpx.AsyncClient, expr: str, at: float) -> httpx.Response:
        """The instant query's answer, not decoded yet (:meth:`_json`)."""
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
        self.bytes_received += len(r.content)
        return r

    def _json(self, r: httpx.Response) -> Any:
        """An answer's JSON body (decode it with the collector paused: :func:`_gc_paused`)."""
        try:
            return r.json()
        except ValueError:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {r.status_code} with no JSON "
                "(is this a Prometheus server?)"
            ) from None

    async def trends(
        self,
        client: httpx.AsyncClient,
        end: float,
        points: int,
        step_s: float,
        window_s: float,
        completed: str,
        ttft: str,
    ) -> Trends:
        """The last ``points`` steps of the trends (:func:`trends_query`), in one range
        query: what the UI's sparklines would have drawn had it been running."""
        expr = trends_query(self.selector, self.instance_label, window_s, completed, ttft)
        self.queries_sent += 1
        start = end - (max(1, points) - 1) * step_s
        try:
            r = await client.post(
                self.url + "/api/v1/query_range",
                data={
                    "query": expr,
                    "start": f"{start:.3f}",
                    "end": f"{end:.3f}",
                    "step": f"{step_s!r}",
                },
                headers=self.headers,
                timeout=self.timeout_s,
            )
            body = r.json()
        except httpx.HTTPError as e:
            raise PrometheusError(f"Prometheus at {self.url} did not answer: {e}") from e
        except ValueError:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {r.status_code} with no JSON "
                "(is this a Prometheus server?)"
            ) from None
        return trends_of(body, expr, self.instance_label)

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
        answers = await asyncio.gather(*(self._query(client, q, at) for q in qs if q))
        # decoded and read with the collector off, the decoded bodies dropped before it
        # resumes: it never walks their hundreds of thousands of dicts and lists
        with _gc_paused():
            rnd = round_of(
                *(self._json(r) for r in answers),
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
        counts = [h + "_count" for h in (*histograms, *lengths)]
        need = [n for n in rnd.new if _whole(rnd, n, counts)]
        if not need:
            return rnd
        expr = whole_query(need, self.selector, inst, histograms, lengths)
        answer = await self._query(client, expr, at)
        with _gc_paused():
            whole = _quantiles(_vector(self._json(answer), expr), inst)
        return replace(rnd, whole=whole, queries=rnd.queries + 1)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic collector held off while large answers are decoded and read: decoding
    builds hundreds of thousands of dicts and lists, none of them cyclic, and each
    collection the allocations trigger walks all of them (at 512 instances that tripled
    the decoding's CPU time, benchmarks/promsource_scale.py); a collection right after,
    with the bodies still held, would walk them once more. Held off over synchronous code
    only (never across an ``await``); reference counting still frees everything; the
    collector resumes, if it ran, right after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _count(got: Answers | None, name: str) -> float | None:
    if got is None:
        return None
    v = got.values.get(name)
    if v is not None:
        return v
    found = got.samples.get(name)
    return None if not found else sum(s.value for s in found)


def _whole(rnd: PromRound, name: str, counts: Sequence[str]) -> bool:
    """Whether one of the instance's histograms (``counts``: their ``_count`` names)
    has its whole as its window (the rule of
    :func:`~pdctl.sdk.metrics.derive.whole_window`, on the answers' counts)."""
    new = rnd.new.get(name)
    old = rnd.old.get(name)
    for h in counts:
        c = _count(new, h)
        if c is None:
            continue
        before = _count(old, h)
        if before is None or c < before:
            return True
    return False


def scrapes(rnd: PromRound, name: str, window_s: float) -> list[Scrape]:
    """The instance's scrapes for the monitor's window: [old, new], or [new] when
    Prometheus held nothing of it a window ago; [] when it has no data now."""
    new = rnd.new.get(name)
    if new is None or not (new.values or new.samples):
        return []
    old = rnd.old.get(name)
    out = [Scrape.grouped(*old, rnd.at - window_s)] if old and (old.values or old.samples) else []
    if rnd.buckets:
        out.append(Scrape.grouped(*new, rnd.at))
        return out
    quantiles = dict(rnd.quantiles.get(name, {}))
    whole = rnd.whole.get(name, {})
    now = Scrape.grouped(*new, rnd.at, quantiles, rnd.bounds)
    before = out[0] if out else None
    for n in now.names():  # each histogram once (no name twice)
        if n.endswith("_count") and whole_window(now, before, h := n[: -len("_count")]):
            quantiles[h] = whole.get(h, {})  # the difference means nothing: the whole
    out.append(now)
    return out
