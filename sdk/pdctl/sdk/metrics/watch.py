"""Alerts that need memory across scrapes: KV held by an idle instance (a leak) and an
instance that keeps going down (a crash loop).

:class:`LifecycleWatch` remembers, per instance, since when it has held KV with nothing
running or waiting and when it went down; :mod:`pdctl.sdk.metrics.alerts` raises PA010
and PA011 from it (pure, so the alert table stays one function of its inputs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

KV_IDLE_LIMIT_S = 5.0
"""An idle instance may hold KV this long (a lease the decode is about to collect)."""
CRASH_WINDOW_S = 600.0
CRASH_LIMIT = 2
"""This many downs inside the window is a crash loop, not a one-off restart."""


class _Inst(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def health(self) -> str: ...
    @property
    def kv_usage(self) -> float | None: ...
    @property
    def running(self) -> float | None: ...
    @property
    def waiting(self) -> float | None: ...


def holds_kv_idle(i: _Inst) -> bool:
    return (
        i.role in ("prefill", "decode", "colocated")
        and i.health == "UP"
        and (i.kv_usage or 0.0) > 0.0
        and not (i.running or 0.0)
        and not (i.waiting or 0.0)
    )


@dataclass
class LifecycleWatch:
    _idle_since: dict[str, float] = field(default_factory=dict)
    _was_up: dict[str, bool] = field(default_factory=dict)
    _downs: dict[str, deque[float]] = field(default_factory=dict)

    def update(self, insts: Iterable[_Inst], now: float) -> tuple[dict[str, float], dict[str, int]]:
        """Seconds each instance has held KV while idle, and its downs in the window."""
        idle: dict[str, float] = {}
        for i in insts:
            if holds_kv_idle(i):
                idle[i.name] = now - self._idle_since.setdefault(i.name, now)
            else:
                self._idle_since.pop(i.name, None)
            up = i.health == "UP"
            downs = self._downs.setdefault(i.name, deque())
            if self._was_up.get(i.name) and not up:
                downs.append(now)
            self._was_up[i.name] = up
            while downs and now - downs[0] > CRASH_WINDOW_S:
                downs.popleft()
        return idle, {n: len(d) for n, d in self._downs.items() if d}
