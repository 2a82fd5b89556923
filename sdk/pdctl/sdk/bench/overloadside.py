"""What the overload benchmark measures beside its clients' answers: the router's own
account of its shed answers, the load client's event-loop lag, and the engines' CPU
priority (a measurement setup choice, :func:`renice`).

* :func:`shed_seconds` reads ``pdctl_router_shed_answer_seconds`` (the router's time from
  reading a request to its shed answer sent, per class and when it was shed) from a
  router's ``/metrics``; :func:`shed_delta` is one arm's share of it.
* :class:`LoopLag` samples how late the client's own event loop wakes: a client that
  lags sees every answer late by as much, whatever the router did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from typing import Any

import httpx

from pdctl.sdk.metrics.promtext import parse_text

SHED_ANSWER = "pdctl_router_shed_answer_seconds"
FAST_S = 0.05
"""A shed answer within this long counts as 'at once' (the issue's 50 ms)."""

Buckets = dict[str, dict[float, float]]
"""Per ``when`` (arrival, queued): cumulative counts by upper bound (``inf`` the count)."""


async def shed_seconds(client: httpx.AsyncClient, url: str) -> Buckets | None:
    """The router's shed-answer histogram summed over classes, or None (no admission:
    the router exports none)."""
    try:
        r = await client.get(url + "/metrics", timeout=10)
        r.raise_for_status()
    except httpx.HTTPError:
        return None
    samples, _ = parse_text(r.text)
    out: Buckets = {}
    for s in samples:
        if s.name != SHED_ANSWER + "_bucket":
            continue
        le = s.label("le")
        bound = float("inf") if le == "+Inf" else float(le)
        row = out.setdefault(s.label("when"), {})
        row[bound] = row.get(bound, 0.0) + s.value
    return out or None


def shed_delta(before: Buckets | None, after: Buckets | None) -> dict[str, Any] | None:
    """One arm's shed answers as the router timed them: per ``when`` how many, how many
    within :data:`FAST_S`, and the bucket bound under which 99% and all of them came
    (ms; None past the last finite bound)."""
    if after is None:
        return None
    out: dict[str, Any] = {}
    for when, row in sorted(after.items()):
        base = (before or {}).get(when, {})
        cum = sorted((b, n - base.get(b, 0.0)) for b, n in row.items())
        total = cum[-1][1] if cum else 0.0
        out[when] = {
            "n": int(total),
            "within_50ms": int(sum(n for b, n in cum if b == FAST_S)),
            "p99_under_ms": _under(cum, 0.99 * total),
            "max_under_ms": _under(cum, total),
        }
    return out


def _under(cum: list[tuple[float, float]], k: float) -> float | None:
    if k <= 0:
        return None
    for b, n in cum:
        if n >= k:
            return None if b == float("inf") else round(b * 1000, 1)
    return None


class LoopLag:
    """Samples how late the running loop wakes from a :data:`PERIOD_S` sleep, while
    entered (``async with``)."""

    PERIOD_S = 0.01

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.PERIOD_S)
            self.lags.append(max(0.0, time.perf_counter() - t - self.PERIOD_S))

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def summary(self) -> dict[str, float | None]:
        """p50, p99 and the largest lag (ms)."""
        xs = sorted(self.lags)
        if not xs:
            return {"p50_ms": None, "p99_ms": None, "max_ms": None}

        def q(f: float) -> float:
            return round(xs[min(len(xs) - 1, int(f * len(xs)))] * 1000, 1)

        return {"p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(xs[-1] * 1000, 1)}


def renice(pids: Iterable[int | None], nice: int) -> list[int]:
    """Lower the CPU priority of each process group in ``pids`` (every thread of every
    process in it, those started later included) to ``nice``; the groups changed.

    A measurement setup choice for a machine where the engines and the router share a
    few cores: the engines' CPU-bound threads would otherwise delay the router's and the
    load client's event loops, and every answer's time would measure that contention."""
    done = []
    for pid in pids:
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PGRP, pid, nice)
                done.append(pid)
    return done
