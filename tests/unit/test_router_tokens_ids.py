"""The tokens path's answers carry their token ids where vLLM's own server puts them, a
migration included; a stop string spanning a migration point is found once. Mock render
servers and engines (tests/e2e/test_e2e_tokens.py proves the ids on vLLM)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from pdctl.sdk.router.derendered import TokenIds
from pdctl.sdk.router.tokenresume import Resume
from tests.unit.test_router import event_loop_policy, rig
from tests.unit.test_router_tokens import LONG, TOKENS, body, first_dies, start_on_decode_0

__all__ = ["event_loop_policy"]  # the uvloop policy fixture, shared

PROMPT = list(range(10, 16))  # LONG's ids in the mock render server
CHAT = "/v1/chat/completions"


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": LONG}], **kw}


def events(r: httpx.Response) -> list[dict[str, Any]]:
    data = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert data[-1] == "[DONE]", r.text
    return [json.loads(d) for d in data[:-1]]


def ids_of(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for e in chunks for ch in e.get("choices") or [] for t in ch.get("token_ids", [])]


async def test_whole_completion_gets_each_choices_prompt_and_token_ids():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(LONG, return_token_ids=True))
        (ch,) = r.json()["choices"]
        assert (ch["prompt_token_ids"], ch["token_ids"]) == (PROMPT, [0, 1, 2])
        assert "prompt_token_ids" not in r.json()
        plain = await c.post(t.url + "/v1/completions", json=body(LONG))
        assert not {"prompt_token_ids", "token_ids"} & set(plain.json()["choices"][0])


async def test_whole_chat_gets_the_prompts_ids_at_the_top():
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + CHAT, json=chat_body(max_tokens=2, return_token_ids=True))
        out = r.json()
        prompt = t.mocks["render-0"].state.requests[1]["body"]["prompt_token_ids"]
        assert out["prompt_token_ids"] == prompt
        (ch,) = out["choices"]
        assert ch["token_ids"] == [0, 1]
        assert "prompt_token_ids" not in ch


@pytest.mark.parametrize("endpoint", ["/v1/completions", CHAT])
async def test_a_stream_gets_every_chunks_ids_and_the_prompts_once(endpoint: str):
    req = (
        body(LONG, stream=True, return_token_ids=True)
        if endpoint != CHAT
        else chat_body(max_tokens=3, stream=True, return_token_ids=True)
    )
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        got = events(await c.post(t.url + endpoint, json=req))
        prompt = t.mocks["render-0"].state.requests[1]["body"]["prompt_token_ids"]
    assert [len(e["choices"][0]["token_ids"]) for e in got] == [1, 1, 1]
    first, *rest = got
    if endpoint == CHAT:  # the top of the first chunk, as vLLM's chat server does
        assert first["prompt_token_ids"] == prompt
        assert "prompt_token_ids" not in first["choices"][0]
    else:  # the first chunk's choice, as vLLM's completions server does
        assert first["choices"][0]["prompt_token_ids"] == prompt
        assert "prompt_token_ids" not in first
    assert all("prompt_token_ids" not in e and "prompt_token_ids" not in e["choices"][0]
               for e in rest)  # fmt: skip
    assert ids_of(got) == list(range(len(prompt), len(prompt) + 3))  # the mock's token k is k


async def test_a_migrated_stream_gets_its_ids_and_the_original_prompts_once():
    async with rig("push", router=TOKENS, render=True, decodes=first_dies(die_after_chunks=2)) as t:
        start_on_decode_0(t)
        req = body(LONG, stream=True, max_tokens=5, return_token_ids=True)
        async with httpx.AsyncClient() as c:
            got = events(await c.post(t.url + "/v1/completions", json=req))
        assert t.router.recent()[0]["migrations"]
    assert ids_of(got) == [6, 7, 8, 9, 10]
    assert [e["choices"][0].get("prompt_token_ids") for e in got] == [PROMPT] + [None] * 4


async def test_a_stop_string_spanning_the_migration_point_is_found_once():
    """The mock engine's token k reads " <[k]>" and it checks stop strings on the text it
    generated only, as vLLM's does: "]> <[8" begins in token 7's text (sent before the
    death) and ends in token 8's. The continuation computes token 7 again, so it finds
    the stop string; the client gets token 7 once and the answer one decode gives."""
    stop = {"stop": ["]> <[8"]}
    req = body(LONG, stream=True, max_tokens=6, return_token_ids=True, **stop)
    async with rig("push", router=TOKENS, render=True) as t, httpx.AsyncClient() as c:
        alone = events(await c.post(t.url + "/v1/completions", json=req))
    assert ids_of(alone) == [6, 7, 8]
    assert alone[-1]["choices"][0]["finish_reason"] == "stop"
    async with rig("push", router=TOKENS, render=True, decodes=first_dies(die_after_chunks=2)) as t:
        start_on_decode_0(t)
        async with httpx.AsyncClient() as c:
            got = events(await c.post(t.url + "/v1/completions", json=req))
        cont = t.mocks["decode1-0"].state.requests[-1]["body"]
        (tl,) = t.router.recent()
    assert cont["token_ids"] == [*PROMPT, 6]  # token 7's text may start the stop string
    assert cont["sampling_params"]["max_tokens"] == 5
    assert ids_of(got) == ids_of(alone)
    assert [e["choices"][0]["text"] for e in got] == [e["choices"][0]["text"] for e in alone]
    assert got[-1]["choices"][0]["finish_reason"] == "stop"
    assert (tl["outcome"], tl["completion_tokens"]) == ("ok", 3)
    assert [m["tokens_sent"] for m in tl["migrations"]] == [2]


def test_without_stop_strings_the_continuation_takes_every_token_sent():
    r = Resume({"token_ids": [1, 2], "sampling_params": {"max_tokens": 5}}, ())
    for k in (3, 4):
        assert r.seen({"choices": [{"index": 0, "token_ids": [k], "finish_reason": None}]})
        r.derendered({"choices": [{"index": 0, "text": "x"}]})
    cont = r.continuation()
    assert cont is not None
    assert (cont["token_ids"], cont["sampling_params"]["max_tokens"]) == ([1, 2, 3, 4], 3)


def test_recomputed_ids_and_their_logprobs_are_cut_and_usage_counts_the_whole_answer():
    gen = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 9, "stop": ["abc"]}}
    r = Resume(gen, ())
    for k, text in ((3, "xxxx"), (4, "y"), (5, "z")):
        r.seen({"choices": [{"index": 0, "token_ids": [k], "finish_reason": None}]})
        r.derendered({"choices": [{"index": 0, "text": text}]})
    cont = r.continuation()
    assert cont is not None  # "yz" (the last 2 characters) may begin "abc": 4, 5 again
    assert (cont["token_ids"], cont["sampling_params"]["max_tokens"]) == ([1, 2, 3], 8)
    lp = {"content": [{"token_id": k, "logprob": -1.0} for k in (4, 5, 6)]}
    chunk: dict[str, Any] = {
        "prompt_token_ids": [1, 2, 3],
        "choices": [{"index": 0, "token_ids": [4, 5, 6], "logprobs": lp}],
        "usage": {"completion_tokens": 3},
    }
    assert r.seen(chunk)
    assert chunk["choices"][0]["token_ids"] == [6]
    assert [e["token_id"] for e in chunk["choices"][0]["logprobs"]["content"]] == [6]
    assert "prompt_token_ids" not in chunk  # the continuation's prompt, not the client's
    assert chunk["usage"]["completion_tokens"] == 4  # 3, then 4 5 6 (4 and 5 once)
    assert r.ids == [3, 4, 5, 6]
    assert not r.seen({"choices": [{"index": 0, "token_ids": [], "finish_reason": None}]})


def test_chat_hiding_its_reasoning_gets_only_the_ids_the_derender_gave():
    """vLLM's chat server leaves the choices' ids out when a reasoning parser hides the
    reasoning; the router cannot see the parser, so it adds none there."""
    gen = {"choices": [{"index": 0, "token_ids": [7, 8]}]}
    hidden = TokenIds(CHAT, {"return_token_ids": True, "include_reasoning": False}, [1])
    out = hidden.whole({"choices": [{"index": 0, "message": {}}]}, gen)
    assert "token_ids" not in out["choices"][0]
    assert out["prompt_token_ids"] == [1]
    given = hidden.whole({"choices": [{"index": 0, "message": {}, "token_ids": [7, 8]}]}, gen)
    assert given["choices"][0]["token_ids"] == [7, 8]


def test_a_derendered_chunks_own_prompt_ids_give_way_to_the_clients():
    """vLLM 0.33's derender copies the generate chunk's ``prompt_token_ids``: for a
    continuation that is its own prompt. The client's are the render's, once."""
    ids = TokenIds("/v1/completions", {"return_token_ids": True}, [1, 2])
    gen = {"choices": [{"index": 0, "token_ids": [3]}]}
    first = ids.chunk({"choices": [{"index": 0, "text": "a", "prompt_token_ids": [1, 2]}]}, gen)
    later = ids.chunk({"choices": [{"index": 0, "text": "b", "prompt_token_ids": [1, 2, 3]}]}, gen)
    assert first["choices"][0] == {"index": 0, "text": "a", "prompt_token_ids": [1, 2],
                                   "token_ids": [3]}  # fmt: skip
    assert later["choices"][0] == {"index": 0, "text": "b", "token_ids": [3]}
