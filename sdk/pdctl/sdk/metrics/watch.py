"""Alerts that need memory across scrapes: KV held by an idle instance (a leak) and an
instance that keeps going down (a crash loop).

:class:`LifecycleWatch` remembers, per instance, since when it has held KV with nothing
running or waiting and when it went down; :func:`lifecycle_alerts` turns what it
remembers into alerts PA008 and PA009 (pure, so the monitor's alert table stays one
function of its inputs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
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


def lifecycle_alerts(
    insts: Iterable[_Inst],
    kv_idle_s: Mapping[str, float],
    down_count: Mapping[str, int],
) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    for i in insts:
        held = kv_idle_s.get(i.name, 0.0)
        if holds_kv_idle(i) and held >= KV_IDLE_LIMIT_S:
            out.append(
                (
                    "PA008",
                    "warning",
                    i.name,
                    f"{i.name} holds {(i.kv_usage or 0.0):.1%} of its KV cache with nothing "
                    f"running or waiting for {held:.0f} s: blocks leaked or held for a "
                    "request the other side dropped (docs/reliability.md)",
                )
            )
        downs = down_count.get(i.name, 0)
        if downs >= CRASH_LIMIT:
            out.append(
                (
                    "PA009",
                    "critical",
                    i.name,
                    f"{i.name} went down {downs} times in the last "
                    f"{CRASH_WINDOW_S / 60:.0f} min: it crashes repeatedly; read its log "
                    "(pdctl logs) before restarting it again",
                )
            )
    return out
