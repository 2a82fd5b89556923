"""What the overload benchmark measures beside its clients' answers: the router's own
account of its shed answers, the load client's event-loop lag, and the engines' CPU
priority (a measurement setup choice, :func:`renice`).

* :func:`shed_seconds` reads ``pdctl_router_shed_answer_seconds`` (the router's time from
  reading a request to its shed answer sent, per class and when it was shed) from a
  router's ``/metrics``; :func:`shed_delta` is one arm's share of it.
* the load client's event-loop lag (:class:`Lags`) and the router's
  (``pdctl_router_loop_lag_seconds``): a loop that lags delays every answer by as much,
  whatever the router decided, and a router's lag comes before its read-to-answer timer;
* :func:`tcp_drops`: connections dropped before any program saw them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.metrics.promtext import parse_text

SHED_ANSWER = "pdctl_router_shed_answer_seconds"
LOOP_LAG = "pdctl_router_loop_lag_seconds"
FAST_S = 0.05
"""A shed answer within this long counts as 'at once' (the issue's 50 ms)."""

Buckets = dict[str, dict[float, float]]
"""Per value of a label (``""`` for none): cumulative counts by upper bound (``inf``:
the count)."""


async def router_histograms(client: httpx.AsyncClient, url: str) -> dict[str, Buckets]:
    """The router's shed-answer histogram per ``when`` (summed over classes) and its
    loop-lag histogram (under ``""``), as its ``/metrics`` has them now; a histogram it
    does not export (no admission) is absent."""
    try:
        r = await client.get(url + "/metrics", timeout=10)
        r.raise_for_status()
    except httpx.HTTPError:
        return {}
    samples, _ = parse_text(r.text)
    out: dict[str, Buckets] = {}
    for s in samples:
        for name, label in ((SHED_ANSWER, "when"), (LOOP_LAG, "")):
            if s.name != name + "_bucket":
                continue
            le = s.label("le")
            bound = float("inf") if le == "+Inf" else float(le)
            row = out.setdefault(name, {}).setdefault(s.label(label) if label else "", {})
            row[bound] = row.get(bound, 0.0) + s.value
    return out


def histogram_delta(before: Buckets | None, after: Buckets | None) -> dict[str, Any] | None:
    """One arm's share of a router histogram: per label value how many, how many within
    :data:`FAST_S`, and the bucket bound under which 99% and all of them came (ms; None
    past the last finite bound)."""
    if not after:
        return None
    out: dict[str, Any] = {}
    for key, row in sorted(after.items()):
        base = (before or {}).get(key, {})
        cum = sorted((b, n - base.get(b, 0.0)) for b, n in row.items())
        total = cum[-1][1] if cum else 0.0
        out[key] = {
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


class Lags:
    """The lags a :class:`~pdctl.sdk.router.looplag.LoopLag` saw, summarised."""

    def __init__(self) -> None:
        self.lags: list[float] = []

    def summary(self) -> dict[str, float | None]:
        """p50, p99 and the largest lag (ms)."""
        xs = sorted(self.lags)
        if not xs:
            return {"p50_ms": None, "p99_ms": None, "max_ms": None}

        def q(f: float) -> float:
            return round(xs[min(len(xs) - 1, int(f * len(xs)))] * 1000, 1)

        return {"p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(xs[-1] * 1000, 1)}


def tcp_drops() -> dict[str, int]:
    """This machine's count of connections its listeners dropped and of SYNs sent again
    (``/proc/net/netstat``; empty where there is none): a dropped SYN is sent again
    after 1 s, then 3 s, 7 s, and a request waits that long before any router sees it.
    Machine-wide: other programs' connections count too."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            for k in ("ListenDrops", "TCPSynRetrans"):
                if k in row:
                    out[k] = int(row[k])
    return out


def cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user and system) process ``pid`` has used, or None (unknown)."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command's name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
