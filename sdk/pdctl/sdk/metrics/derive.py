"""Pure derivations over scraped samples: counters, gauges, histograms, windows.

A :class:`Scrape` indexes one payload by metric name; a window is two scrapes of the
same target (old, new). Counter deltas treat a decrease as a restart (the new value is
the increase since then), as Prometheus' ``rate`` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pdctl.sdk.metrics.promtext import Sample, total

Labels = tuple[tuple[str, str], ...]


class Scrape:
    """One payload: samples grouped by name, taken at ``at`` (monotonic seconds).

    ``quantiles``: where the window's quantiles were computed elsewhere (Prometheus'
    ``histogram_quantile``, see :mod:`~pdctl.sdk.metrics.promsource`), histogram base
    name → {q: value} for the window ending at this scrape; the payload then holds each
    histogram's ``_sum``/``_count`` but no buckets, and ``bounds`` gives the finite bucket
    bounds of the histograms whose bucket matters (:class:`Lengths`).

    A scrape made by :meth:`grouped` keeps its series of one unlabelled sample as bare
    values (most of what Prometheus answers: one sum per instance and name) and makes
    their :class:`Sample` s only if :attr:`by_name` is read."""

    __slots__ = ("_by_name", "_hists", "_totals", "_values", "at", "bounds", "quantiles")

    def __init__(
        self,
        samples: Iterable[Sample],
        at: float,
        quantiles: Mapping[str, Mapping[float, float]] | None = None,
        bounds: Mapping[str, tuple[float, ...]] | None = None,
    ) -> None:
        self.at = at
        self.quantiles = quantiles
        self.bounds = bounds
        self._by_name: dict[str, list[Sample]] = {}
        self._values: dict[str, float] = {}
        self._hists: dict[str, Histogram | None] = {}
        self._totals: dict[str, float | None] = {}
        by_name = self._by_name
        for s in samples:
            lst = by_name.get(s.name)
            if lst is None:
                by_name[s.name] = [s]
            else:
                lst.append(s)

    @classmethod
    def grouped(
        cls,
        values: dict[str, float],
        samples: dict[str, list[Sample]],
        at: float,
        quantiles: Mapping[str, Mapping[float, float]] | None = None,
        bounds: Mapping[str, tuple[float, ...]] | None = None,
    ) -> Scrape:
        """A scrape of series already grouped by name: ``values``, those of one sample
        without labels (name → value); ``samples``, the others (name → its samples, in
        their order). No name in both; both taken as they are, never changed."""
        self = cls((), at, quantiles, bounds)
        self._values = values
        self._by_name = samples
        return self

    @property
    def by_name(self) -> dict[str, list[Sample]]:
        """Every sample, by name."""
        if self._values:  # the bare values become samples, once
            merged = {n: [Sample(n, "", v)] for n, v in self._values.items()}
            merged.update(self._by_name)
            self._by_name, self._values = merged, {}
        return self._by_name

    def names(self) -> list[str]:
        """The names of the scrape's series (without making samples)."""
        return [*self._values, *self._by_name]

    def _samples(self, name: str) -> Sequence[Sample]:
        v = self._values.get(name)
        return self._by_name.get(name, ()) if v is None else (Sample(name, "", v),)

    def has(self, name: str) -> bool:
        return name in self._values or name in self._by_name

    def total(self, name: str, match: Mapping[str, str] | None = None) -> float | None:
        """Sum of the matching series (summing pools ranks/engines); None if absent.
        Sums over every series of a name are memoised (a scrape does not change)."""
        if match:
            return total(self._samples(name), name, match)
        v = self._values.get(name)
        if v is not None:
            return v
        if name in self._totals:
            return self._totals[name]
        found = self._by_name.get(name)
        v = None if not found else (found[0].value if len(found) == 1 else total(found, name))
        self._totals[name] = v
        return v

    def by_label(self, name: str, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self._samples(name):
            k = s.label(key)
            out[k] = out.get(k, 0.0) + s.value
        return out

    def histogram(self, base: str) -> Histogram | None:
        """The histogram ``base`` summed over every series (engines, ranks); memoised."""
        if base not in self._hists:
            self._hists[base] = self._histogram(base)
        return self._hists[base]

    def _histogram(self, base: str) -> Histogram | None:
        buckets = self._samples(base + "_bucket")
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
        """The φ-quantile by Prometheus' own method for classic histograms
        (``bucketQuantile`` in prometheus/promql/quantile.go), so a quantile pdctl
        computes from scraped buckets and one ``histogram_quantile`` computes over the
        same buckets are the same number: counts made monotonic (a lower bucket never
        counts more than a higher one), the rank taken from the ``+Inf`` bucket, linear
        within the bucket holding it from 0 (or the bucket below), the ``+Inf`` bucket
        answering with the highest finite bound. None without observations, or with
        fewer than two buckets or no ``+Inf`` bucket (Prometheus' NaN)."""
        b = self.buckets
        if len(b) < 2 or not math.isinf(b[-1][0]):
            return None
        cum, top = [], 0.0
        for _, c in b:
            top = max(top, c)
            cum.append(top)
        observations = cum[-1]
        if observations <= 0:
            return None
        rank = q * observations
        i = next(i for i, c in enumerate(cum) if c >= rank or i == len(cum) - 1)
        if i == len(cum) - 1:
            return b[-2][0]
        if i == 0 and b[0][0] <= 0:
            return b[0][0]
        start, below = (b[i - 1][0], cum[i - 1]) if i > 0 else (0.0, 0.0)
        if cum[i] == below:  # q = 0 on an empty lowest bucket: 0/0, Prometheus' NaN
            return None
        return start + (b[i][0] - start) * ((rank - below) / (cum[i] - below))

    @property
    def bounds(self) -> tuple[float, ...]:
        """The finite upper bounds, ascending."""
        return tuple(le for le, _ in self.buckets if not math.isinf(le))

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass(frozen=True)
class Digest:
    """A histogram window known by its quantiles (computed by Prometheus), its sum and
    count, and its finite bucket bounds: what the derivations read of a
    :class:`Histogram`, without the buckets."""

    quantiles: Mapping[float, float]
    sum: float
    count: float
    bounds: tuple[float, ...] = ()

    def quantile(self, q: float) -> float | None:
        """The quantile Prometheus computed; None without observations, or for a q it
        was not asked for."""
        if self.count <= 0:
            return None
        return self.quantiles.get(q)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


Window = Histogram | Digest
"""A histogram over a window: from buckets (direct scraping) or from Prometheus."""


def whole_window(new: Scrape, old: Scrape | None, base: str) -> bool:
    """Whether the window of histogram ``base`` is all of ``new``: nothing of it in
    ``old``, or its count fell (the instance restarted), as :meth:`Histogram.minus`."""
    count = new.total(base + "_count")
    old_count = old.total(base + "_count") if old is not None else None
    return count is not None and (old_count is None or count < old_count)


def window_of(new: Scrape, old: Scrape | None, base: str) -> Window | None:
    """The histogram ``base`` over the window from ``old`` to ``new`` (all of ``new``
    without ``old``, or when its count fell: the instance restarted); None if absent."""
    if new.quantiles is None:
        h = new.histogram(base)
        if h is None or old is None:
            return h
        return h.minus(old.histogram(base))
    counted = _counted(new, old, base)
    if counted is None:
        return None
    return Digest(
        new.quantiles.get(base, {}),
        counted[1],
        counted[0],
        new.bounds.get(base, ()) if new.bounds is not None else (),
    )


def _counted(new: Scrape, old: Scrape | None, base: str) -> tuple[float, float] | None:
    """The window's (count, sum) of histogram ``base`` from its ``_count`` and ``_sum``
    (all of ``new`` when :func:`whole_window`); None without a count."""
    count = new.total(base + "_count")
    if count is None:
        return None
    total = new.total(base + "_sum") or 0.0
    if old is not None:
        before = old.total(base + "_count")
        if before is not None and not count < before:  # not whole_window(new, old, base)
            count -= before
            total -= old.total(base + "_sum") or 0.0
    return count, total


@dataclass(frozen=True)
class Latency:
    """Percentiles of a histogram window (seconds); ``None`` without observations."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: float = 0.0

    @classmethod
    def of(cls, h: Window | None) -> Latency:
        if h is None:
            return cls()
        return cls(h.quantile(0.5), h.quantile(0.9), h.quantile(0.99), h.mean, h.count)


def latency_of(new: Scrape, old: Scrape | None, base: str) -> Latency:
    """``Latency.of(window_of(new, old, base))``, without the :class:`Digest` in between
    where Prometheus computed the quantiles (the same figures: one call per histogram
    of every instance of every update)."""
    quantiles = new.quantiles
    if quantiles is None:
        return Latency.of(window_of(new, old, base))
    counted = _counted(new, old, base)
    if counted is None:
        return Latency()
    count, total = counted
    if count <= 0:
        return Latency(count=count)
    q = quantiles.get(base)
    if not q:
        return Latency(mean=total / count, count=count)
    return Latency(q.get(0.5), q.get(0.9), q.get(0.99), total / count, count)


@dataclass(frozen=True)
class Lengths:
    """Tokens per request in a histogram window (vLLM's ``request_prompt_tokens`` and
    ``request_generation_tokens``). The mean is exact (sum / count). ``p95`` is
    interpolated within vLLM's 1-2-5 buckets and given only when its bucket lies wholly
    above the mean: otherwise the buckets cannot tell it from the mean (None). Its
    bucket's lower edge is the highest finite bound below it (so a p95 at the highest
    finite bound, where Prometheus answers for the ``+Inf`` bucket, has the bound under
    that as its floor), read the same way from buckets and from Prometheus' answer."""

    mean: float | None = None
    p95: float | None = None
    count: float = 0.0

    @classmethod
    def of(cls, h: Window | None) -> Lengths:
        if h is None or h.count <= 0:
            return cls()
        mean = h.sum / h.count
        p95 = h.quantile(0.95)
        if p95 is None:
            return cls(mean, None, h.count)
        floor = max((b for b in h.bounds if b < p95), default=0.0)
        return cls(mean, p95 if floor >= mean else None, h.count)


def counter_delta(new: float | None, old: float | None) -> float | None:
    """Increase of a counter between two scrapes; a decrease means it restarted."""
    if new is None:
        return None
    if old is None:
        return None
    return new if new < old else new - old
