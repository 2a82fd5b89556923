"""The cache_aware policy on mock engines: prompts sharing a prefix stay on one prefill,
the text path tokenizes once per prompt, disaggregation is decided on uncached tokens,
and the index state is on /metrics and the control endpoint."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from pdctl.sdk.router.mock import MockConfig
from tests.unit.test_router import Rig, rig

PREFILLS = [
    MockConfig(role="prefill", engine_id="prefill-0", side_channel_port=5600),
    MockConfig(role="prefill", engine_id="prefill-1", side_channel_port=5601),
]
NO_EVENTS = {"kv_events": False}  # FALLBACK: the router's own routing history
BS = 128  # the GPU default block size: the mock tokenizer gives one token per character


def prompts(groups: int, per_group: int) -> list[tuple[int, str]]:
    out = []
    for n in range(per_group):
        for g in range(groups):
            prefix = f"group {g} " + chr(ord("a") + g) * (4 * BS)
            out.append((g, f"{prefix} question {n} " + "x" * 40))
    return out


async def send_all(t: Rig, items: list[tuple[int, str]]) -> dict[int, set[str]]:
    """Send the prompts one after the other; the prefills each group went to."""
    used: dict[int, set[str]] = {}
    async with httpx.AsyncClient() as c:
        for g, p in items:
            r = await c.post(
                t.url + "/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": 4}
            )
            assert r.status_code == 200, r.text
            tl = t.router.history[-1]
            assert tl.prefill is not None
            used.setdefault(g, set()).add(tl.prefill)
    return used


async def test_cache_aware_keeps_each_prefix_on_one_prefill():
    router = {"policy": "cache_aware"}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        used = await send_all(t, prompts(3, 4))
        assert all(len(v) == 1 for v in used.values()), used
        # and the groups are spread, not piled on one prefill
        assert len(set().union(*used.values())) == 2
        s = t.router.instances.control_state()["kv_index"]["instances"]
        names = [u.name for u in t.router.prefills]
        assert {s[n]["state"] for n in names} == {"FALLBACK"}
        hit = [s[n]["predicted_hit_rate"] for n in names]
        assert all(h is not None and h >= 0.5 for h in hit), hit


async def test_least_loaded_splits_prefixes_across_prefills():
    """The baseline the policy is measured against (and proof the test above can fail)."""
    async with rig("push", prefills=PREFILLS, router={"policy": "least_loaded"}) as t:
        used = await send_all(t, prompts(3, 4))
        assert any(len(v) == 2 for v in used.values()), used


async def test_text_path_tokenizes_each_prompt_once():
    router = {"policy": "cache_aware"}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        items = prompts(1, 2)
        await send_all(t, items + items)
        assert sum(m.state.tokenized for m in t.mocks.values()) == 2
        assert t.router.cache is not None
        assert t.router.cache.tokenize_calls == 2


async def test_decode_only_when_few_tokens_are_uncached():
    router: dict[str, Any] = {"policy": "cache_aware", "disaggregate_min_uncached_tokens": 4096}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        async with httpx.AsyncClient() as c:
            r = await c.post(
                t.url + "/v1/completions",
                json={"model": "tiny", "prompt": "short prompt " * 20, "max_tokens": 4},
            )
        assert r.status_code == 200, r.text
        tl = t.router.history[-1]
        assert tl.decision == "decode-only"
        assert tl.prefill is None
        assert all(not t.mocks[u.name].state.requests for u in t.router.prefills)
    router["disaggregate_min_uncached_tokens"] = 16
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        used = await send_all(t, prompts(1, 1))
        assert len(used[0]) == 1
        assert t.router.history[-1].decision != "decode-only"


async def test_index_state_on_metrics_and_control():
    router = {"policy": "cache_aware"}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        await send_all(t, prompts(1, 2))
        async with httpx.AsyncClient() as c:
            text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_kv_index_state{instance="prefill-0",state="FALLBACK"} 1' in text
        assert 'pdctl_router_kv_index_state{instance="prefill-0",state="EXACT"} 0' in text
        assert "pdctl_router_prefix_blocks_matched" in text
        state = t.router.instances.control_state()
        assert state["kv_index"]["block_size"] == BS
        assert state["kv_index"]["hash_algo"] == "sha256"


async def test_events_configured_but_silent_publishers_degrade():
    """KV events on (the cache_aware default) with no publisher answering: the index says
    so instead of claiming EXACT, and requests still flow."""
    async with rig("push", prefills=PREFILLS, router={"policy": "cache_aware"}) as t:
        assert t.router.cache is not None
        await send_all(t, prompts(2, 2))
        states = {i.state for i in t.router.cache.index.instances.values()}
        assert "EXACT" not in states


async def test_long_prompts_share_one_tokenize_per_head():
    """Prompts over 1024 characters are looked up by their first 1024 x 2^k characters:
    a group sharing that head costs one /tokenize, and still stays on one prefill."""
    router = {"policy": "cache_aware"}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        items = [
            (g, f"group {g} " + chr(ord("a") + g) * 1100 + f" question {n} " + "y" * 200)
            for n in range(3)
            for g in range(3)
        ]
        used = await send_all(t, items)
        assert all(len(v) == 1 for v in used.values()), used
        assert sum(m.state.tokenized for m in t.mocks.values()) == 3
        tl = t.router.history[-1]
        assert any("prompt blocks" in n for n in tl.notes)


async def test_state_client_and_fleet_view_carry_the_index():
    pytest.importorskip("textual", reason="the fleet view needs the tui extra")
    from pdctl.sdk.client import AsyncRouterClient
    from pdctl.tui.views.fleet import cache_cell

    router = {"policy": "cache_aware"}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        await send_all(t, prompts(1, 3))
        st = await AsyncRouterClient(t.url, pool=False).state()
        used = t.router.history[-1].prefill
        assert used is not None
        i = st.instance(used)
        assert i.kv_index == "FALLBACK"
        assert i.prefix_hit_rate is not None
        assert i.prefix_hit_rate > 0.5
        cell = cache_cell(i.kv_index, i.prefix_hit_rate)
        assert str(cell).startswith("FALLBACK ")
    async with rig("push", prefills=PREFILLS) as t:
        st = await AsyncRouterClient(t.url, pool=False).state()
        assert all(i.kv_index is None for i in st.instances)
    assert cache_cell(None, None) == "-"


async def test_policy_switches_at_run_time():
    from pdctl.sdk.client import AsyncRouterClient, RouterError

    async with rig("push", prefills=PREFILLS, router={"policy": "cache_aware"}) as t:
        ctl = AsyncRouterClient(t.url, pool=False)
        await ctl.set_policy("least_loaded")
        assert t.router.instances.policy.name == "least_loaded"
        await send_all(t, prompts(1, 2))
        assert t.router.cache is not None
        assert t.router.cache.tokenize_calls == 0  # least_loaded: no lookups
        await ctl.set_policy("cache_aware")
        await send_all(t, prompts(1, 1))
        assert t.router.cache.tokenize_calls == 1
    async with rig("push", prefills=PREFILLS, router={"policy": "least_loaded"}) as t:
        with pytest.raises(RouterError, match="cache_aware needs"):
            await AsyncRouterClient(t.url, pool=False).set_policy("cache_aware")


async def test_monitor_reads_the_index_state_from_the_router():
    from pdctl.sdk.metrics.monitor import FleetMonitor, Target

    router = {"policy": "cache_aware"}
    async with rig("push", prefills=PREFILLS, router=router, fleet=NO_EVENTS) as t:
        await send_all(t, prompts(1, 2))
        targets = [Target("router", "router", t.url)]
        targets += [Target(u.name, u.role, u.url) for u in t.router.prefills]
        snap = await FleetMonitor(targets).poll()
        states = {i.name: i.kv_index for i in snap.instances}
        assert states == {"router": None, **{u.name: "FALLBACK" for u in t.router.prefills}}
