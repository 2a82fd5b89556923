"""Faults for a P/D fleet and what they cost: the pieces of the chaos suite.

Each fault is an async function that hits a router (or an instance) the way an unlucky
production day would — clients that hang up at random points, bursts far beyond
``max_num_seqs``, input one side accepts and the other rejects — and returns every
client's :class:`Answer`. :func:`kv_back_to_idle` then measures how long each instance
holds KV after the fleet goes idle, against the fresh idle value read before the first
fault. The faults that kill an instance or cut the P↔D side channel are in
:mod:`pdctl.sdk.chaos.kills` and :mod:`pdctl.sdk.chaos.sidechannel`.
``benchmarks/chaos.py`` and the e2e tests compose these; everything is bounded in count
and time and talks to loopback URLs only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from pdctl.sdk.metrics import parse, total

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


@dataclass(frozen=True)
class Answer:
    """One client's final answer: ``status`` None when the client hung up (``cut``) or
    the connection failed (``error``); ``seconds`` from its send to that answer."""

    status: int | None
    seconds: float
    cut: bool = False
    error: str = ""
    stream_error: bool = False
    """A streamed answer that began 200 and ended with an error event (a clear error)."""

    @property
    def lost(self) -> bool:
        """Neither a success nor a clean HTTP error: the request fell on the floor."""
        return not self.cut and (self.status is None or self.status >= 500)


@dataclass
class FaultReport:
    """What one fault cost: every answer, the KV each instance held afterwards and how
    long until the fleet served a request again."""

    fault: str
    answers: list[Answer] = field(default_factory=list)
    kv_back_s: dict[str, float | None] = field(default_factory=dict)
    """Instance URL → seconds from idle until its KV usage was back to the fresh value
    (None: still above it when the wait ended)."""
    kv_after: dict[str, float] = field(default_factory=dict)
    service_back_s: float | None = None
    fault_at_s: float | None = None
    """Seconds after the clients sent when the fault struck (a kill): answers and KV are
    then also timed from the fault."""
    kv_samples: list[tuple[float, dict[str, float | None]]] = field(default_factory=list)
    """KV usage of each instance over time (seconds since the fault; None: unreachable)."""

    @property
    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.answers:
            key = "cut" if a.cut else str(a.status) if a.status is not None else "error"
            key += "+error" if a.stream_error else ""
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    @property
    def lost(self) -> int:
        return sum(a.lost for a in self.answers)

    @property
    def answer_p100_s(self) -> float:
        return max((a.seconds for a in self.answers if not a.cut), default=0.0)

    @property
    def answers_after_fault_s(self) -> list[float]:
        """Each client's final answer, in seconds after the fault (sends share one start)."""
        at = self.fault_at_s or 0.0
        return sorted(round(a.seconds - at, 3) for a in self.answers if not a.cut)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("answers")
        d.update(statuses=self.statuses, lost=self.lost, answer_p100_s=self.answer_p100_s)
        if self.fault_at_s is not None:
            d["answers_after_fault_s"] = self.answers_after_fault_s
        return d


def completion(prompt: str, max_tokens: int = 16, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


async def send(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    cut_after_s: float | None = None,
    timeout_s: float = 120.0,
) -> Answer:
    """POST a completion and read it to the end, or hang up after ``cut_after_s``."""
    t0 = time.perf_counter()

    tail = b""

    async def read() -> int:
        nonlocal tail
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for chunk in r.aiter_bytes():
                tail = (tail + chunk)[-4096:]
            return r.status_code

    limit = timeout_s if cut_after_s is None else min(cut_after_s, timeout_s)
    try:
        status = await asyncio.wait_for(read(), limit)
    except TimeoutError:
        if cut_after_s is not None and cut_after_s <= timeout_s:
            return Answer(None, time.perf_counter() - t0, cut=True)
        return Answer(None, time.perf_counter() - t0, error="client timeout")
    except httpx.HTTPError as e:
        return Answer(None, time.perf_counter() - t0, error=type(e).__name__)
    broken = bool(body.get("stream")) and status == 200 and b'data: {"error"' in tail
    return Answer(status, time.perf_counter() - t0, stream_error=broken)


def _prompt(i: int, words: int = 40) -> str:
    return f"chaos {i} " + "cache block prefill decode " * (words // 4)


async def disconnect_storm(
    client: httpx.AsyncClient,
    url: str,
    n: int,
    *,
    rng: random.Random,
    max_cut_s: float = 1.0,
    max_tokens: int = 48,
) -> list[Answer]:
    """``n`` streamed requests at once, each cut at a random point in ``[0, max_cut_s]``
    (before, during or after the prefill leg, or mid-stream on the decode leg)."""
    cuts = [rng.uniform(0.0, max_cut_s) for _ in range(n)]
    return list(
        await asyncio.gather(
            *(
                send(client, url, completion(_prompt(i), max_tokens, stream=True), cut_after_s=c)
                for i, c in enumerate(cuts)
            )
        )
    )


async def overload(
    client: httpx.AsyncClient, url: str, n: int, *, max_tokens: int = 16, timeout_s: float = 180
) -> list[Answer]:
    """``n`` concurrent requests (use ≥ 8x ``max_num_seqs``): they should queue, not fail."""
    return list(
        await asyncio.gather(
            *(
                send(client, url, completion(_prompt(i), max_tokens), timeout_s=timeout_s)
                for i in range(n)
            )
        )
    )


async def bad_input(
    client: httpx.AsyncClient, url: str, n: int, *, max_model_len: int
) -> list[Answer]:
    """``n`` requests the prefill accepts (the router asks it for one token) and the
    decode rejects (``max_tokens`` beyond the context): the cheapest way to leave
    finished KV on the prefill that nobody will read."""
    body = completion(_prompt(0), max_tokens=max_model_len * 8)
    return list(await asyncio.gather(*(send(client, url, body) for _ in range(n))))


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """KV usage, running and waiting requests of one instance (None if unreachable)."""
    try:
        r = await client.get(url + "/metrics", timeout=5)
        r.raise_for_status()
    except httpx.HTTPError:
        return None
    m = parse(r.text)
    return {k: total(m, k) or 0.0 for k in (KV_USAGE, RUNNING, WAITING)}


async def fresh_idle(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, float]:
    """Each instance's KV usage now (call on a fresh, idle fleet)."""
    out: dict[str, float] = {}
    for u in urls:
        s = await scrape(client, u)
        out[u] = s[KV_USAGE] if s else 0.0
    return out


async def fresh_idle_one(client: httpx.AsyncClient, url: str, *, wait_s: float = 60) -> float:
    """One instance's KV usage once it answers (a restarted instance's fresh value)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < wait_s:
        s = await scrape(client, url)
        if s is not None:
            return s[KV_USAGE]
        await asyncio.sleep(0.5)
    return 0.0


async def kv_back_to_idle(
    client: httpx.AsyncClient,
    baseline: dict[str, float],
    *,
    wait_s: float = 15.0,
    poll_s: float = 0.25,
    tolerance: float = 1e-6,
    samples: list[tuple[float, dict[str, float | None]]] | None = None,
) -> tuple[dict[str, float | None], dict[str, float]]:
    """Seconds until each instance is idle with its KV usage back at ``baseline`` (None
    if not within ``wait_s``), and the last usage read; ``samples`` collects every
    instance's usage at each poll while any is not back."""
    t0 = time.perf_counter()
    back: dict[str, float | None] = {u: None for u in baseline}
    last: dict[str, float] = {}
    while time.perf_counter() - t0 < wait_s and any(v is None for v in back.values()):
        seen: dict[str, float | None] = {}
        for u, base in baseline.items():
            if back[u] is not None:
                continue
            s = await scrape(client, u)
            seen[u] = None if s is None else s[KV_USAGE]
            if s is None:
                continue
            last[u] = s[KV_USAGE]
            if s[RUNNING] == 0 and s[WAITING] == 0 and s[KV_USAGE] <= base + tolerance:
                back[u] = time.perf_counter() - t0
        if samples is not None:
            samples.append((round(time.perf_counter() - t0, 2), seen))
        await asyncio.sleep(poll_s)
    return back, last


async def time_to_service(
    client: httpx.AsyncClient, url: str, *, wait_s: float = 60.0
) -> float | None:
    """Seconds until a plain request through ``url`` answers 200 (None: not in time)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < wait_s:
        a = await send(client, url, completion("are you back", 2), timeout_s=10)
        if a.status == 200:
            return time.perf_counter() - t0
        await asyncio.sleep(0.25)
    return None


async def healthy(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url + "/health", timeout=5)).status_code == 200
    except httpx.HTTPError:
        return False


async def run_fault(
    name: str,
    client: httpx.AsyncClient,
    router: str,
    baseline: dict[str, float],
    answers: list[Answer],
    *,
    wait_s: float = 15.0,
) -> FaultReport:
    """Finish a fault's report: KV back to idle on every instance, then service."""
    back, last = await kv_back_to_idle(client, baseline, wait_s=wait_s)
    service = await time_to_service(client, router, wait_s=wait_s)
    return FaultReport(name, answers, back, last, service)


def engine_pids(group_pids: Sequence[int]) -> list[int]:
    """The vLLM engine-core processes among an instance's processes (the process that
    crashed in the field: the API server then exits on its own)."""
    out = []
    for pid in group_pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"EngineCore" in cmd:
            out.append(pid)
    return out


async def kill_during_load(
    client: httpx.AsyncClient,
    url: str,
    pids: Sequence[int],
    *,
    n: int = 8,
    after_s: float = 0.5,
    timeout_s: float = 60.0,
) -> list[Answer]:
    """``n`` requests at once, then SIGKILL ``pids`` ``after_s`` later (mid-prefill or
    between finish and WRITE for some of them): every client must get a final answer."""
    sends = [
        asyncio.ensure_future(send(client, url, completion(_prompt(i), 32), timeout_s=timeout_s))
        for i in range(n)
    ]
    await asyncio.sleep(after_s)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return list(await asyncio.gather(*sends))
