"""The router's release requests (router/release.py), against mock workers: a
disaggregated request that ends without decode reading its KV makes the router ask the
prefill to free it, over HTTP; nothing is asked when decode read it, in pull mode, with
the stock connector, or when turned off. (tests/e2e/test_e2e_chaos.py proves the
prefill's KV comes back on real vLLM.)"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from pdctl.sdk.metrics import parse, total
from pdctl.sdk.pd import RELEASE_PARAM
from pdctl.sdk.router.mock import MockConfig, MockServer
from tests.unit.test_router import body, rig


def releases(m: MockServer) -> list[dict[str, Any]]:
    return m.state.releases


def legs(m: MockServer) -> list[dict[str, Any]]:
    return m.state.requests


async def settle(m: MockServer, n: int) -> list[dict[str, Any]]:
    for _ in range(100):
        if len(releases(m)) >= n:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # and no more than n
    return releases(m)


async def test_decode_failing_makes_the_router_release_prefills_kv():
    pcfg = MockConfig(role="prefill", engine_id="prefill-0")
    bad = [MockConfig(role="decode", status=500)]
    async with rig("push", prefill=pcfg, decodes=bad) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 500
        got = await settle(t.p, 1)
        assert len(got) == 1
        rel = got[0]
        (leg,) = legs(t.p)
        assert rel["path"] == "/v1/completions"
        assert rel["body"]["kv_transfer_params"] == {RELEASE_PARAM: [leg["request_id"]]}
        assert rel["body"]["max_tokens"] == 1
        assert rel["body"]["model"] == "tiny"
        assert rel["request_id"].startswith("pdctl-release-")
        assert rel["request_id"] != leg["request_id"]
        m = parse((await c.get(t.url + "/metrics")).text)
        assert total(m, "pdctl_router_kv_releases_total", {"outcome": "sent"}) == 1
        timeline = (await c.get(t.url + "/v1/pdctl/requests")).json()
        notes = timeline["requests"][0]["notes"]
        assert any("free the request's KV" in n for n in notes), notes


async def test_releases_for_one_prefill_are_batched():
    pcfg = MockConfig(role="prefill", engine_id="prefill-0")
    bad = [MockConfig(role="decode", status=503)]
    async with rig("push", prefill=pcfg, decodes=bad) as t, httpx.AsyncClient() as c:
        rs = await asyncio.gather(
            *(c.post(t.url + "/v1/completions", json=body(), timeout=10) for _ in range(6))
        )
        assert {r.status_code for r in rs} == {503}
        got = await settle(t.p, 1)
        ids = [i for r in got for i in r["body"]["kv_transfer_params"][RELEASE_PARAM]]
        assert sorted(ids) == sorted(leg["request_id"] for leg in legs(t.p))
        assert len(got) < 6  # gathered, not one request per failed request


async def test_no_release_when_decode_read_the_kv():
    async with rig("push") as t, httpx.AsyncClient() as c:
        for stream in (False, True):
            r = await c.post(t.url + "/v1/completions", json=body(stream=stream), timeout=10)
            assert r.status_code == 200
        assert await settle(t.p, 1) == []


async def test_no_release_when_off_or_on_the_stock_connector_or_in_pull_mode():
    bad = [MockConfig(role="decode", status=500)]
    for kw in (
        {"router": {"release_kv_on_failure": False}},
        {"fleet": {"connector": "stock"}},
    ):
        async with rig("push", decodes=bad, **kw) as t, httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
            assert r.status_code == 500
            assert await settle(t.p, 1) == [], kw
    async with rig("pull", decodes=bad) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 500
        assert await settle(t.p, 1) == []


async def test_a_prefill_that_cannot_be_reached_is_counted_not_retried():
    pcfg = MockConfig(role="prefill", engine_id="prefill-0")
    bad = [MockConfig(role="decode", status=500)]
    async with rig("push", prefill=pcfg, decodes=bad) as t, httpx.AsyncClient() as c:
        await t.p.stop()  # after the rig started: the release cannot be delivered
        assert t.router.releases is not None
        t.router.releases.ask(t.router.prefills[0], ["pdctl-0123456789"])
        for _ in range(100):
            m = parse((await c.get(t.url + "/metrics")).text)
            if total(m, "pdctl_router_kv_releases_total", {"outcome": "failed"}):
                break
            await asyncio.sleep(0.05)
        assert total(m, "pdctl_router_kv_releases_total", {"outcome": "failed"}) == 1
