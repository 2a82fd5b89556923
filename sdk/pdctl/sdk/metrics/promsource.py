"""Prometheus as the monitor's source: the series pdctl derives from, read with PromQL.

Instead of scraping every instance, :class:`PrometheusSource` asks the operator's
Prometheus four queries per update (one of them a range query), whatever the number of
instances:

* ``up`` over the selector: the instances (their ``instance`` and ``role`` labels, as the
  scrape configuration pdctl generates sets them) and which ones Prometheus reaches;
* the series the monitor reads (:data:`~pdctl.sdk.metrics.monitor.WANTED`) except
  histogram buckets, summed per instance, name and the labels the derivations look at,
  as a range query of two steps: each series once, with its value now and one window
  ago (of which the cumulative ones', ``_total``, ``_sum``, ``_count``, are read);
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

Sans-IO apart from :meth:`PrometheusSource.collect`: :func:`~pdctl.sdk.metrics.promql.
queries` builds the PromQL, :func:`~pdctl.sdk.metrics.promanswers.round_of` turns
Prometheus' JSON answers into a :class:`~pdctl.sdk.metrics.promanswers.PromRound`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx

from pdctl.sdk.metrics.derive import Scrape, whole_window
from pdctl.sdk.metrics.promanswers import Answers, PromRound, round_of, trends_of, whole_of
from pdctl.sdk.metrics.promql import (
    PrometheusError,
    Trends,
    queries,
    selector_of,
    trends_query,
    whole_query,
    window_ms,
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

    async def _query(
        self, client: httpx.AsyncClient, expr: str, at: float, steps_ms: int = 0
    ) -> httpx.Response:
        """The instant query's answer at ``at``, or with ``steps_ms`` the range query's
        at ``at`` and ``steps_ms`` before (two steps); not decoded yet (:meth:`_json`)."""
        self.queries_sent += 1
        end_ms = round(at * 1000)
        if steps_ms:
            path = "/api/v1/query_range"
            data = {
                "query": expr,
                "start": _seconds(end_ms - steps_ms),
                "end": _seconds(end_ms),
                "step": f"{steps_ms}ms",
            }
        else:
            path, data = "/api/v1/query", {"query": expr, "time": _seconds(end_ms)}
        try:
            r = await client.post(
                self.url + path, data=data, headers=self.headers, timeout=self.timeout_s
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
        at = round(at * 1000) / 1000  # Prometheus' resolution: the answers' time
        steps = window_ms(window_s)
        answers = await asyncio.gather(
            *(self._query(client, q, at, steps if q is qs.series else 0) for q in qs if q)
        )
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
                window_s=steps / 1000,
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
            whole = whole_of(self._json(answer), expr, inst)
        return replace(rnd, whole=whole, queries=rnd.queries + 1)


def _seconds(ms: int) -> str:
    """Milliseconds as Prometheus' decimal seconds, exactly."""
    return f"{ms // 1000}.{ms % 1000:03d}"


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
