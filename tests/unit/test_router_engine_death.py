"""An engine that dies behind a live HTTP server, against mock workers (one layer: the
router's recovery path). The mock answers what vLLM answers once its EngineCore died
(:data:`pdctl.sdk.router.mock.ENGINE_DEAD`, a 500; ``/health`` 503) or sends it as an
error event mid-stream. Every request migrates like one whose connection dropped, the
instance is marked down at once and the supervisor is told; ``migration_limit`` holds.
The e2e counterpart kills a real EngineCore (tests/e2e/test_e2e_engine_death.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.suspects import SupervisorLink
from tests.unit.test_router import Rig, body, rig
from tests.unit.test_router_faults import read_stream, tokens_of


class FakeSupervisor:
    """A stand-in for the supervisor's control socket that records what it hears."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[dict[str, Any]] = []
        self.heard = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> FakeSupervisor:
        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.lines.append(json.loads(await reader.readline()))
            self.heard.set()
            writer.write(b'{"ok": true, "dead": true}\n')
            await writer.drain()
            writer.close()

        self._server = await asyncio.start_unix_server(on_client, path=str(self.path))
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def supervisor() -> AsyncIterator[FakeSupervisor]:
    with tempfile.TemporaryDirectory() as d:  # a short path: AF_UNIX allows ~100 bytes
        sup = await FakeSupervisor(Path(d) / "control.sock").start()
        try:
            yield sup
        finally:
            await sup.stop()


async def linked(t: Rig, sup: FakeSupervisor | None, *dead: str) -> None:
    """The router tells ``sup`` (as ``pdctl up`` wires it); requests start on decode-0;
    the engines of ``dead`` die once the router's first health round has seen them up."""
    for _ in range(500):  # a poll: the health loop offers no "round done" event
        if all(m.state.health_checks for m in t.mocks.values()):
            break
        await asyncio.sleep(0.01)
    if sup is not None:
        t.router.dispatcher.recovery.link = SupervisorLink(str(sup.path))
    t.router.instances.set_policy("round_robin")
    t.router.instances.policy.turns = itertools.count(0, 2)
    for name in dead:
        t.mocks[name].config.engine_dead = True


async def assert_told(t: Rig, sup: FakeSupervisor, name: str = "decode-0") -> None:
    """``name`` is down now (its /health says 503) and the supervisor heard of it."""
    await asyncio.wait_for(sup.heard.wait(), 5)
    assert [(x["cmd"], x["name"], x["by"]) for x in sup.lines] == [("suspect", name, "router")]
    await asyncio.sleep(0.1)  # the immediate re-check has answered
    assert not t.router.instances.upstream(name).healthy


def two() -> list[MockConfig]:
    return [MockConfig(role="decode"), MockConfig(role="decode")]


async def test_non_streamed_answer_of_a_dead_engine_migrates(supervisor):
    async with rig("push", decodes=two(), health_interval_s=60) as t:
        await linked(t, supervisor, "decode-0")
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(max_tokens=5), timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        tl = t.router.recent()[0]
        assert tl["outcome"] == "ok"
        assert [(m["from"], m["to"], m["tokens_sent"]) for m in tl["migrations"]] == [
            ("decode-0", "decode1-0", 0)
        ]
        assert "answered 500" in tl["migrations"][0]["why"]
        assert "EngineCore encountered an issue" in tl["migrations"][0]["why"]
        # decode-only on the survivor: no kv_transfer_params, the client's own request
        sent = t.mocks["decode1-0"].state.requests[-1]["body"]
        assert "kv_transfer_params" not in sent
        assert sent["prompt"] == "hello world"
        await assert_told(t, supervisor)
        assert all(u.outstanding == 0 for u in t.router.upstreams)


async def test_chat_non_streamed_keeps_chat_shape_after_migrating(supervisor):
    async with rig("push", decodes=two(), health_interval_s=60) as t:
        await linked(t, supervisor, "decode-0")
        payload = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/chat/completions", json=payload, timeout=10)
        assert r.status_code == 200, r.text
        sent = t.mocks["decode1-0"].state.requests[-1]
        assert sent["path"] == "/v1/chat/completions"  # restarted whole, not continued
        assert sent["body"]["messages"] == payload["messages"]


async def test_stream_whose_head_is_a_5xx_migrates(supervisor):
    async with rig("push", decodes=two(), health_interval_s=60) as t:
        await linked(t, supervisor, "decode-0")
        async with httpx.AsyncClient() as c:
            events = await read_stream(
                c, t.url + "/v1/completions", body(prompt="a b", stream=True, max_tokens=4)
            )
        assert events[-1] == "[DONE]"
        assert tokens_of(events) == [" t2", " t3", " t4", " t5"]
        tl = t.router.recent()[0]
        assert tl["outcome"] == "ok"
        assert [m["from"] for m in tl["migrations"]] == ["decode-0"]
        await assert_told(t, supervisor)


async def test_error_event_mid_stream_migrates_without_loss_or_repeat(supervisor):
    decodes = [
        MockConfig(role="decode", chunk_delay_s=0.01, error_after_chunks=3),
        MockConfig(role="decode", chunk_delay_s=0.01),
    ]
    async with rig("push", decodes=decodes, health_interval_s=60) as t:
        await linked(t, supervisor)
        async with httpx.AsyncClient() as c:
            events = await read_stream(
                c,
                t.url + "/v1/completions",
                body(
                    prompt="a b c",
                    stream=True,
                    max_tokens=8,
                    stream_options={"include_usage": True},
                ),
            )
        assert events[-1] == "[DONE]"
        assert tokens_of(events) == [f" t{k}" for k in range(3, 11)]  # tokens_of: no error
        assert sum(e == "[DONE]" for e in events) == 1
        tl = t.router.recent()[0]
        assert [(m["from"], m["tokens_sent"]) for m in tl["migrations"]] == [("decode-0", 3)]
        assert "error event" in tl["migrations"][0]["why"]
        await assert_told(t, supervisor)


async def test_alive_engine_refusing_with_503_migrates_and_stays_up():
    """vLLM's queue-full 503 ("try again ... on a different instance"): the request
    moves, and the instance's immediate re-check (``/health`` 200) keeps it in service."""
    decodes = [MockConfig(role="decode", status=503), MockConfig(role="decode")]
    async with rig("push", decodes=decodes, health_interval_s=60) as t:
        t.router.instances.policy.turns = itertools.count(0, 2)
        async with httpx.AsyncClient() as c:
            r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 200, r.text
        assert t.router.recent()[0]["migrations"][0]["from"] == "decode-0"
        for _ in range(50):
            if t.router.instances.upstream("decode-0").healthy:
                break
            await asyncio.sleep(0.02)
        assert t.router.instances.upstream("decode-0").healthy


async def test_migration_limit_bounds_a_fleet_of_dead_engines():
    """Every engine dead: one migration (the limit), then the client gets the last
    decode's own answer (vLLM's 500), streamed or not."""
    three = [MockConfig(role="decode") for _ in range(3)]
    async with (
        rig("push", decodes=three, router={"migration_limit": 1}, health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        await linked(t, None, "decode-0", "decode1-0", "decode2-0")
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "InternalServerError"
        assert len(t.router.recent()[0]["migrations"]) == 1
        served = sum(len(m.state.requests) for m in t.mocks.values() if m.config.role == "decode")
        assert served == 2  # the first decode and one migration, no more
        for u in t.router.decodes:  # the supervisor's word: back (their engines still dead)
            t.router.instances.set_health(u.name, True)
        s = await c.post(t.url + "/v1/completions", json=body(stream=True), timeout=10)
        assert s.status_code == 500
        assert len(t.router.recent()[0]["migrations"]) == 1
        assert all(u.outstanding == 0 for u in t.router.upstreams)


async def test_only_decode_alive_after_an_error_is_retried_when_its_prefill_died():
    """A 1P1D fleet whose decode answers a 5xx and is alive (``/health`` 200) while the
    request's prefill is dead (``/health`` 503: the KV it was to push never came): the
    request is retried on that decode, decode-only, and completes."""
    dcfg = MockConfig(role="decode", fail_first=1)
    async with (
        rig("push", decodes=[dcfg], health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        await linked(t, None, "prefill-0")
        t.p.config.engine_dead = False  # it answers this request, then dies
        t.p.config.healthy = False
        r = await c.post(t.url + "/v1/completions", json=body(max_tokens=3), timeout=10)
        assert r.status_code == 200, r.text
        tl = t.router.recent()[0]
        assert [(m["from"], m["to"]) for m in tl["migrations"]] == [("decode-0", "decode-0")]
        assert "kv_transfer_params" not in t.d.state.requests[-1]["body"]
        assert t.router.instances.upstream("decode-0").healthy
        assert not t.router.instances.upstream("prefill-0").healthy


async def test_a_prefill_that_dies_just_after_its_restart_is_seen_dead():
    """The supervisor said prefill-0 is up moments ago (it had restarted) and its engine
    dies at once: its ``/health`` 503 is an answer, not a slow start, so the grace for a
    just-started instance does not hide it, and the decode's 5xx is retried on it."""
    dcfg = MockConfig(role="decode", fail_first=1)
    async with (
        rig("push", decodes=[dcfg], health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        await linked(t, None)
        t.router.instances.set_health("prefill-0", True)  # restarted and ready: trusted
        t.p.config.healthy = False  # it answers this request, then its engine is dead
        r = await c.post(t.url + "/v1/completions", json=body(max_tokens=3), timeout=10)
        assert r.status_code == 200, r.text
        tl = t.router.recent()[0]
        assert [(m["from"], m["to"]) for m in tl["migrations"]] == [("decode-0", "decode-0")]
        assert not t.router.instances.upstream("prefill-0").healthy


async def test_only_decode_alive_with_its_prefill_alive_answers_the_error():
    """The same 5xx with both instances alive (the prefill watched for a while) is the
    request's own failure: not retried on the same decode; the client gets decode's
    answer, and the timeline says what the prefill's ``/health`` answered."""
    dcfg = MockConfig(role="decode", fail_first=1)
    async with (
        rig("push", decodes=[dcfg], health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        r = await c.post(t.url + "/v1/completions", json=body(max_tokens=3), timeout=10)
        assert r.status_code == 500
        assert r.json()["error"]["message"].startswith("mock failure")
        tl = t.router.recent()[0]
        assert tl["migrations"] == []
        assert len(t.d.state.requests) == 1
        assert any("prefill prefill-0 healthy: True" in n for n in tl["notes"]), tl["notes"]
        assert t.router.instances.upstream("prefill-0").healthy


async def test_stream_continuation_passes_over_a_dead_decode():
    """Mid-stream death, and the first decode the stream moves to is dead too: it is
    passed over (down, counted against the limit) for the next one."""
    decodes = [
        MockConfig(role="decode", chunk_delay_s=0.01, error_after_chunks=2),
        MockConfig(role="decode"),
        MockConfig(role="decode", chunk_delay_s=0.01),
    ]
    async with (
        rig("push", decodes=decodes, router={"migration_limit": 2}, health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        await linked(t, None, "decode1-0")
        t.router.instances.policy.turns = itertools.repeat(0)  # the first candidate
        events = await read_stream(
            c, t.url + "/v1/completions", body(prompt="a", stream=True, max_tokens=5)
        )
        assert tokens_of(events) == [f" t{k}" for k in range(1, 6)]
        tl = t.router.recent()[0]
        assert [m["from"] for m in tl["migrations"]] == ["decode-0", "decode1-0"]
        assert tl["migrations"][-1]["to"] == "decode2-0"


async def test_migration_limit_zero_relays_the_engine_dead_answer():
    async with (
        rig("push", decodes=two(), router={"migration_limit": 0}, health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        await linked(t, None, "decode-0")
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "InternalServerError"
        assert t.router.recent()[0]["migrations"] == []


async def test_link_is_quiet_when_nobody_listens_and_when_told_moments_ago(supervisor):
    link = SupervisorLink(str(supervisor.path))
    assert link.suspect("decode-0", "x")
    assert not link.suspect("decode-0", "again")  # within QUIET_S
    assert link.suspect("decode-1", "y")
    await link.close()
    assert {x["name"] for x in supervisor.lines} == {"decode-0", "decode-1"}
    assert link.sent == 2
    gone = SupervisorLink(os.path.join(os.path.dirname(supervisor.path), "nobody.sock"))
    assert gone.suspect("decode-0", "x")
    await gone.close()
    assert (gone.sent, gone.failures) == (0, 1)
    assert not SupervisorLink(None).suspect("decode-0", "x")


@pytest.mark.parametrize("stream", [False, True])
async def test_only_decode_alive_is_disaggregated_again_through_another_prefill(stream):
    """2P1D: the only decode answers a 5xx on the request's P/D attempt and is alive, its
    prefill dead: the request runs again through the other prefill (P/D, a fresh
    registration), not decode-only, and completes."""
    prefills = [
        MockConfig(role="prefill", engine_id="prefill-0", side_channel_port=5600),
        MockConfig(role="prefill", engine_id="prefill1-0", side_channel_port=5601),
    ]
    dcfg = MockConfig(role="decode", fail_first=1)
    async with (
        rig("push", prefills=prefills, decodes=[dcfg], health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        await linked(t, None)
        for m in t.mocks.values():  # each answers; the one asked after the failure: dead
            if m.config.role == "prefill":
                m.config.healthy = False
        b = body(max_tokens=3, stream=stream)
        r = await c.post(t.url + "/v1/completions", json=b, timeout=10)
        assert r.status_code == 200, r.text
        tl = t.router.recent()[0]
        (m,) = tl["migrations"]
        first = m["from"], m["to"]
        assert first == ("decode-0", "decode-0")
        again = m["through_prefill"]
        served = {n: len(s.state.requests) for n, s in t.mocks.items() if "prefill" in n}
        assert sorted(served.values()) == [1, 1], served  # one leg on each prefill
        assert tl["prefill"] == again
        last = t.d.state.requests[-1]
        assert "kv_transfer_params" in last["body"]  # P/D again, not decode-only
        assert last["request_id"].endswith("-kv1")
        assert any(f"through prefill {again}" in n for n in tl["notes"]), tl["notes"]
        assert all(u.outstanding == 0 for u in t.router.upstreams)
