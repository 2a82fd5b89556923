"""The live output canary on a real vLLM-CPU 1P1D push fleet (pdctl's connector): with
the digest check off (``pdctl_kv_verify_rate = 0``) and the corrupting failpoint
zeroing the first received block of every second request on the decode
(``zero:every:2``), greedy requests sent through the router at 2 per second, the router's
canary (``router.canary.rate = 1.0``, replays on the pair's decode with their own
prefix-cache salt) flags the P->D pair within 60 s — while the requests whose KV was left
alone match their replays. One fleet for the module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.events.derive import from_requests
from pdctl.sdk.events.kinds import CANARY_DIVERGED
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics import parse, total
from tests.e2e.conftest import WORDS, demo_spec, running_with_failpoints

pytestmark = pytest.mark.e2e

NAME = "e2e-canary"
RATE_S = 0.5
"""Seconds between requests: 2 per second."""
DEADLINE_S = 60.0
MAX_TOKENS = 12
PAIR = {"prefill": "prefill-0", "decode": "decode-0"}


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec, _ = demo_spec(tiny_model, NAME)
    spec.fleet.connector_options["pdctl_kv_verify_rate"] = 0.0
    spec.fleet.connector_options["pdctl_failpoint_kv_corrupt"] = "zero:every:2"
    assert spec.router is not None
    spec.router.canary.rate = 1.0
    spec.router.canary.busy_outstanding = 16
    yield from running_with_failpoints(spec)


def url_of(f: Fleet, name: str) -> str:
    (s,) = [s for s in f.status() if s.name == name]
    return s.url


def body(i: int) -> dict[str, Any]:
    words = " ".join(WORDS[(i * 5 + k * k) % len(WORDS)] for k in range(80))
    return {
        "model": "tiny",
        "prompt": f"{i} {words}",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": i % 3 == 0,  # streamed answers are compared too
    }


def canary(c: httpx.Client, router: str) -> dict[str, float]:
    m = parse(c.get(router + "/metrics").text)
    return {
        r: total(m, "pdctl_router_canary_total", {**PAIR, "result": r}) or 0.0
        for r in ("match", "diverged", "error")
    }


async def load(router: str, stop: asyncio.Event, sent: list[int]) -> None:
    """Greedy requests at 2 per second until ``stop`` (each answered 200)."""
    async with httpx.AsyncClient(timeout=120) as c:
        tasks: list[asyncio.Task[httpx.Response]] = []
        i = 0
        while not stop.is_set():
            tasks.append(asyncio.create_task(c.post(router + "/v1/completions", json=body(i))))
            sent.append(i)
            i += 1
            await asyncio.sleep(RATE_S)
        for r in await asyncio.gather(*tasks):
            assert r.status_code == 200, r.text


def test_the_canary_flags_a_pair_whose_kv_is_corrupted_within_a_minute(fleet: Fleet):
    router = url_of(fleet, "router")
    with httpx.Client(timeout=30) as c:
        start = canary(c, router)
        assert start == {"match": 0.0, "diverged": 0.0, "error": 0.0}  # exported at 0

        async def run() -> float | None:
            stop, sent = asyncio.Event(), list[int]()
            loader = asyncio.create_task(load(router, stop, sent))
            t0, flagged = time.monotonic(), None
            try:
                while time.monotonic() - t0 < DEADLINE_S:
                    await asyncio.sleep(0.5)
                    got = await asyncio.to_thread(canary, c, router)
                    if flagged is None and got["diverged"] > 0:
                        flagged = time.monotonic() - t0
                    if flagged is not None and got["match"] > 0:
                        break
            finally:
                stop.set()
                await loader
            return flagged

        flagged = asyncio.run(run())
        assert flagged is not None, f"no divergence within {DEADLINE_S:g} s"
        assert flagged <= DEADLINE_S
        time.sleep(2.0)  # the last replays
        got = canary(c, router)
        # the requests whose KV was left alone agree with their replays
        assert got["match"] >= 1, got
        flights = c.get(router + "/v1/pdctl/requests?limit=1000").json()["requests"]
    said = [f["canary"] for f in flights if f.get("canary")]
    diverged = [s for s in said if s["result"] == "diverged"]
    assert diverged, said
    assert all(s["on"] == "decode-0" and "character" in s["detail"] for s in diverged)
    events = [e for e in from_requests(flights) if e.kind == CANARY_DIVERGED]
    assert len(events) == len(diverged)
    assert all("prefill-0 → decode-0" in e.message for e in events)
    print(f"flagged after {flagged:.1f} s; canary {got}")
