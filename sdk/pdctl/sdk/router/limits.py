"""Rate limits per tenant and per key: token buckets, reserved on admission and settled on
completion.

A request is admitted only when every bucket that applies to it (its tenant's and its
key's, requests and tokens) can give what it asks for; then all of them are charged at
once (nothing awaits in between, so the check and the charge are one step on the event
loop). Tokens are not known until the answer: admission reserves an estimate (the
request's ``max_tokens`` plus its prompt's length in characters / 4, at most a bucket's
size so a large request is not refused for ever) and the
:class:`~pdctl.sdk.router.lease.Reservation` returns or charges the difference from the
answer's usage when it settles. A bucket may go below zero that way; the next request
waits until it has refilled.

One mechanism for every limit: a reservation is a list of (bucket, amount) charges that
settles exactly once. Admission control (a queue in front of the fleet) adds its own
charges to the same object instead of keeping a second account.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.router.auth import ANONYMOUS, Principal
from pdctl.sdk.router.lease import Bucket, Reservation
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.spec.security import RateLimitSpec

Clock = Callable[[], float]


class TokenBucket:
    """``rate`` units per second, holding at most ``capacity``; starts full."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate, self.capacity = rate, capacity
        self.level, self.stamp = capacity, now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` (at most the capacity) can be taken; 0: now."""
        self._refill(now)
        need = min(amount, self.capacity) - self.level
        return 0.0 if need <= 1e-9 else need / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount

    def give(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)


@dataclass(frozen=True)
class Refusal:
    """Not admitted: which limit, and when to come back."""

    retry_after_s: float
    reason: str
    """``tenant_limit`` or ``key_limit`` (the ``pdctl-drop-reason`` header)."""
    limit: str
    """``requests`` or ``tokens``."""
    tenant: str

    @property
    def message(self) -> str:
        scope = "tenant" if self.reason == "tenant_limit" else "key"
        return (
            f"{scope} rate limit on {self.limit} reached for tenant {self.tenant!r}; "
            f"retry in {self.retry_after_s:.3f} s"
        )

    def headers(self) -> list[tuple[bytes, bytes]]:
        return drop_headers(self.retry_after_s, self.reason)


def drop_headers(retry_after_s: float, reason: str) -> list[tuple[bytes, bytes]]:
    """The headers of a request the router did not serve: ``Retry-After`` (whole seconds,
    at least 1), ``pdctl-retry-after-ms`` and ``pdctl-drop-reason``."""
    return [
        (b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()),
        (b"pdctl-retry-after-ms", str(math.ceil(retry_after_s * 1000)).encode()),
        (b"pdctl-drop-reason", reason.encode()),
    ]


class Meter:
    """Per-tenant counters; every known tenant is exported from 0."""

    def __init__(self, registry: Registry, tenants: Iterable[str]) -> None:
        self.requests = registry.counter(
            "pdctl_router_tenant_requests_total", "Requests admitted, per tenant.", ["tenant"]
        )
        self.tokens_total = registry.counter(
            "pdctl_router_tenant_tokens_total",
            "Prompt plus completion tokens settled, per tenant.",
            ["tenant"],
        )
        self.rejections = registry.counter(
            "pdctl_router_tenant_rejections_total",
            "Requests answered 429 by a rate limit, per tenant and reason.",
            ["tenant", "reason"],
        )
        self.refusal_s = registry.histogram(
            "pdctl_router_tenant_rejection_seconds",
            "Router time from reading a request to its 429 sent, per tenant.",
            ["tenant"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
        )
        known = tuple(tenants)
        self.requests.prime(known)
        self.tokens_total.prime(known)
        self.rejections.prime(known, ("tenant_limit", "key_limit"))

    def tokens(self, tenant: str, n: float) -> None:
        self.tokens_total.inc(tenant, by=max(0.0, n))


class Limiter:
    """The buckets of every limited tenant and key."""

    def __init__(
        self,
        registry: Registry,
        tenants: Mapping[str, RateLimitSpec],
        keys: Mapping[str, RateLimitSpec],
        known_tenants: Iterable[str] = (),
        clock: Clock = time.monotonic,
        share: float = 1.0,
    ) -> None:
        """``share``: the part of each limit this process enforces (1/N in each of a
        router's N workers: each holds buckets of rate/N, so together they admit about
        the limit; approximate when the kernel spreads one tenant's connections unevenly)."""
        self.clock = clock
        now = clock()
        self.meter = Meter(registry, sorted({*tenants, *known_tenants}))
        self._tenant = {t: _buckets(s, now, share) for t, s in tenants.items() if s.limited}
        self._key = {k: _buckets(s, now, share) for k, s in keys.items() if s.limited}

    def admit(self, who: Principal | None, body: Mapping[str, Any]) -> Reservation | Refusal:
        """Admit one completion request (``who`` None: the anonymous tenant) at its
        :func:`estimate_tokens`, or say which limit refuses it."""
        return self.reserve(who or ANONYMOUS, estimate_tokens(body))

    def reserve(self, who: Principal, tokens: float) -> Reservation | Refusal:
        """Admit one request estimated at ``tokens``, or say which limit refuses it."""
        now = self.clock()
        plans: list[tuple[str, _Buckets]] = []
        if (b := self._tenant.get(who.tenant)) is not None:
            plans.append(("tenant_limit", b))
        if (b := self._key.get(who.name)) is not None:
            plans.append(("key_limit", b))
        worst: Refusal | None = None
        for reason, bs in plans:
            for limit, bucket, amount in bs.asks(tokens):
                wait = bucket.wait_s(amount, now)
                if wait > 0 and (worst is None or wait > worst.retry_after_s):
                    worst = Refusal(wait, reason, limit, who.tenant)
        if worst is not None:
            self.meter.rejections.inc(who.tenant, worst.reason)
            return worst
        charges: list[tuple[Bucket, float]] = []
        for _, bs in plans:
            for limit, bucket, amount in bs.asks(tokens):
                taken = min(amount, bucket.capacity)
                bucket.take(taken)
                if limit == "tokens":
                    charges.append((bucket, taken))
        self.meter.requests.inc(who.tenant)
        return Reservation(who.tenant, tokens, charges, self.meter.tokens)


@dataclass
class _Buckets:
    requests: TokenBucket | None
    tokens: TokenBucket | None

    def asks(self, tokens: float) -> list[tuple[str, TokenBucket, float]]:
        out: list[tuple[str, TokenBucket, float]] = []
        if self.requests is not None:
            out.append(("requests", self.requests, 1.0))
        if self.tokens is not None:
            out.append(("tokens", self.tokens, tokens))
        return out


def _buckets(s: RateLimitSpec, now: float, share: float = 1.0) -> _Buckets:
    def one(rate: float) -> TokenBucket | None:
        rate *= share
        # a bucket always holds at least one unit, or a burst under 1 would refuse all
        return TokenBucket(rate, max(1.0, rate * s.burst_s), now) if rate > 0 else None

    return _Buckets(one(s.requests_per_s), one(s.tokens_per_s))


def estimate_tokens(body: Mapping[str, Any]) -> float:
    """What a request may cost before its usage is known: its output cap plus its prompt
    (characters / 4, the usual English ratio; ids count one each)."""
    cap = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    prompt: Any = body.get("prompt", "")
    if "messages" in body:
        prompt = [m.get("content", "") for m in body["messages"] if isinstance(m, dict)]
    return float(cap) + _prompt_len(prompt)


def _prompt_len(p: Any) -> float:
    if isinstance(p, str):
        return len(p) / 4
    if isinstance(p, int):
        return 1.0
    if isinstance(p, list):
        return sum(_prompt_len(x) for x in p)
    if isinstance(p, dict):
        return _prompt_len(p.get("text", ""))
    return 0.0
