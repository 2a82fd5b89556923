"""TTFT prediction per P->D pair: a small online model of each pair's time to first
token, learned from the router's own timelines, its error measured and exported.

For a request about to be placed on prefill ``p`` and decode ``d`` the model predicts
the time from placing it to decode's first byte as a linear function of what the router
sees at that moment (:data:`FEATURES`):

* a fixed cost (hand-off, scheduling, first step),
* the prompt's size (thousands of tokens, estimated from the body: characters / 4, ids
  one each) times the pair's learned prefill rate,
* the legs in flight on ``p`` and on ``d`` times their learned per-request queue costs,
* for an answer that is not streamed (its first byte is its whole answer), its output
  cap (thousands of tokens) times a learned generation rate.

Each completed request (answered, on the pair it was placed on, no retry or migration)
updates its pair's exponentially weighted least-squares fit (:data:`DECAY`; ridge
:data:`RIDGE` keeps a feature that never varied at 0): O(1) time and memory per request,
one 5x5 solve. A residual larger than :data:`CLIP` times the pair's mean absolute
residual is clipped first, so one stalled request does not skew the fit. A pair with
fewer than ``min_observations`` fits says *unknown*: it never predicts from nothing.
A decode alone (colocated, decode-only) is the pair ``("", decode)``.

Each router worker learns from the requests it routed: N workers hold N models.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.spec.admission import AdmissionSpec

FEATURES = ("fixed", "prompt", "prefill_load", "decode_load", "generation")
DECAY = 0.98
"""Weight of the past per new observation (about the last 50 requests of a pair count)."""
RIDGE = 1e-3
SOLVE_ALWAYS = 64
"""A pair's fit is solved after each of its first this many observations, then"""
SOLVE_EVERY = 8
"""after every this many: the sums still take every observation, and the router's cost
per request stays that of a few additions (the solve is most of a learning step)."""
CLIP = 4.0
MAX_PAIRS = 64
"""Pairs looked at per request (a fleet with more is never shed for, and steered among
the first of them), and pairs with their own error series."""
ERROR_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
ROUTING = ("kept", "steered", "explored", "missed")
"""What SLO routing did with a request that has an SLO or deadline: kept the policy's
pair (predicted to meet it, or unknown), steered it to another predicted to, explored a
pair with no prediction yet, or sent it on to the fastest pair though none is predicted
to meet it (an interactive request; sheddable ones are shed before they get here)."""

Pair = tuple[str, str]
"""(prefill name, or "" for a decode alone; decode name)."""


@dataclass(frozen=True)
class Size:
    """What the model reads of a request's body."""

    prompt_k: float
    """Prompt tokens (estimated) / 1000."""
    gen_k: float
    """Not streamed: its output cap / 1000 (streamed: 0, its first byte is a token)."""


def _chars(p: Any) -> float:
    if isinstance(p, str):
        return len(p) / 4
    if isinstance(p, int):
        return 1.0
    if isinstance(p, list):
        return sum(_chars(x) for x in p)
    if isinstance(p, dict):
        return _chars(p.get("content", p.get("text", "")))
    return 0.0


def size_of(body: Mapping[str, Any]) -> Size:
    """The request's :class:`Size` from its OpenAI body (completions or chat)."""
    prompt = body.get("messages") if "messages" in body else body.get("prompt", "")
    gen = 0.0
    if not body.get("stream"):
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        gen = float(cap) / 1000 if isinstance(cap, int | float) else 0.016
    return Size(_chars(prompt) / 1000, gen)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (``a`` positive
    definite: the ridge keeps it so)."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        d = m[c][c]
        if d == 0:
            continue
        for r in range(c + 1, n):
            f = m[r][c] / d
            if f:
                row, top = m[r], m[c]
                for k in range(c, n + 1):
                    row[k] -= f * top[k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))
        x[r] = s / m[r][r] if m[r][r] else 0.0
    return x


class PairModel:
    """One pair's fit: exponentially weighted sums of x xᵀ and x y, the solution."""

    __slots__ = ("a", "b", "err", "mad", "n", "theta", "w_err", "w_mad")

    def __init__(self) -> None:
        k = len(FEATURES)
        self.a = [[0.0] * k for _ in range(k)]
        self.b = [0.0] * k
        self.theta = [0.0] * k
        self.n = 0
        """Observations learned (not decayed)."""
        self.mad = 0.0
        """Mean absolute residual before each fit (seconds, weighted like the fit)."""
        self.err: float | None = None
        """Mean absolute relative error of its predictions (weighted like the fit)."""
        self.w_mad = self.w_err = 0.0

    def predict(self, x: Sequence[float]) -> float:
        return max(0.0, sum(t * v for t, v in zip(self.theta, x, strict=True)))

    def learn(self, x: Sequence[float], y: float, clip: bool) -> None:
        """Fit one more observation (``clip``: the fit is known, clip an outlier to
        :data:`CLIP` mean residuals from its prediction)."""
        if self.n:
            guess = self.predict(x)
            r = y - guess
            if clip:
                lim = CLIP * self.mad + 1e-3
                r = max(-lim, min(lim, r))
                y = guess + r
            self.w_mad = DECAY * self.w_mad + 1
            self.mad += (abs(r) - self.mad) / self.w_mad
        k = len(x)
        a, b = self.a, self.b
        for i in range(k):
            xi = x[i]
            a[i] = [DECAY * r + xi * xj for r, xj in zip(a[i], x, strict=True)]
            b[i] = DECAY * b[i] + xi * y
        self.n += 1
        if self.n <= SOLVE_ALWAYS or self.n % SOLVE_EVERY == 0:
            ridged = [[*r] for r in self.a]
            for i in range(k):
                ridged[i][i] += RIDGE
            self.theta = _solve(ridged, self.b)

    def scored(self, e: float) -> None:
        """One prediction's relative error, into :attr:`err`."""
        self.w_err = DECAY * self.w_err + 1
        self.err = e if self.err is None else self.err + (e - self.err) / self.w_err


@dataclass
class Prediction:
    """What the router predicted for one request (on its timeline)."""

    pair: Pair
    x: tuple[float, ...]
    at: float
    """Seconds since the timeline began when it was placed."""
    ahead_s: float | None
    """Placed → first byte, predicted (None: the pair's model knows too little)."""

    @property
    def ttft_s(self) -> float | None:
        """The request's predicted TTFT (seconds since its timeline began)."""
        return None if self.ahead_s is None else self.at + self.ahead_s


def _pair(p: Upstream | None, d: Upstream) -> Pair:
    return ("" if p is None else p.name, d.name)


class Predictor:
    """The models of one router process, SLO routing's choices and their metrics."""

    def __init__(self, spec: AdmissionSpec, registry: Registry) -> None:
        self.routing = spec.slo_routing
        self.margin = spec.slo_margin
        self.min_n = spec.predictor_min_observations
        self.models: dict[Pair, PairModel] = {}
        self.predictions = registry.counter(
            "pdctl_router_ttft_predictions_total",
            "Requests placed with a TTFT prediction for their pair (known) or without "
            "(unknown: the pair's model has too few observations).",
            ("result",),
        )
        self.routed = registry.counter(
            "pdctl_router_slo_routing_total",
            "Requests with an SLO or deadline, by what SLO routing did (kept the policy's "
            "pair, steered to another, explored an unknown pair, missed: none predicted "
            "to meet it).",
            ("decision",),
        )
        self.predicted = registry.histogram(
            "pdctl_router_ttft_predicted_seconds",
            "Predicted TTFT of answered requests that had a prediction.",
            buckets=TTFT_BUCKETS,
        )
        self.observed = registry.histogram(
            "pdctl_router_ttft_predicted_observed_seconds",
            "Router-measured TTFT of the same requests (compare with the predicted).",
            buckets=TTFT_BUCKETS,
        )
        self.error = registry.histogram(
            "pdctl_router_ttft_prediction_error_ratio",
            "|predicted - observed| / observed TTFT of answered requests with a prediction.",
            buckets=ERROR_BUCKETS,
        )
        registry.gauge(
            "pdctl_router_pair_ttft_error_ratio",
            "Mean absolute relative TTFT prediction error per P->D pair (recent requests; "
            f"at most {MAX_PAIRS} pairs).",
            ("prefill", "decode"),
            self._pair_errors,
            merge="max",
        )
        self.predictions.prime(("known", "unknown"))
        self.routed.prime(ROUTING)
        for h in (self.predicted, self.observed, self.error):
            h.prime()

    def _pair_errors(self) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for pair, m in self.models.items():
            if m.err is not None and len(out) < MAX_PAIRS:
                out[pair] = m.err
        return out

    # ------------------------------------------------------------------ predicting

    def ahead(self, size: Size, p: Upstream | None, d: Upstream) -> float | None:
        """Seconds from now to the first byte on this pair, or None (unknown)."""
        m = self.models.get(_pair(p, d))
        if m is None or m.n < self.min_n:
            return None
        return m.predict(_features(size, p, d))

    def meets(self, ahead_s: float, left_s: float) -> bool:
        """Predicted to meet, with the margin to spare."""
        return ahead_s * (1 + self.margin) <= left_s

    def fastest(
        self, size: Size, pairs: Iterable[tuple[Upstream, Upstream | None]]
    ) -> float | None:
        """The lowest predicted TTFT over ``pairs`` when every one is known, else None
        (an unknown pair may be faster; so may one past the first :data:`MAX_PAIRS`)."""
        best: float | None = None
        for i, (d, p) in enumerate(pairs):
            if i >= MAX_PAIRS:
                return None
            a = self.ahead(size, p, d)
            if a is None:
                return None  # an unknown never sheds
            best = a if best is None else min(best, a)
        return best

    def reachable(self, ahead_s: float, left_s: float) -> bool:
        """Not predicted to miss by more than the margin (a request is shed only when
        every pair's prediction is above the time left times (1 + margin))."""
        return ahead_s <= left_s * (1 + self.margin)

    def unreachable(
        self, size: Size, left_s: float, pairs: Iterable[tuple[Upstream, Upstream | None]]
    ) -> float | None:
        """The best predicted TTFT when every pair is known and each is predicted to miss
        ``left_s`` by more than the margin (the request may be shed); else None."""
        best = self.fastest(size, pairs)
        return None if best is None or self.reachable(best, left_s) else best

    def steer(
        self,
        tl: Any,
        chosen: tuple[Upstream, Upstream | None],
        pairs: Iterable[tuple[Upstream, Upstream | None]],
    ) -> tuple[Upstream, Upstream | None]:
        """The pair for a request with an SLO or deadline (``tl.ttft_due``): the policy's
        ``chosen`` when it is predicted to meet it or unknown, else the fastest pair
        predicted to, else one not known yet, else the fastest."""
        size, due = tl.size, tl.ttft_due
        if not self.routing or size is None or due is None:
            return chosen
        left = due - time.perf_counter()
        mine = self.ahead(size, chosen[1], chosen[0])
        if mine is None or self.meets(mine, left):
            self.routed.inc("kept")
            return chosen
        best: tuple[float, tuple[Upstream, Upstream | None]] | None = None
        unknown = None
        for i, (d, p) in enumerate(pairs):
            if i >= MAX_PAIRS:
                break
            a = self.ahead(size, p, d)
            if a is None:
                unknown = unknown or (d, p)
            elif best is None or a < best[0]:
                best = (a, (d, p))
        if best is not None and self.meets(best[0], left):
            self.routed.inc("steered")
            tl.note(
                f"SLO: predicted {mine * 1000:.0f} ms on the policy's pair, "
                f"{best[0] * 1000:.0f} ms here ({left * 1000:.0f} ms left)"
            )
            return best[1]
        if unknown is not None:
            self.routed.inc("explored")
            return unknown
        self.routed.inc("missed")
        tl.note(f"SLO: no pair predicted within {left * 1000:.0f} ms left")
        return best[1] if best is not None else chosen

    def record(self, tl: Any, d: Upstream, p: Upstream | None) -> None:
        """The prediction for the pair the request is placed on, kept on its timeline."""
        size = tl.size
        if size is None:
            return
        x = _features(size, p, d)
        pair = _pair(p, d)
        m = self.models.get(pair)  # as :meth:`ahead`, the features made once
        a = m.predict(x) if m is not None and m.n >= self.min_n else None
        self.predictions.inc("unknown" if a is None else "known")
        tl.prediction = Prediction(pair, x, tl.mark(), a)

    # ------------------------------------------------------------------ learning

    def observe(self, tl: Any) -> None:
        """Learn from a settled timeline (and measure the error of its prediction)."""
        pr: Prediction | None = tl.prediction
        fb = tl.decode_first_byte
        if pr is None or fb is None or tl.outcome != "ok":
            return
        if tl.retries or tl.redispatched or tl.migrations:
            return  # not the pair's own time
        if (tl.prefill or "", tl.decode) != pr.pair:
            return
        m = self.models.get(pr.pair)
        if m is None:  # one per pair of the fleet's instances at most
            m = self.models[pr.pair] = PairModel()
        predicted = pr.ttft_s
        if predicted is not None:
            self.predicted.observe(predicted)
            self.observed.observe(fb)
            e = abs(predicted - fb) / fb if fb > 0 else 0.0
            self.error.observe(e)
            m.scored(e)
        m.learn(pr.x, max(0.0, fb - pr.at), m.n >= self.min_n)

    def state(self) -> dict[str, Any]:
        """Each pair's model (``/v1/pdctl/state``'s ``predictor``)."""
        return {
            "slo_routing": self.routing,
            "slo_margin": self.margin,
            "pairs": [
                {
                    "prefill": pair[0] or None,
                    "decode": pair[1],
                    "observations": m.n,
                    "known": m.n >= self.min_n,
                    "coefficients": dict(
                        zip(FEATURES, (round(t, 6) for t in m.theta), strict=True)
                    ),
                    "error_ratio": None if m.err is None else round(m.err, 4),
                }
                for pair, m in sorted(self.models.items())[:MAX_PAIRS]
            ],
        }


def error_summary(requests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The prediction error over ``GET /v1/pdctl/requests`` entries: how many answered
    requests had a prediction, and the median and p90 of |predicted - observed| /
    observed TTFT (None without any)."""
    errors = sorted(
        abs(float(r["predicted_ttft_ms"]) - float(r["ttft_ms"])) / float(r["ttft_ms"])
        for r in requests
        if r.get("outcome") == "ok"
        and isinstance(r.get("predicted_ttft_ms"), int | float)
        and isinstance(r.get("ttft_ms"), int | float)
        and r["ttft_ms"] > 0
    )

    def q(f: float) -> float | None:
        return round(errors[min(len(errors) - 1, int(f * len(errors)))], 4) if errors else None

    return {"predicted": len(errors), "error_p50": q(0.5), "error_p90": q(0.9)}


def _features(size: Size, p: Upstream | None, d: Upstream) -> tuple[float, ...]:
    p_load = 0.0 if p is None else float(p.outstanding)
    return (1.0, size.prompt_k, p_load, float(d.outstanding), size.gen_k)
