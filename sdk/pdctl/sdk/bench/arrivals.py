"""Request arrival processes for the load generator (pure, seeded).

Open loop: inter-arrival gaps drawn from a gamma distribution with shape ``burstiness``
and mean ``1 / rate`` — ``burstiness = 1`` is a Poisson process (exponential gaps),
smaller values are burstier, larger ones more regular (as ``vllm bench serve`` does).
``rate = inf`` sends everything at once.
"""

from __future__ import annotations

import math
import random


def arrival_offsets(
    rate: float, count: int, *, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Seconds from the start at which each of ``count`` requests is sent."""
    if count < 0:
        raise ValueError("count must be >= 0")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (got {rate})")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (got {burstiness})")
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.gammavariate(burstiness, scale)
    return out


def count_for(rate: float, duration_s: float, max_requests: int) -> int:
    """How many requests an open-loop cell of ``duration_s`` at ``rate`` sends (>= 1)."""
    if math.isinf(rate):
        return max(1, max_requests)
    return max(1, min(max_requests, round(rate * duration_s)))
