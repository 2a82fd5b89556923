"""Per-request results and their summary (pure): the percentile math and the per-cell
record whose field names follow ``vllm bench serve`` (``mean_ttft_ms``, ``p99_itl_ms``,
``request_throughput``, goodput…)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestResult:
    index: int
    prompt_tokens: int
    sent_at: float
    """Monotonic seconds when the request was sent."""
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    text: str = ""
    warmup: bool = False

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than 2 tokens)."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks
    (numpy's default); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100 (got {q})")
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Slo | None:
        """``ttft:MS,tpot:MS`` (either part optional)."""
        if not text:
            return None
        vals: dict[str, float] = {}
        for part in text.split(","):
            key, sep, num = part.partition(":")
            key = key.strip().lower()
            if not sep or key not in ("ttft", "tpot"):
                raise ValueError(f"--slo part {part!r}: expected ttft:MS or tpot:MS")
            try:
                vals[key + "_ms"] = float(num)
            except ValueError:
                raise ValueError(f"--slo part {part!r}: {num!r} is not a number") from None
        return cls(**vals)

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        if self.ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1000 > self.ttft_ms):
            return False
        tpot = r.tpot_s
        return not (self.tpot_ms is not None and tpot is not None and tpot * 1000 > self.tpot_ms)


def _ms(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {
        f"mean_{prefix}_ms": statistics.fmean(ms) if ms else None,
        f"median_{prefix}_ms": percentile(ms, 50),
        f"p90_{prefix}_ms": percentile(ms, 90),
        f"p99_{prefix}_ms": percentile(ms, 99),
    }


def summarize(
    results: Sequence[RequestResult], duration_s: float, slo: Slo | None = None
) -> dict[str, Any]:
    """The cell's record over measured (non-warm-up) requests."""
    measured = [r for r in results if not r.warmup]
    ok = [r for r in measured if r.ok]
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "errors": sorted({r.error for r in measured if r.error})[:5],
        "duration_s": duration_s,
        "total_input_tokens": sum(r.prompt_tokens for r in ok),
        "total_output_tokens": sum(r.output_tokens for r in ok),
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        "output_throughput": (
            sum(r.output_tokens for r in ok) / duration_s if duration_s > 0 else None
        ),
    }
    out.update(_ms([r.ttft_s for r in ok if r.ttft_s is not None], "ttft"))
    out.update(_ms([t for r in ok if (t := r.tpot_s) is not None], "tpot"))
    out.update(_ms([g for r in ok for g in r.itl_s], "itl"))
    out.update(_ms([r.e2e_s for r in ok if r.e2e_s is not None], "e2el"))
    if slo is not None:
        good = sum(slo.met(r) for r in measured)
        out["goodput"] = good / duration_s if duration_s > 0 else None
        out["slo"] = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms}
    return out
