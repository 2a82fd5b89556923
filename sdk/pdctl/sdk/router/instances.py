"""Upstream instances as the router sees them: health, circuit breakers, selection."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pdctl.sdk.pd import PrefillIdentity
from pdctl.sdk.router.replies import RouteError
from pdctl.sdk.router.upstream import Pool


class Breaker:
    """Per-instance circuit breaker: opens after ``threshold`` consecutive failures,
    lets one trial through after ``cooldown_s``, closes after ``close_after`` successes."""

    def __init__(self, threshold: int = 5, cooldown_s: float = 10.0, close_after: int = 2):
        self.threshold, self.cooldown_s, self.close_after = threshold, cooldown_s, close_after
        self.failures = 0
        self.successes = 0
        self.opened_at: float | None = None

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if time.monotonic() - self.opened_at >= self.cooldown_s else "open"

    def allows(self) -> bool:
        return self.state != "open"

    def success(self) -> None:
        self.failures = 0
        if self.opened_at is not None:
            self.successes += 1
            if self.successes >= self.close_after:
                self.opened_at = None
                self.successes = 0

    def failure(self) -> None:
        self.failures += 1
        self.successes = 0
        if self.opened_at is not None or self.failures >= self.threshold:
            self.opened_at = time.monotonic()


@dataclass
class Upstream:
    name: str
    role: str
    url: str
    pool: Pool
    identity: PrefillIdentity | None = None
    outstanding: int = 0
    healthy: bool = True
    drained: bool = False
    """Set by an operator: no new requests go here; those in flight finish."""
    breaker: Breaker = field(default_factory=Breaker)
    trusted_until: float = 0.0
    """Monotonic time until which the supervisor's "up" outweighs failed health checks."""

    def eligible(self) -> bool:
        return self.healthy and self.breaker.allows()


def choose(
    pool: list[Upstream],
    policy: str,
    rr: Iterator[int],
    exclude: tuple[Upstream, ...] = (),
    scores: dict[str, float] | None = None,
) -> Upstream:
    """Pick one eligible, undrained instance of ``pool`` by ``policy``; 503 when none.
    ``cache_aware`` takes the best of ``scores`` (ties: least loaded), and without
    scores is ``least_loaded``."""
    cands = [u for u in pool if u.eligible() and not u.drained and u not in exclude]
    if not cands:
        role = pool[0].role if pool else "instance"
        drained = [u.name for u in pool if u.drained]
        why = f" (drained: {', '.join(drained)})" if drained else ""
        raise RouteError(503, f"no healthy {role} instance available{why}", "service_unavailable")
    if len(cands) == 1:
        return cands[0]
    if policy == "round_robin":
        return cands[next(rr) % len(cands)]
    if policy == "power_of_two":
        a, b = random.sample(cands, 2)
        return a if a.outstanding <= b.outstanding else b
    if policy == "cache_aware" and scores:
        top = max(scores.get(u.name, 0.0) for u in cands)
        cands = [u for u in cands if scores.get(u.name, 0.0) == top]
    low = min(u.outstanding for u in cands)
    best = [u for u in cands if u.outstanding == low]
    return best[next(rr) % len(best)]
