"""Pure derivations over scraped samples: counters, gauges, histograms, windows.

A :class:`Scrape` indexes one payload by metric name; a window is two scrapes of the
same target (old, new). Counter deltas treat a decrease as a restart (the new value is
the increase since then), as Prometheus' ``rate`` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pdctl.sdk.metrics.promtext import Sample, total

Labels = tuple[tuple[str, str], ...]


class Scrape:
    """One payload: samples grouped by name, taken at ``at`` (monotonic seconds)."""

    __slots__ = ("_hists", "at", "by_name")

    def __init__(self, samples: Iterable[Sample], at: float) -> None:
        self.at = at
        self.by_name: dict[str, list[Sample]] = {}
        self._hists: dict[str, Histogram | None] = {}
        for s in samples:
            lst = self.by_name.get(s.name)
            if lst is None:
                self.by_name[s.name] = [s]
            else:
                lst.append(s)

    def has(self, name: str) -> bool:
        return name in self.by_name

    def total(self, name: str, match: Mapping[str, str] | None = None) -> float | None:
        """Sum of the matching series (summing pools ranks/engines); None if absent."""
        return total(self.by_name.get(name, ()), name, match)

    def by_label(self, name: str, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.by_name.get(name, ()):
            k = s.label(key)
            out[k] = out.get(k, 0.0) + s.value
        return out

    def histogram(self, base: str) -> Histogram | None:
        """The histogram ``base`` summed over every series (engines, ranks); memoised."""
        if base not in self._hists:
            self._hists[base] = self._histogram(base)
        return self._hists[base]

    def _histogram(self, base: str) -> Histogram | None:
        buckets = self.by_name.get(base + "_bucket")
        if not buckets:
            return None
        cum: dict[float, float] = {}
        for s in buckets:
            le = float(s.label("le", "+Inf"))
            cum[le] = cum.get(le, 0.0) + s.value
        return Histogram(
            tuple(sorted(cum.items())),
            self.total(base + "_sum") or 0.0,
            self.total(base + "_count") or 0.0,
        )


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count), ascending, ending with +Inf."""
    sum: float
    count: float

    def minus(self, old: Histogram | None) -> Histogram:
        """The observations since ``old`` (``self`` when old is None or a reset happened)."""
        if old is None or self.count < old.count or len(old.buckets) != len(self.buckets):
            return self
        return Histogram(
            tuple((le, c - oc) for (le, c), (_, oc) in zip(self.buckets, old.buckets, strict=True)),
            self.sum - old.sum,
            self.count - old.count,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket holding the rank;
        the +Inf bucket answers with the highest finite bound. None without data."""
        if self.count <= 0:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return prev_le
                if c == prev_c:
                    return le
                lower = prev_le if prev_le < le else 0.0
                return lower + (le - lower) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass(frozen=True)
class Latency:
    """Percentiles of a histogram window (seconds); ``None`` without observations."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: float = 0.0

    @classmethod
    def of(cls, h: Histogram | None) -> Latency:
        if h is None:
            return cls()
        return cls(h.quantile(0.5), h.quantile(0.9), h.quantile(0.99), h.mean, h.count)


@dataclass(frozen=True)
class Lengths:
    """Tokens per request in a histogram window (vLLM's ``request_prompt_tokens`` and
    ``request_generation_tokens``). The mean is exact (sum / count). ``p95`` is
    interpolated within vLLM's 1-2-5 buckets and given only when its bucket lies wholly
    above the mean: otherwise the buckets cannot tell it from the mean (None)."""

    mean: float | None = None
    p95: float | None = None
    count: float = 0.0

    @classmethod
    def of(cls, h: Histogram | None) -> Lengths:
        if h is None or h.count <= 0:
            return cls()
        mean = h.sum / h.count
        rank, floor = 0.95 * h.count, 0.0
        for le, c in h.buckets:
            if c >= rank:
                break
            floor = le
        p95 = h.quantile(0.95)
        return cls(mean, p95 if floor >= mean else None, h.count)


def counter_delta(new: float | None, old: float | None) -> float | None:
    """Increase of a counter between two scrapes; a decrease means it restarted."""
    if new is None:
        return None
    if old is None:
        return None
    return new if new < old else new - old
