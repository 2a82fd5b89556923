"""An upstream instance as the router sees it, and its circuit breaker."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pdctl.sdk.pd import PrefillIdentity
from pdctl.sdk.router.httpclient import Pool


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
