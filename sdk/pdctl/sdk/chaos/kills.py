"""Faults that SIGKILL one side of a P/D pair at a chosen point of the push lifecycle.

Each sends its clients through the router, kills the instance's engine core (the process
that died in the field: vLLM's API server then exits on its own and the fleet's
supervisor restarts the instance with a fresh engine id) and, from the kill on, follows
every client's answer and the surviving side's KV usage. The points:

* ``kill-decode-after-registration`` — decode registered with prefill, prefill holds
  the finished KV (its WRITE held back by the connector's ``pdctl_failpoint_write_delay``
  failpoint, switched on by a file) or is still prefilling: prefill must release the
  KV, the clients must get an answer.
* ``kill-decode-mid-stream`` — streams already flowing from decode: the clients get the
  rest from another decode (the router's migration) or a clear error; prefill holds
  nothing.
* ``kill-prefill-before-write`` — prefill finished, WRITE held back: decode must answer
  and free its blocks within seconds (nothing in vLLM tells it).
* ``kill-decode`` — both decode points with one kill (the e2e test's: one restart).

:func:`kill_at` runs one of them.

The report (:class:`~pdctl.sdk.chaos.FaultReport`) times answers and KV from the kill;
``service_back_s`` includes the supervisor's restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.chaos import (
    Answer,
    FaultReport,
    _prompt,
    completion,
    kv_back_to_idle,
    send,
    time_to_service,
)


def sigkill(pids: Sequence[int]) -> int:
    """SIGKILL each of ``pids``; how many were alive."""
    n = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            n += 1
    return n


@contextlib.contextmanager
def switched_on(path: Path | None, text: str = "on"):  # type: ignore[no-untyped-def]
    """A failpoint's ``while:<path>`` switch: the file exists (holding ``text``) inside
    the block."""
    if path is None:
        yield
        return
    path.write_text(text + "\n")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


async def kill_under(
    name: str,
    client: httpx.AsyncClient,
    router: str,
    bodies: Sequence[dict[str, Any] | tuple[float, dict[str, Any]]],
    pids: Sequence[int],
    survivors: dict[str, float],
    *,
    after_s: float,
    switch: Path | None = None,
    kv_wait_s: float = 15.0,
    service_wait_s: float = 180.0,
    timeout_s: float = 120.0,
) -> FaultReport:
    """Send ``bodies`` (each at once, or ``(seconds, body)``: that long after the first),
    SIGKILL ``pids`` ``after_s`` after the first; then every answer, the KV of
    ``survivors`` (URL → fresh idle usage) timed from the kill, and the time until the
    router serves again (the killed instance restarted by the supervisor). Answers are
    timed from the first send (``fault_at_s`` is the kill)."""

    async def later(at: float, body: dict[str, Any]) -> Answer:
        await asyncio.sleep(at)
        a = await send(client, router, body, timeout_s=timeout_s)
        return dataclasses.replace(a, seconds=a.seconds + at)

    t0 = time.perf_counter()
    with switched_on(switch):
        sends = [
            asyncio.ensure_future(later(*b) if isinstance(b, tuple) else later(0.0, b))
            for b in bodies
        ]
        await asyncio.sleep(after_s)
        t_kill = time.perf_counter()
        killed = sigkill(pids)
    samples: list[tuple[float, dict[str, float | None]]] = []
    kv = asyncio.ensure_future(
        kv_back_to_idle(client, survivors, wait_s=kv_wait_s, poll_s=0.1, samples=samples)
    )
    answers: list[Answer] = list(await asyncio.gather(*sends))
    back, last = await kv
    t_service = time.perf_counter()
    service = await time_to_service(client, router, wait_s=service_wait_s)
    rep = FaultReport(
        name,
        answers,
        back,
        last,
        None if service is None else t_service - t_kill + service,
        fault_at_s=t_kill - t0,
        kv_samples=samples,
    )
    if not killed:
        rep.fault = f"{name} (nothing to kill)"
    return rep


Body = dict[str, Any] | tuple[float, dict[str, Any]]
POINTS = (
    "kill-decode-after-registration",
    "kill-decode-mid-stream",
    "kill-prefill-before-write",
    "kill-decode",
)


def plan(point: str, n: int, delay_s: float) -> tuple[list[Body], float]:
    """The requests of a kill point and when (seconds after the first send) to kill."""
    if point == "kill-decode-mid-stream":
        return [completion(_prompt(2000 + i), 600, stream=True) for i in range(n)], 1.5
    if point == "kill-decode":
        # streams first (their WRITEs held too, then decoding); then requests whose KV
        # prefill holds; the kill lands while both are under way
        at = delay_s + 0.5
        bodies: list[Body] = [
            completion(_prompt(2000 + i), 600, stream=True) for i in range(n // 2)
        ]
        bodies += [(at, completion(_prompt(1000 + i), 32)) for i in range(n - n // 2)]
        return bodies, at + 0.5
    if point in ("kill-decode-after-registration", "kill-prefill-before-write"):
        return [completion(_prompt(1000 + i), 32) for i in range(n)], min(0.5, delay_s / 3)
    raise ValueError(f"unknown kill point {point!r}: one of {', '.join(POINTS)}")


async def kill_at(
    point: str,
    client: httpx.AsyncClient,
    router: str,
    pids: Sequence[int],
    survivor: tuple[str, float],
    *,
    switch: Path | None,
    n: int = 4,
    delay_s: float = 1.5,
    **kw: Any,
) -> FaultReport:
    """Kill ``pids`` (the engine of the side ``point`` names) at ``point`` under ``n``
    requests; ``survivor``: the other side's URL and fresh idle KV usage; ``switch``: the
    delay failpoint's file (``delay_s``: the failpoint's delay), None for mid-stream."""
    bodies, after_s = plan(point, n, delay_s)
    uses_switch = point != "kill-decode-mid-stream"
    return await kill_under(
        point,
        client,
        router,
        bodies,
        pids,
        dict([survivor]),
        after_s=after_s,
        switch=switch if uses_switch else None,
        **kw,
    )
