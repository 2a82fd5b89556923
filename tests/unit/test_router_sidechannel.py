"""The router's second word on a prefill's engine: its NIXL side channel, on real loopback
sockets. A refusal counts only from an address seen accepting; no answer never counts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket

import httpx

from pdctl.sdk.pd import PrefillIdentity
from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.sidechannel import SideChannels, connect
from tests.unit.test_router import body, rig


async def listener() -> tuple[asyncio.Server, int]:
    async def on_client(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


def prefill_at(port: int) -> Upstream:
    ident = PrefillIdentity("e", "127.0.0.1", port, 1, 1)
    return Upstream("prefill-0", "prefill", "http://127.0.0.1:1", Pool("http://127.0.0.1:1"), ident)


async def closed_port() -> int:
    server, port = await listener()
    server.close()
    await server.wait_closed()
    return port


async def test_connect_tells_accepts_refuses_and_silent():
    server, port = await listener()
    try:
        assert await connect(("127.0.0.1", port)) == "accepts"
    finally:
        server.close()
        await server.wait_closed()
    assert await connect(("127.0.0.1", port)) == "refuses"
    # a listener whose accept queue is full (it never accepts) drops new SYNs: no answer
    full = socket.socket()
    held = []
    try:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect(full.getsockname())
            held.append(c)
        await asyncio.sleep(0.1)
        assert await connect(full.getsockname(), timeout_s=0.3) == "silent"
    finally:
        for c in held:
            c.close()
        full.close()


async def test_a_refusal_counts_only_from_an_address_seen_accepting():
    sides = SideChannels(retry_s=0.0)
    never = prefill_at(await closed_port())
    assert not await sides.gone(never)
    assert not await sides.gone(never)  # tried again (retry_s 0): still never seen
    server, port = await listener()
    u = prefill_at(port)
    assert not await sides.gone(u)  # seen accepting now
    assert ("127.0.0.1", port) in sides.seen
    server.close()
    await server.wait_closed()
    assert await sides.gone(u)
    assert sides.refuses(u)
    again = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
    try:
        assert not await sides.gone(u)  # a restarted engine listens again
        assert not sides.refuses(u)
    finally:
        again.close()
        await again.wait_closed()


async def test_an_unseen_address_is_not_tried_again_within_retry_s():
    sides = SideChannels(retry_s=3600.0)
    u = prefill_at(await closed_port())
    assert not await sides.gone(u)
    server = await asyncio.start_server(
        lambda r, w: w.close(), "127.0.0.1", u.identity.port if u.identity else 0
    )
    try:
        assert not await sides.gone(u)
        assert sides.seen == set()  # not asked again: an unreachable fleet costs one try
    finally:
        server.close()
        await server.wait_closed()


def test_a_decode_or_an_unidentified_prefill_has_no_side_channel():
    d = Upstream("decode-0", "decode", "http://x", Pool("http://127.0.0.1:1"))
    assert SideChannels.address(d) is None
    p = prefill_at(5600)
    assert SideChannels.address(dataclasses.replace(p, identity=None)) is None


async def test_only_decode_is_retried_when_its_prefill_side_channel_refuses_under_health_200():
    """1P1D: the decode answers a 5xx and is alive; the prefill's API server still says
    200 but its side channel, seen accepting, refuses (its engine is gone): the prefill
    is down and the request runs again on the decode, decode-only, and completes."""
    server, port = await listener()
    pcfg = MockConfig(role="prefill", engine_id="prefill-0", side_channel_port=port)
    dcfg = MockConfig(role="decode", fail_first=1)
    async with (
        rig("push", prefill=pcfg, decodes=[dcfg], health_interval_s=60) as t,
        httpx.AsyncClient() as c,
    ):
        insts = t.router.instances
        p = insts.upstream("prefill-0")
        assert p.identity is not None
        p.identity = dataclasses.replace(p.identity, port=port)
        await insts.check(p)
        assert ("127.0.0.1", port) in insts.side_channels.seen
        assert p.healthy
        server.close()
        await server.wait_closed()
        r = await c.post(t.url + "/v1/completions", json=body(max_tokens=3), timeout=10)
        assert r.status_code == 200, r.text
        tl = t.router.recent()[0]
        assert [(m["from"], m["to"]) for m in tl["migrations"]] == [("decode-0", "decode-0")]
        said = "prefill prefill-0 healthy: False (its NIXL side channel refuses connections)"
        assert any(said in n for n in tl["notes"]), tl["notes"]
        assert not p.healthy
        assert insts.upstream("decode-0").healthy
        assert t.p.state.health_checks
        assert t.p.config.healthy
