"""The upstream-slot lease gives its slot back exactly once, whatever way its holder
ends: normally, by an exception, cancelled, handed over, or as a stream the client
abandoned (or never read)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, cast

import httpx
import pytest

from pdctl.sdk.router.httpclient import Pool, Response
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.lease import Lease
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.replies import StreamReply
from tests.streams import adata
from tests.unit.test_router import body, event_loop_policy, rig

__all__ = ["event_loop_policy"]  # the uvloop policy fixture, shared


class CountingResponse:
    """Stands in for a response: counts how often it is let go."""

    status = 200

    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1

    async def read(self) -> bytes:
        return b"{}"


def upstream() -> Upstream:
    return Upstream("decode-0", "decode", "http://127.0.0.1:1", Pool("http://127.0.0.1:1"))


def leased(u: Upstream) -> tuple[Lease, CountingResponse]:
    resp = CountingResponse()
    return Lease(u, cast(Response, resp)), resp


async def test_leaving_the_block_gives_the_slot_back_once():
    u = upstream()
    lease, resp = leased(u)
    async with lease:
        assert (u.outstanding, lease.held) == (1, True)
    assert (u.outstanding, lease.held, resp.released) == (0, False, 1)
    lease.release()
    async with lease:
        pass
    assert (u.outstanding, resp.released) == (0, 1)


async def test_an_exception_gives_the_slot_back_once():
    u = upstream()
    lease, resp = leased(u)
    with pytest.raises(ValueError, match="boom"):
        async with lease:
            raise ValueError("boom")
    lease.release()
    assert (u.outstanding, resp.released) == (0, 1)


async def test_cancellation_gives_the_slot_back_once():
    u = upstream()
    started = asyncio.Event()
    holder: list[Lease] = []

    async def hold() -> None:
        async with Lease(u) as lease:
            holder.append(lease)
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(hold())
    await started.wait()
    assert u.outstanding == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    holder[0].release()
    assert (u.outstanding, holder[0].held) == (0, False)


async def test_hand_over_moves_the_slot_and_the_old_lease_lets_nothing_go():
    u = upstream()
    resp = CountingResponse()
    async with Lease(u) as sending:
        kept = sending.hand_over(cast(Response, resp))
    assert (u.outstanding, kept.held, sending.held, resp.released) == (1, True, False, 0)
    with pytest.raises(RuntimeError, match="already released"):
        sending.hand_over(cast(Response, resp))
    assert await kept.read() == b"{}"
    kept.release()
    assert (u.outstanding, resp.released) == (0, 1)


async def test_a_stream_never_started_still_gives_its_slot_back():
    u = upstream()
    lease, resp = leased(u)

    async def chunks() -> AsyncGenerator[bytes, None]:
        async with lease:  # never reached: the stream is closed before its first chunk
            yield b"data: x\n\n"

    reply = StreamReply(200, chunks(), [], lease.release)
    await reply.aclose()
    await reply.aclose()
    assert (u.outstanding, resp.released) == (0, 1)


async def test_a_stream_closed_early_gives_its_slot_back_once():
    u = upstream()
    lease, resp = leased(u)

    async def chunks() -> AsyncGenerator[bytes, None]:
        async with lease:
            for _ in range(10):
                yield b"data: x\n\n"

    reply = StreamReply(200, chunks(), [], lease.release)
    assert await anext(reply.chunks) == b"data: x\n\n"
    await reply.aclose()
    assert (u.outstanding, resp.released) == (0, 1)


async def test_a_stream_abandoned_by_its_client_frees_every_slot():
    """Over the real router and mock engines: the client reads one event and goes."""
    dcfg = MockConfig(role="decode", chunks=50, chunk_delay_s=0.02)
    async with rig("push", decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        payload: dict[str, Any] = body(stream=True, max_tokens=50)
        async with c.stream("POST", t.url + "/v1/completions", json=payload) as r:
            assert r.status_code == 200
            async for _ in adata(r):
                break  # one event, then the client goes
        for _ in range(100):  # a poll: the router learns of the disconnect asynchronously
            if t.router.recent() and t.d.state.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert t.router.recent()[0]["outcome"] == "cancelled"
        assert [u.outstanding for u in t.router.upstreams] == [0] * len(t.router.upstreams)
        assert t.d.state.in_flight == 0
