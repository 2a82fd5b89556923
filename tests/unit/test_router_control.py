"""Operator control of the router (drain, dispatch mode, state, policy) over HTTP, against mock
workers, through the SDK client."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from pdctl.sdk.client import AsyncRouterClient, RouterError
from pdctl.sdk.router.mock import MockConfig
from tests.unit.test_router import body, rig

TWO_DECODES = [MockConfig(role="decode"), MockConfig(role="decode")]


async def test_state_lists_every_instance_with_mode_and_in_flight():
    async with rig("push") as t:
        st = await AsyncRouterClient(t.url, pool=False).state()
        assert st.mode == "push"
        assert st.modes == ("push", "push-sequential")
        assert [(i.name, i.role, i.drained, i.in_flight) for i in st.instances] == [
            ("prefill-0", "prefill", False, 0),
            ("decode-0", "decode", False, 0),
        ]


async def test_drained_decode_gets_no_new_requests_and_resumes():
    async with rig("push", decodes=TWO_DECODES) as t, httpx.AsyncClient() as c:
        ctl = AsyncRouterClient(t.url, pool=False)
        names = [i.name for i in (await ctl.state()).instances if i.role == "decode"]
        st = await ctl.drain(names[0])
        assert st.instance(names[0]).drained
        for _ in range(4):
            assert (await c.post(t.url + "/v1/completions", json=body())).status_code == 200
        assert [len(t.mocks[n].state.requests) for n in names] == [0, 4]
        await ctl.drain(names[1])
        r = await c.post(t.url + "/v1/completions", json=body())
        assert r.status_code == 503
        assert "drained" in r.json()["error"]["message"]
        await ctl.resume(names[0])
        assert (await c.post(t.url + "/v1/completions", json=body())).status_code == 200
        assert len(t.mocks[names[0]].state.requests) == 1


async def test_wait_drained_returns_once_in_flight_work_is_done():
    slow = MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.6)
    async with rig("push-sequential", prefill=slow) as t, httpx.AsyncClient() as c:
        ctl = AsyncRouterClient(t.url, pool=False)
        req = asyncio.create_task(c.post(t.url + "/v1/completions", json=body()))
        for _ in range(100):  # wait for the prefill leg to be in flight
            if (await ctl.state()).instance("prefill-0").in_flight:
                break
            await asyncio.sleep(0.02)
        st = await ctl.drain("prefill-0")
        assert st.instance("prefill-0").in_flight == 1
        done = await ctl.wait_drained("prefill-0", poll_s=0.05)
        assert done.in_flight == 0
        # the prefill leg that was in flight finished on the drained instance (its decode
        # leg may still be running: draining is per instance), and the request succeeds
        assert t.p.state.completed == 1
        assert (await req).status_code == 200
        await ctl.resume("prefill-0")
        req2 = asyncio.create_task(c.post(t.url + "/v1/completions", json=body()))
        for _ in range(100):  # its prefill leg is in flight (a loaded machine may take a while)
            if (await ctl.state()).instance("prefill-0").in_flight:
                break
            await asyncio.sleep(0.02)
        await ctl.drain("prefill-0")
        with pytest.raises(RouterError, match="1 request\\(s\\) in flight"):
            await ctl.wait_drained("prefill-0", timeout_s=0.1, poll_s=0.02)
        assert (await req2).status_code == 200


async def test_mode_toggle_for_ab_and_refusals():
    async with rig("push") as t, httpx.AsyncClient() as c:
        ctl = AsyncRouterClient(t.url, pool=False)
        assert (await ctl.set_mode("push-sequential")).mode == "push-sequential"
        assert (await c.post(t.url + "/v1/completions", json=body())).status_code == 200
        (tl,) = t.router.recent()
        assert tl["mode"] == "push-sequential"
        assert tl["decode_sent_ms"] >= tl["prefill_done_ms"]
        reqs = await ctl.requests(limit=10)
        assert [r.id for r in reqs] == [tl["id"]]
        assert await ctl.requests(outcome="error") == []
        with pytest.raises(RouterError, match="not available for this push fleet"):
            await ctl.set_mode("pull")
        with pytest.raises(RouterError, match="no instance named 'nope'"):
            await ctl.drain("nope")
        assert (await ctl.set_mode("push")).mode == "push"


async def test_control_needs_the_api_key_when_one_is_set():
    async with rig("push", api_key=b"sekret") as t:
        with pytest.raises(RouterError, match="API key"):
            await AsyncRouterClient(t.url, pool=False).set_mode("push-sequential")
        keyed = AsyncRouterClient(t.url, api_key="sekret", pool=False)
        st = await keyed.set_mode("push-sequential")
        assert st.mode == "push-sequential"


async def test_unreachable_router_says_so():
    with pytest.raises(RouterError, match="cannot reach the router"):
        await AsyncRouterClient("http://127.0.0.1:9", control_timeout_s=1, pool=False).state()
