"""A minimal Prometheus registry for the router: counters, gauges, histograms, text output.

Observing is a dict lookup and a few additions (no locks: the router is single-threaded
asyncio), cheap enough for the per-request path.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence

LabelValues = tuple[str, ...]

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
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for lv, v in sorted(self.values.items()):
            out.append(f"{self.name}{_labels(self.labelnames, lv)} {_fmt(v)}")
        return out


class Gauge:
    """Values come from a callback at exposition time (always current, never stale)."""

    def __init__(
        self,
        name: str,
        help_: str,
        labels: Sequence[str],
        collect: Callable[[], dict[LabelValues, float]],
    ) -> None:
        self.name, self.help, self.labelnames, self.collect = name, help_, tuple(labels), collect

    def expose(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        for lv, v in sorted(self.collect().items()):
            out.append(f"{self.name}{_labels(self.labelnames, lv)} {_fmt(v)}")
        return out


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
            s = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        s[bisect.bisect_left(self.bounds, value)] += 1  # last slot before sum is +Inf
        s[-2] += value
        s[-1] += 1

    def expose(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for lv, s in sorted(self.series.items()):
            acc = 0.0
            for i, b in enumerate((*self.bounds, float("inf"))):
                acc += s[i]
                out.append(
                    f"{self.name}_bucket{_labels(self.labelnames, lv, f'le={_q(_fmt(b))}')} "
                    f"{_fmt(acc)}"
                )
            out.append(f"{self.name}_sum{_labels(self.labelnames, lv)} {_fmt(s[-2])}")
            out.append(f"{self.name}_count{_labels(self.labelnames, lv)} {_fmt(s[-1])}")
        return out


def _q(v: str) -> str:
    return f'"{v}"'


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
    ) -> Gauge:
        g = Gauge(name, help_, labels, collect)
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

    def expose(self) -> bytes:
        lines: list[str] = []
        for m in self.metrics:
            lines.extend(m.expose())
        return ("\n".join(lines) + "\n").encode()
