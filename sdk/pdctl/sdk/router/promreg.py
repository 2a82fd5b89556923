"""A minimal Prometheus registry for the router: counters, gauges, histograms, text output.

Observing is a dict lookup and a few additions (no locks: the router is single-threaded
asyncio), cheap enough for the per-request path. :meth:`Registry.snapshot` gives the
values as plain data (what a router worker sends its parent, :mod:`.merge` adds up) and
:func:`expose_snapshot` writes such data as Prometheus text: one writer for both.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

LabelValues = tuple[str, ...]
GaugeMerge = Literal["sum", "max", "min"]
"""How a gauge of several router workers becomes one: ``sum`` (requests in flight), ``max``
(1 while any worker sees it: a breaker open), ``min`` (1 while every worker sees it: up)."""
Snapshot = list[dict[str, Any]]

DEFAULT_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


def _fmt(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if v != int(v) else f"{int(v)}.0"


def _labels(names: Sequence[str], values: LabelValues, extra: str = "") -> str:
    parts = [f'{n}="{v}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Counter:
    def __init__(self, name: str, help_: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.labelnames = name, help_, tuple(labels)
        self.values: dict[LabelValues, float] = {}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + by

    def prime(self, *label_values: Iterable[str]) -> None:
        """Export every combination of the known label values at 0 (one iterable per
        label, in label order), so dashboards and alerts see 0 before the first event
        rather than no series (Prometheus' instrumentation guidance)."""
        if len(label_values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label(s) to prime")
        for combo in itertools.product(*(tuple(v) for v in label_values)):
            self.values.setdefault(combo, 0.0)

    def expose(self) -> list[str]:
        return expose_family(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        return _family(self, "counter", [[list(lv), v] for lv, v in self.values.items()])


class Gauge:
    """Values come from a callback at exposition time (always current, never stale)."""

    def __init__(
        self,
        name: str,
        help_: str,
        labels: Sequence[str],
        collect: Callable[[], dict[LabelValues, float]],
        merge: GaugeMerge = "sum",
    ) -> None:
        self.name, self.help, self.labelnames, self.collect = name, help_, tuple(labels), collect
        self.merge: GaugeMerge = merge

    def expose(self) -> list[str]:
        return expose_family(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        fam = _family(self, "gauge", [[list(lv), v] for lv, v in self.collect().items()])
        fam["merge"] = self.merge
        return fam


class Histogram:
    def __init__(
        self,
        name: str,
        help_: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        self.name, self.help, self.labelnames = name, help_, tuple(labels)
        self.bounds = tuple(buckets)
        self.series: dict[LabelValues, list[float]] = {}  # bucket counts..., sum, count

    def observe(self, value: float, *labels: str) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0.0] * (len(self.bounds) + 3)  # buckets, +Inf, sum, count
        s[bisect.bisect_left(self.bounds, value)] += 1  # last slot before sum is +Inf
        s[-2] += value
        s[-1] += 1

    def prime(self, *label_values: Iterable[str]) -> None:
        """Export every combination of the known label values as an empty histogram
        (one iterable per label; none for a histogram without labels), as
        :meth:`Counter.prime` does for counters."""
        if len(label_values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label(s) to prime")
        for combo in itertools.product(*(tuple(v) for v in label_values)):
            self.series.setdefault(combo, [0.0] * (len(self.bounds) + 3))

    def expose(self) -> list[str]:
        return expose_family(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        fam = _family(self, "histogram", [[list(lv), list(s)] for lv, s in self.series.items()])
        fam["bounds"] = list(self.bounds)
        return fam


def _family(m: Counter | Gauge | Histogram, kind: str, samples: list[Any]) -> dict[str, Any]:
    return {
        "name": m.name,
        "help": m.help,
        "type": kind,
        "labels": list(m.labelnames),
        "samples": samples,
    }


def _q(v: str) -> str:
    return f'"{v}"'


def expose_family(fam: dict[str, Any]) -> list[str]:
    """One metric family of a snapshot as Prometheus text lines (samples sorted by label
    values). A histogram sample is its bucket counts (not cumulative), sum, count."""
    name, names = fam["name"], tuple(fam["labels"])
    out = [f"# HELP {name} {fam['help']}", f"# TYPE {name} {fam['type']}"]
    samples = sorted((tuple(lv), v) for lv, v in fam["samples"])
    if fam["type"] != "histogram":
        out.extend(f"{name}{_labels(names, lv)} {_fmt(v)}" for lv, v in samples)
        return out
    bounds = (*fam["bounds"], float("inf"))
    for lv, s in samples:
        acc = 0.0
        for i, b in enumerate(bounds):
            acc += s[i]
            out.append(f"{name}_bucket{_labels(names, lv, f'le={_q(_fmt(b))}')} {_fmt(acc)}")
        out.append(f"{name}_sum{_labels(names, lv)} {_fmt(s[-2])}")
        out.append(f"{name}_count{_labels(names, lv)} {_fmt(s[-1])}")
    return out


def expose_snapshot(snapshot: Snapshot) -> bytes:
    """A snapshot (:meth:`Registry.snapshot`, or several merged) as Prometheus text."""
    lines: list[str] = []
    for fam in snapshot:
        lines.extend(expose_family(fam))
    return ("\n".join(lines) + "\n").encode()


class Registry:
    def __init__(self) -> None:
        self.metrics: list[Counter | Gauge | Histogram] = []

    def counter(self, name: str, help_: str, labels: Sequence[str] = ()) -> Counter:
        c = Counter(name, help_, labels)
        self.metrics.append(c)
        return c

    def gauge(
        self,
        name: str,
        help_: str,
        labels: Sequence[str],
        collect: Callable[[], dict[LabelValues, float]],
        merge: GaugeMerge = "sum",
    ) -> Gauge:
        """``merge``: how several router workers' values become one (:data:`GaugeMerge`)."""
        g = Gauge(name, help_, labels, collect, merge)
        self.metrics.append(g)
        return g

    def histogram(
        self,
        name: str,
        help_: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        h = Histogram(name, help_, labels, buckets)
        self.metrics.append(h)
        return h

    def snapshot(self) -> Snapshot:
        """Every metric's current values as plain (JSON-able) data."""
        return [m.snapshot() for m in self.metrics]

    def expose(self) -> bytes:
        return expose_snapshot(self.snapshot())
