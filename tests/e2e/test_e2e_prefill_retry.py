"""A real 2P1D vLLM-CPU push fleet (the demo spec with ``prefill.0.count=2``): a prefill
SIGKILLed while it computes costs no request — the router retries each of its requests
on the other prefill with a fresh decode registration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import demo_spec_text
from pdctl.sdk.specload import load_spec
from tests.e2e.conftest import WORDS, demo_spec, kill_api_server, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-prefill-retry"


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    _, overrides = demo_spec(tiny_model, NAME)
    spec = load_spec("<demo>", [*overrides, "prefill.0.count=2"], text=demo_spec_text()).spec
    yield from running_fleet(spec)


def test_prefill_killed_mid_prefill_fails_no_request(fleet: Fleet, state_root: Path):
    url = fleet.fleet.router_url
    states = {s.name: s.state for s in fleet.status()}
    assert states["prefill-0"] == states["prefill-1"] == "ready", states
    long_prompt = " ".join(WORDS[i % len(WORDS)] for i in range(250))

    errors: list[str] = []  # the router's non-200 answers, shown by a failing assertion

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as c:
            killed = asyncio.Event()

            async def one(i: int) -> int:
                body = {"model": "tiny", "prompt": f"{i} {long_prompt}", "max_tokens": 8}
                r = await c.post(url + "/v1/completions", json=body)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:300]}")
                return r.status_code

            async def client(k: int) -> list[int]:
                # keeps one request in flight until the kill, then sends 3 more: a batch
                # sent once can finish before the poll below sees prefill-0 busy
                got, i, after = [], k, 0
                while after < 3:
                    got.append(await one(i))
                    i += 8
                    after += killed.is_set()
                return got

            clients = [asyncio.create_task(client(k)) for k in range(8)]
            t0 = time.monotonic()
            while True:  # kill prefill-0 while a request is on it
                st = (await c.get(url + "/v1/pdctl/state")).json()
                busy = {i["name"]: i["in_flight"] for i in st["instances"]}
                if busy.get("prefill-0", 0) >= 1:
                    break
                done = [t.result() for t in clients if t.done()]
                assert not done, done  # a client raised: its error
                assert time.monotonic() - t0 < 60, (busy, errors[:3])
                await asyncio.sleep(0.005)
            kill_api_server(state_root, NAME, "prefill-0")
            killed.set()
            return [s for got in await asyncio.gather(*clients) for s in got]

    statuses = asyncio.run(run())
    assert statuses
    assert set(statuses) == {200}, (statuses, errors[:3])
    with httpx.Client() as c:
        recent = c.get(url + "/v1/pdctl/requests", params={"limit": 1000}).json()["requests"]
    retried = [t for t in recent if t["retries"]]
    assert all(t["prefill"] == "prefill-1" for t in retried), retried
    # requests that were on prefill-0 when it died (not merely refused a connection after)
    mid = [t for t in retried if any("retried on prefill prefill-1" in n for n in t["notes"])]
    assert mid, "the kill hit no request in flight"
    print(
        f"\n{len(mid)} requests on prefill-0 when it died, {len(retried)} retried, "
        f"0 of {len(statuses)} failed"
    )
