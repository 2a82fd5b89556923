"""Latency of one layout at one load, from the fitted curves (pure; docs/plan.md).

* **Prompt lengths** are log-normal with the given median and p95; every figure is
  taken over a 40-point quantile grid of that distribution.
* **Prefill queueing** is M/G/1 (Poisson arrivals, FCFS, one prompt at a time per
  instance): mean wait ``λ·E[S²] / (2(1-rho))`` (Pollaczek-Khinchine); a request waits at
  all with probability rho (the load) and the wait is then taken as exponential (a standard tail
  approximation). TTFT's quantiles are those of wait + service (+ transfer + first decode
  step when disaggregated) over the grid.
* **Decode** runs a batch whose mean size follows Little's law (``N = λ·(osl-1)·gap``,
  solved as a fixed point) up to ``max_num_seqs``; the batch at a quantile is
  ``N + z·√N`` (Poisson).
* **Colocated interference**: prompts run as chunks of ``chunk_tokens`` inside decode
  steps; a step carrying a chunk takes the chunk's prefill time longer. The share of
  gaps that are such stalls, and how many stalls one request meets while it decodes
  (Poisson), give ITL and TPOT quantiles.
* **KV transfer** (disaggregated): bytes per TP rank / bandwidth + a fixed cost, after
  prefill; the link is an M/G/1 queue of transfers. Pull adds one router round trip.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from pdctl.sdk.plan.profile import Curves

GRID = 40
PULL_EXTRA_S = 0.005
"""Pull: the router's second request to decode after prefill answers (one round trip)."""
_Z = NormalDist()


@dataclass(frozen=True)
class Workload:
    isl: int
    osl: int
    rate: float
    isl_p95: int | None = None

    def lengths(self) -> list[float]:
        """Prompt lengths at the grid's quantiles (log-normal through median and p95)."""
        p95 = max(self.isl, self.isl_p95 or self.isl)
        sigma = math.log(p95 / self.isl) / _Z.inv_cdf(0.95) if p95 > self.isl else 0.0
        return [self.isl * math.exp(sigma * _Z.inv_cdf((i + 0.5) / GRID)) for i in range(GRID)]


@dataclass(frozen=True)
class Transfer:
    """KV transfer time for a prompt length: ``bytes_per_rank(L) / bps + overhead``."""

    bytes_per_token_rank: float
    bps: float
    overhead_s: float
    path: str
    source: str

    def seconds(self, tokens: float) -> float:
        return tokens * self.bytes_per_token_rank / self.bps + self.overhead_s


@dataclass
class Prediction:
    ttft_s: dict[str, float] = field(default_factory=dict)
    """p50 / p90 / p99."""
    itl_s: dict[str, float] = field(default_factory=dict)
    tpot_s: dict[str, float] = field(default_factory=dict)
    parts_s: dict[str, float] = field(default_factory=dict)
    """Median TTFT by component: wait, prefill, transfer, first_step."""
    prefill_load: float = 0.0
    decode_batch: float = 0.0
    link_load: float = 0.0
    stall_share: float = 0.0
    overloaded: str | None = None
    """Which stage cannot keep up (``prefill``, ``decode``, ``KV link``), if any."""


PCTS = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


@dataclass(frozen=True)
class Correction:
    """Live correction factors, observed / predicted p50 of the layout a fleet runs at
    its live rate (as Dynamo's SLA planner keeps them), applied to every prediction:
    TTFT and its parts scale by ``ttft``, ITL and TPOT by ``itl``. A factor that could
    not be measured (None) leaves its figures as the profile predicts them."""

    ttft: float | None
    itl: float | None
    layout: str
    """The layout the factors were measured on."""
    rate: float
    """The live rate (req/s) they were measured at."""
    window_s: float | None
    """Seconds of metrics they come from (None when unknown)."""

    def apply(self, pred: Prediction) -> Prediction:
        t, i = self.ttft or 1.0, self.itl or 1.0
        return replace(
            pred,
            ttft_s={k: v * t for k, v in pred.ttft_s.items()},
            parts_s={k: v * t for k, v in pred.parts_s.items()},
            itl_s={k: v * i for k, v in pred.itl_s.items()},
            tpot_s={k: v * i for k, v in pred.tpot_s.items()},
        )

    def words(self) -> str:
        def f(v: float | None) -> str:
            return "not measured" if v is None else f"x{v:.3g}"

        window = "" if self.window_s is None else f" over {self.window_s:.0f} s"
        return (
            f"TTFT {f(self.ttft)}, ITL {f(self.itl)} (observed / predicted on {self.layout} "
            f"at {self.rate:.3g} req/s{window})"
        )

    def as_dict(self) -> dict[str, float | str | None]:
        return {
            "ttft_factor": self.ttft,
            "itl_factor": self.itl,
            "layout": self.layout,
            "rate": self.rate,
            "window_s": self.window_s,
        }


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def mg1_wait_grid(lam: float, services: list[float]) -> tuple[list[float], float]:
    """Waiting times at the grid's quantiles, and the load rho; an overloaded queue gives inf."""
    es = sum(services) / len(services)
    es2 = sum(s * s for s in services) / len(services)
    rho = lam * es
    if rho >= 1:
        return [math.inf] * GRID, rho
    mean = lam * es2 / (2 * (1 - rho)) if lam > 0 else 0.0
    out = []
    for i in range(GRID):
        u = (i + 0.5) / GRID
        # P(W > w) = rho * exp(-w * rho / mean)
        out.append(0.0 if u <= 1 - rho or mean <= 0 else -(mean / rho) * math.log((1 - u) / rho))
    return out, rho


def _sum_quantiles(a: list[float], b: list[float]) -> list[float]:
    """Independent sum of two grids, as its own sorted sample."""
    return sorted(x + y for x in a for y in b)


def poisson_quantile(mean: float, q: float) -> float:
    if mean <= 0:
        return 0.0
    if mean > 50:
        return max(0.0, mean + _Z.inv_cdf(q) * math.sqrt(mean))
    k, p = 0, math.exp(-mean)
    cdf = p
    while cdf < q and k < 1000:
        k += 1
        p *= mean / k
        cdf += p
    return float(k)


def _batch(lam: float, osl: int, step: float, limit: int) -> tuple[float, bool]:
    """Mean decode batch by Little's law, capped at ``limit``; True when the cap binds."""
    n = lam * max(osl - 1, 0) * step
    return min(n, float(limit)), n > limit


def decode_fixed_point(
    curves: Curves, lam: float, osl: int, context: float, limit: int, slow: float = 1.0
) -> tuple[float, float, bool]:
    """(batch, step seconds, overloaded): ``N = λ·(osl-1)·g(N)·slow``."""
    n = 0.0
    capped = False
    for _ in range(200):
        step = curves.step_s(max(n, 1.0), context) * slow
        new, capped = _batch(lam, osl, step, limit)
        if abs(new - n) < 1e-9:
            break
        n = 0.5 * (n + new)
    return n, curves.step_s(max(n, 1.0), context), capped


def _batch_at(n: float, q: float, limit: int) -> float:
    return min(float(limit), max(1.0, n + _Z.inv_cdf(q) * math.sqrt(max(n, 0.0))))


def predict_colocated(curves: Curves, w: Workload, k: int, limit: int, chunk: int) -> Prediction:
    lam = w.rate / k
    lengths = w.lengths()
    context = w.isl + w.osl / 2
    chunks = [max(1, math.ceil(x / chunk)) for x in lengths]
    mean_chunks = sum(chunks) / len(chunks)
    pred = Prediction()
    n, step, slow, rho = 0.0, curves.step_s(1, context), 1.0, 0.0
    services: list[float] = []
    for _ in range(50):
        marginal = max(0.0, step - curves.step_s(0, context)) if n >= 1 else 0.0
        services = [
            curves.prefill_s(x) + c * marginal for x, c in zip(lengths, chunks, strict=True)
        ]
        rho = lam * sum(services) / len(services)
        if rho >= 1:
            break
        slow = 1 / (1 - rho)
        n2, step, _ = decode_fixed_point(curves, lam, w.osl, context, limit, slow)
        if abs(n2 - n) < 1e-6:
            n = n2
            break
        n = n2
    waits, rho = mg1_wait_grid(lam, services)
    pred.prefill_load, pred.decode_batch = rho, n
    if rho >= 1:
        pred.overloaded = "prefill"
        return _inf(pred)
    if lam * max(w.osl - 1, 0) * step * slow > limit:
        pred.overloaded = "decode"
    ttft = _sum_quantiles(waits, services)
    stall_extra = sum(curves.prefill_s(x) for x in lengths) / len(lengths) / mean_chunks
    stall_steps = lam * mean_chunks
    pure_steps = (1 - rho) / step
    share = stall_steps / (stall_steps + pure_steps)
    pred.stall_share = share
    decode_s = max(w.osl - 1, 1) * step * slow
    for name, q in PCTS.items():
        pred.ttft_s[name] = quantile(ttft, q)
        gap = curves.step_s(_batch_at(n, q, limit), context)
        pred.itl_s[name] = gap + stall_extra if q > 1 - share else gap
        stalls = poisson_quantile(stall_steps * decode_s, q)
        pred.tpot_s[name] = gap + stalls * stall_extra / max(w.osl - 1, 1)
    pred.parts_s = {"wait": quantile(waits, 0.5), "prefill": quantile(services, 0.5)}
    return pred


def predict_disagg(
    curves: Curves,
    w: Workload,
    n_prefill: int,
    n_decode: int,
    limit: int,
    transfer: Transfer,
    mode: str,
) -> Prediction:
    lengths = w.lengths()
    lam_p = w.rate / n_prefill
    pred = Prediction()
    services = [curves.prefill_s(x) for x in lengths]
    waits, rho = mg1_wait_grid(lam_p, services)
    pred.prefill_load = rho
    moves = [transfer.seconds(x) for x in lengths]
    link_waits, link_rho = mg1_wait_grid(lam_p, moves)
    pred.link_load = link_rho
    context = w.isl + w.osl / 2
    n, step, capped = decode_fixed_point(curves, w.rate / n_decode, w.osl, context, limit)
    pred.decode_batch = n
    if rho >= 1 or link_rho >= 1:
        pred.overloaded = "prefill" if rho >= 1 else "KV link"
        return _inf(pred)
    if capped:
        pred.overloaded = "decode"
    extra = PULL_EXTRA_S if mode == "pull" else 0.0
    moved = [m + lw + extra for m, lw in zip(moves, link_waits, strict=True)]
    ttft = _sum_quantiles(_sum_quantiles(waits, services)[::GRID], moved)
    for name, q in PCTS.items():
        gap = curves.step_s(_batch_at(n, q, limit), context)
        pred.ttft_s[name] = quantile(ttft, q) + step
        pred.itl_s[name] = gap
        pred.tpot_s[name] = gap
    pred.parts_s = {
        "wait": quantile(waits, 0.5),
        "prefill": quantile(services, 0.5),
        "transfer": quantile(moves, 0.5) + extra,
        "link_wait": quantile(link_waits, 0.5),
        "first_step": step,
    }
    return pred


def _inf(pred: Prediction) -> Prediction:
    for name in PCTS:
        pred.ttft_s[name] = math.inf
        pred.itl_s[name] = math.inf
        pred.tpot_s[name] = math.inf
    return pred


def goodput_share(pred: Prediction, ttft_slo_s: float | None, tpot_slo_s: float | None) -> float:
    """Predicted share of requests meeting both SLOs (independence assumed), from the
    p50/p90/p99 points interpolated piecewise-linearly."""
    return _share(pred.ttft_s, ttft_slo_s) * _share(pred.tpot_s, tpot_slo_s)


def _share(qs: dict[str, float], slo: float | None) -> float:
    if slo is None:
        return 1.0
    pts = [(0.0, 0.0)] + [(qs[k], PCTS[k]) for k in PCTS] + [(math.inf, 1.0)]
    if any(math.isinf(v) for v, _ in pts[1:-1]):
        finite = [(v, p) for v, p in pts[1:-1] if not math.isinf(v)]
        pts = [(0.0, 0.0), *finite, (math.inf, finite[-1][1] if finite else 0.0)]
    best = 0.0
    for (x0, p0), (x1, p1) in itertools.pairwise(pts):
        if slo >= x1:
            best = p1
        elif slo >= x0:
            best = p0 if math.isinf(x1) else p0 + (p1 - p0) * (slo - x0) / max(x1 - x0, 1e-12)
            break
    return best
