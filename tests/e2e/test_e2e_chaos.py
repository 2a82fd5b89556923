"""The push lifecycle under faults on a real vLLM-CPU 1P1D fleet (pdctl's connector, CPU
knobs on): input one side rejects, clients that hang up, overload, a WRITE that fails.
After each, every KV block must come back on both sides and nobody waits out a timeout.
One fleet for the module; each fault is small and bounded (the soak is
``benchmarks/chaos.py``)."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk import chaos
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body
from tests.e2e.conftest import demo_spec, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-chaos"
FAIL_TAG = "failpoint"
"""Requests whose id contains this have their push WRITE refused by the failpoint."""
IDLE_BACK_S = 5.0
"""The issue's goal: KV back to its fresh idle value within 5 s of the fleet going idle."""


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec = demo_spec(tiny_model, NAME)[0]
    spec.fleet.connector_options["pdctl_failpoint_write"] = f"match:{FAIL_TAG}"
    old = os.environ.get("PDCTL_ALLOW_FAILPOINTS")
    os.environ["PDCTL_ALLOW_FAILPOINTS"] = "1"
    try:
        yield from running_fleet(spec)
    finally:
        if old is None:
            os.environ.pop("PDCTL_ALLOW_FAILPOINTS", None)
        else:
            os.environ["PDCTL_ALLOW_FAILPOINTS"] = old


@pytest.fixture(scope="module")
def baseline(fleet: Fleet) -> dict[str, float]:
    """Fresh idle KV usage of both instances, read once after one warm-up request."""

    async def read() -> dict[str, float]:
        async with httpx.AsyncClient() as c:
            assert await chaos.time_to_service(c, router(fleet)) is not None
            await asyncio.sleep(1)
            return await chaos.fresh_idle(c, instance_urls(fleet))

    return asyncio.run(read())


def router(f: Fleet) -> str:
    return f.fleet.router_url


def instance_urls(f: Fleet) -> list[str]:
    return [p.url for p in f.fleet.plan.instances]


def gauge(url: str, name: str) -> float:
    return total(parse(httpx.get(url + "/metrics").text), name) or 0.0


async def assert_kv_back(c: httpx.AsyncClient, baseline: dict[str, float]) -> None:
    back, last = await chaos.kv_back_to_idle(c, baseline, wait_s=IDLE_BACK_S)
    stuck = {u: last.get(u) for u, s in back.items() if s is None}
    assert not stuck, f"KV still held {IDLE_BACK_S} s after idle: {stuck} (fresh {baseline})"
    print(f"KV back to idle after {back}")


async def test_input_decode_rejects_leaves_no_kv_on_prefill(fleet, baseline):
    """Prefill accepts (one token), decode rejects (max_tokens beyond the context): the
    prefill's finished KV is released at once, not after the 120 s lease."""
    async with httpx.AsyncClient(timeout=60) as c:
        answers = await chaos.bad_input(c, router(fleet), 4, max_model_len=1024)
        assert {a.status for a in answers} == {400}, answers
        await assert_kv_back(c, baseline)
    p, _ = instance_urls(fleet)
    assert gauge(p, rv.PREFILLS_WAITING) == 0


async def test_disconnect_storm_frees_every_block(fleet, baseline):
    async with httpx.AsyncClient(timeout=60) as c:
        answers = await chaos.disconnect_storm(
            c, router(fleet), 16, rng=random.Random(16), max_cut_s=1.0
        )
        assert not [a for a in answers if a.lost], answers
        await assert_kv_back(c, baseline)
        assert await chaos.time_to_service(c, router(fleet), wait_s=10) is not None
    p, d = instance_urls(fleet)
    assert gauge(d, rv.AWAITING_NOTIFICATIONS) == 0
    assert gauge(p, rv.PREFILLS_WAITING) == 0


async def test_overload_queues_instead_of_failing(fleet, baseline):
    async with httpx.AsyncClient(timeout=None) as c:
        answers = await chaos.overload(c, router(fleet), 32, max_tokens=8)
        assert [a.status for a in answers] == [200] * 32, answers
        await assert_kv_back(c, baseline)


async def test_failed_write_is_heard_by_decode_at_once(fleet, baseline):
    """The prefill's WRITE fails (failpoint): decode answers an error long before its
    120 s registration timeout, and both sides free the request's KV."""
    p, d = fleet.fleet.plan.instances
    ident = PrefillIdentity.from_plan(p)
    body = chaos.completion("the write of this request will fail " * 4, 8)
    rid = f"{FAIL_TAG}-{uuid.uuid4().hex}"
    headers = {"X-Request-Id": rid}
    async with httpx.AsyncClient(timeout=120) as c:
        t0 = time.perf_counter()
        pr, dr = await asyncio.gather(
            c.post(p.url + "/v1/completions", json=prefill_body(body), headers=headers),
            c.post(
                d.url + "/v1/completions",
                json=push_decode_body(body, ident, rid),
                headers=headers,
            ),
        )
        took = time.perf_counter() - t0
        print(f"failed WRITE: prefill {pr.status_code}, decode {dr.status_code} at {took:.2f} s")
        assert pr.status_code == 200, pr.text
        assert dr.status_code >= 500, dr.text  # failure_policy = "fail"
        assert took < 30, f"decode answered after {took:.1f} s: it waited for a timeout"
        await assert_kv_back(c, baseline)
        assert await chaos.time_to_service(c, router(fleet), wait_s=10) is not None
