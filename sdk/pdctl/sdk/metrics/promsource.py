"""Prometheus as the monitor's source: the series pdctl derives from, read with PromQL.

Instead of scraping every instance, :class:`PrometheusSource` asks the operator's
Prometheus three instant queries per update, whatever the number of instances:

* ``up`` over the selector: the instances (their ``instance`` and ``role`` labels, as the
  scrape configuration pdctl generates sets them) and which ones Prometheus reaches;
* the series the monitor reads (:data:`~pdctl.sdk.metrics.monitor.WANTED`) summed per
  instance, name and the labels the derivations look at, evaluated now;
* the same evaluated one window ago.

Each instance's two answers become two :class:`~pdctl.sdk.metrics.derive.Scrape` s, so
:class:`~pdctl.sdk.metrics.monitor.FleetMonitor` derives the same figures from them as
from its own scrapes. Prometheus answers an instant query with each series' latest sample
at or before the evaluation time (within its lookback), so the figures match direct
scraping within one scrape interval. The router's series keep their upstream in
``exported_instance``/``exported_role`` (the target's labels win); they are read back under
their own names.

Sans-IO apart from :meth:`PrometheusSource.collect`: :func:`queries` builds the PromQL,
:func:`round_of` turns Prometheus' JSON answers into a :class:`PromRound`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.metrics.derive import Scrape
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


def queries(
    prefixes: Sequence[str],
    selector: str = "",
    instance_label: str = "instance",
) -> tuple[str, str]:
    """(the ``up`` query, the series query) for ``selector``."""
    sel = selector_of(selector)
    extra = f", {sel}" if sel else ""
    by = ", ".join(("__name__", instance_label, *KEPT_LABELS, *EXPORTED))
    series = (
        f'sum by ({by}) ({{__name__=~"{name_regex(prefixes)}", __name__!~".*_created"{extra}}})'
    )
    return f"up{{{sel}}}", series


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


_RENAMED = tuple((k, k[len("exported_") :]) for k in EXPORTED)
_READ = tuple((k, k) for k in KEPT_LABELS) + _RENAMED


def _samples(result: list[dict[str, Any]], instance_label: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for r in result:
        metric = r.get("metric") or {}
        name, inst = metric.get("__name__"), metric.get(instance_label)
        if not name or not inst:
            continue
        try:
            value = float(r["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        raw = ",".join(f'{as_}="{_escape(metric[k])}"' for k, as_ in _READ if k in metric)
        lst = out.get(inst)
        if lst is None:
            out[inst] = lst = []
        lst.append(Sample(name, raw, value))
    return out


def round_of(
    up: Any,
    new: Any,
    old: Any,
    *,
    at: float,
    url: str,
    instance_label: str = "instance",
    role_label: str = "role",
    exprs: tuple[str, str] = ("up", "series"),
) -> PromRound:
    """A :class:`PromRound` from the JSON bodies of the three queries."""
    targets: list[Target] = []
    down: dict[str, str] = {}
    for r in _vector(up, exprs[0]):
        metric = r.get("metric") or {}
        name = metric.get(instance_label)
        if not name:
            continue
        targets.append(Target(name, metric.get(role_label, "colocated"), url))
        try:
            ok = float(r["value"][1]) == 1
        except (KeyError, IndexError, TypeError, ValueError):
            ok = False
        if not ok:
            down[name] = "Prometheus cannot scrape it (up == 0)"
    order = {"prefill": 0, "decode": 1, "colocated": 2, "router": 3}
    targets.sort(key=lambda t: (order.get(t.role, 2), t.name))
    return PromRound(
        at,
        tuple(targets),
        _samples(_vector(new, exprs[1]), instance_label),
        _samples(_vector(old, exprs[1]), instance_label),
        down,
        3,
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
    ) -> None:
        self.url = url.rstrip("/")
        self.selector = selector_of(selector)
        self.instance_label = instance_label
        self.role_label = role_label
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
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
        self, client: httpx.AsyncClient, at: float, window_s: float, prefixes: Sequence[str]
    ) -> PromRound:
        """The fleet at ``at`` and ``window_s`` before (three queries, concurrently)."""
        import asyncio

        up_q, series_q = queries(prefixes, self.selector, self.instance_label)
        up, new, old = await asyncio.gather(
            self._query(client, up_q, at),
            self._query(client, series_q, at),
            self._query(client, series_q, at - window_s),
        )
        rnd = round_of(
            up,
            new,
            old,
            at=at,
            url=self.url,
            instance_label=self.instance_label,
            role_label=self.role_label,
            exprs=(up_q, series_q),
        )
        if not rnd.targets:
            raise PrometheusError(
                f"no target of Prometheus at {self.url} matches {{{self.selector}}} "
                f"(up{{{self.selector}}} is empty): check --selector"
            )
        return rnd


def scrapes(rnd: PromRound, name: str, window_s: float) -> list[Scrape]:
    """The instance's scrapes for the monitor's window: [old, new], or [new] when
    Prometheus held nothing of it a window ago; [] when it has no data now."""
    new = rnd.new.get(name)
    if not new:
        return []
    old = rnd.old.get(name)
    out = [Scrape(old, rnd.at - window_s)] if old else []
    out.append(Scrape(new, rnd.at))
    return out
