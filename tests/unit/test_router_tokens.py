"""The router's tokens path against mock render servers and engines: render once, decide
on the token count, push-mode legs on /inference/v1/generate, derender (whole and
streamed), and what happens without a render server. (tests/e2e proves it on vLLM.)"""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest

from pdctl.sdk.pd import prefill_generate_body
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.spec import FleetSpec
from tests.unit.test_router import Rig, event_loop_policy, rig
from tests.unit.test_router_engine_death import linked

__all__ = ["event_loop_policy"]  # the uvloop policy fixture, shared

TOKENS = {"path": "tokens", "disaggregate_min_tokens": 4}
LONG = "one two three four five six"  # 6 tokens in the mock render server
SHORT = "one two"  # 2 tokens


def body(prompt: str | list[str], **kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 3, **kw}


async def test_long_prompt_takes_the_push_path_on_generate():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(LONG))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "derendered:[0, 1, 2]"
        (preq,), (dreq,) = t.p.state.requests, t.d.state.requests
        assert preq["path"] == dreq["path"] == "/inference/v1/generate"
        assert preq["request_id"] == dreq["request_id"] == preq["body"]["request_id"]
        assert preq["body"]["sampling_params"]["max_tokens"] == 1
        assert preq["body"]["kv_transfer_params"]["do_remote_decode"] is True
        ktp = dreq["body"]["kv_transfer_params"]
        assert ktp["do_remote_prefill"] is True
        assert ktp["remote_engine_id"] == "prefill-0"
        assert dreq["body"]["token_ids"] == list(range(10, 16))
        paths = [q["path"] for q in t.mocks["render-0"].state.requests]
        assert paths == ["/v1/completions/render", "/v1/completions/derender"]
        (tl,) = (await c.get(t.url + "/v1/pdctl/requests")).json()["requests"]
        assert (tl["route_path"], tl["decision"], tl["render"]) == (
            "tokens",
            "disaggregated",
            "render-0",
        )
        assert tl["prompt_tokens"] == 6
        assert tl["completion_tokens"] == 3


async def test_short_prompt_goes_to_decode_alone():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(SHORT))
        assert r.status_code == 200, r.text
        assert t.p.state.requests == []
        (dreq,) = t.d.state.requests
        assert "kv_transfer_params" not in dreq["body"]
        metrics = (await c.get(t.url + "/metrics")).text
        assert (
            'pdctl_router_disaggregation_decisions_total{decision="decode-only",route="tokens"} 1'
            in metrics
        )


async def test_streamed_answer_is_derendered_chunk_by_chunk():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(LONG, stream=True))
        assert r.status_code == 200
        events = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        assert texts == [" <[6]>", " <[7]>", " <[8]>"]  # the mock's token k is k
        calls = [q["body"] for q in t.mocks["render-0"].state.requests[1:]]
        # the detokenizer state comes back with every call and is sent with the next
        assert [c.get("stream_state") for c in calls] == [
            None,
            {"prefix_offset": 1},
            {"prefix_offset": 2},
        ]
        assert all(c["prompt_token_ids"] == list(range(10, 16)) for c in calls)


async def test_chat_uses_the_chat_render_endpoints():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": LONG}], "max_tokens": 2}
        r = await c.post(t.url + "/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        paths = [q["path"] for q in t.mocks["render-0"].state.requests]
        assert paths == ["/v1/chat/completions/render", "/v1/chat/completions/derender"]
        derender = t.mocks["render-0"].state.requests[1]["body"]
        assert derender["chat_request"]["messages"] == chat["messages"]


async def test_several_prompts_are_refused_clearly():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body([LONG, SHORT]))
        assert r.status_code == 400
        assert "one prompt per request" in r.json()["error"]["message"]
        assert t.d.state.requests == []


@pytest.mark.parametrize("fallback", ["error", "text"])
async def test_render_server_down(fallback: str):
    router = {**TOKENS, "render_fallback": fallback}
    async with rig("push", router=router, render=True) as t, httpx.AsyncClient() as c:
        await t.mocks["render-0"].stop()
        r = await c.post(t.url + "/v1/completions", json=body(LONG))
        (tl,) = (await c.get(t.url + "/v1/pdctl/requests")).json()["requests"]
        if fallback == "error":
            assert r.status_code == 503
            assert "no render server available" in r.json()["error"]["message"]
            assert t.d.state.requests == []
        else:
            assert r.status_code == 200, r.text
            assert t.d.state.requests[0]["path"] == "/v1/completions"
            assert tl["route_path"] == "text-fallback"


async def test_max_tokens_dropped_by_render_is_restored():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(LONG, max_tokens=16))
        assert r.status_code == 200, r.text
        (dreq,) = t.d.state.requests
        assert dreq["body"]["sampling_params"]["max_tokens"] == 16


def test_prefill_generate_body_keeps_the_request_but_one_token():
    gen: dict[str, Any] = {
        "token_ids": [1, 2],
        "sampling_params": {"max_tokens": 9, "min_tokens": 3, "temperature": 0},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = prefill_generate_body(gen)
    assert out["sampling_params"] == {"max_tokens": 1, "temperature": 0}
    assert out["stream"] is False
    assert "stream_options" not in out
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert gen["sampling_params"]["max_tokens"] == 9  # the original is untouched


def test_tokens_path_needs_a_render_server():
    with pytest.raises(ValueError, match=r"needs a render server.*\[\[render\]\]"):
        FleetSpec(
            model={"path": "org/m"},
            fleet={"platform": "gpu"},
            prefill=[{"devices": [0]}],
            decode=[{"devices": [1]}],
            router={"path": "tokens"},
        )


# ---------------------------------------------------------------------- migration


def first_dies(**how: Any) -> list[MockConfig]:
    return [MockConfig(role="decode", chunk_delay_s=0.01, **how), MockConfig(role="decode")]


def start_on_decode_0(t: Rig) -> None:
    t.router.instances.set_policy("round_robin")
    t.router.instances.policy.turns = itertools.count(0, 2)


def streamed_texts(r: httpx.Response) -> list[str]:
    events = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e)["choices"][0].get("text", "") for e in events[:-1]]


@pytest.mark.parametrize("how", [{"die_after_chunks": 2}, {"error_after_chunks": 2}])
async def test_a_stream_whose_decode_dies_continues_on_another(how: dict[str, int]):
    """The connection lost, or vLLM's engine-dead error event: the stream goes on from the
    tokens the client has, decode-only, and the derender state carries on."""
    async with rig("push", router=TOKENS, render=True, decodes=first_dies(**how)) as t:
        start_on_decode_0(t)
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(LONG, stream=True, max_tokens=5))
        assert streamed_texts(r) == [f" <[{k}]>" for k in range(6, 11)]
        cont = t.mocks["decode1-0"].state.requests[-1]["body"]
        assert cont["token_ids"] == [*range(10, 16), 6, 7]
        assert cont["sampling_params"]["max_tokens"] == 3
        assert "kv_transfer_params" not in cont
        (tl,) = t.router.recent()
        assert tl["outcome"] == "ok"
        assert tl["completion_tokens"] == 5
        assert [(m["from"], m["to"], m["tokens_sent"]) for m in tl["migrations"]] == [
            ("decode-0", "decode1-0", 2)
        ]
        states = [q["body"].get("stream_state") for q in t.mocks["render-0"].state.requests[1:]]
        assert states == [None] + [{"prefix_offset": k} for k in range(1, 5)]
        assert all(u.outstanding == 0 for u in t.router.upstreams)


async def test_a_whole_answer_of_a_dead_engine_is_answered_by_another_decode():
    async with rig("push", router=TOKENS, render=True, decodes=first_dies()) as t:
        await linked(t, None, "decode-0")
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(LONG))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "derendered:[0, 1, 2]"
        (tl,) = t.router.recent()
        assert [m["from"] for m in tl["migrations"]] == ["decode-0"]


@pytest.mark.parametrize("stream", [False, True])
async def test_tokens_path_honours_the_migration_limit(stream: bool):
    three = [MockConfig(role="decode") for _ in range(3)]
    limit = {**TOKENS, "migration_limit": 1}
    async with rig("push", router=limit, render=True, decodes=three) as t:
        await linked(t, None, "decode-0", "decode1-0", "decode2-0")
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(LONG, stream=stream))
        assert r.status_code == 500  # the last decode's own answer
        assert "EngineCore" in r.text
        (tl,) = t.router.recent()
        assert len(tl["migrations"]) == 1
        received = [t.mocks[n].state.received for n in ("decode-0", "decode1-0", "decode2-0")]
        assert received == [1, 1, 0]


async def test_a_stream_cut_mid_answer_with_migration_off_ends_in_an_error_event():
    async with rig(
        "push",
        router={**TOKENS, "migration_limit": 0},
        render=True,
        decodes=first_dies(die_after_chunks=2),
    ) as t:
        start_on_decode_0(t)
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(LONG, stream=True, max_tokens=5))
        events = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
        assert json.loads(events[-2])["error"]["code"] == 502
        assert t.router.recent()[0]["migrations"] == []
