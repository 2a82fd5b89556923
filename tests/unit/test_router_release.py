"""The router's release requests (router/release.py), against mock workers: a
disaggregated request that ends without decode reading its KV makes the router ask the
prefill to free it, over HTTP; nothing is asked when decode read it, in pull mode, with
the stock connector, or when turned off. (tests/e2e/test_e2e_chaos.py proves the
prefill's KV comes back on real vLLM.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from pdctl.sdk.metrics import parse, total
from pdctl.sdk.pd import RELEASE_PARAM, DispatchError, PrefillIdentity, push_request
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


async def test_the_sdk_dispatcher_releases_too_when_decode_fails():
    """``pd.push_request`` (scripts that dispatch both legs themselves) asks the prefill
    to free its KV when decode fails, and not when decode answered."""
    seen: list[tuple[str, dict[str, Any]]] = []
    decode_status = [500]

    def handler(request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content)
        seen.append((str(request.url.host), payload))
        if request.url.host == "d":
            return httpx.Response(decode_status[0], json={"choices": [{"text": "x"}]})
        return httpx.Response(200, json={"choices": [{"text": "y"}]})

    ident = PrefillIdentity("p-0", "127.0.0.1", 5600, 1, 1)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(DispatchError, match="answered 500"):
            await push_request(c, "http://p", "http://d", ident, body(), request_id="pdctl-r1")
        rel = [p for host, p in seen if host == "p" and RELEASE_PARAM in p["kv_transfer_params"]]
        assert [p["kv_transfer_params"][RELEASE_PARAM] for p in rel] == [["pdctl-r1"]]
        seen.clear()
        decode_status[0] = 200
        await push_request(c, "http://p", "http://d", ident, body(), request_id="pdctl-r2")
        assert sorted(h for h, _ in seen) == ["d", "p"]  # the two legs, no release
