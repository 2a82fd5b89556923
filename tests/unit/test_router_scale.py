"""What keeps the router's cost per request flat as requests in flight grow: upstream
connections kept for as many legs as run at once, and a collector that does not traverse
the router's whole heap for every few hundred requests. (benchmarks/router_scale.py
measures the effect; these check the mechanisms.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.sdk.router.server import GC_LONGEST_S, GC_SHARE, collect_on_clock, gc_wait

WAVE = 200
"""More legs at once than the old idle cap (64) kept connections for."""


async def _wave(pool: Pool) -> None:
    async def one() -> None:
        r = await pool.request("POST", "/v1/completions", b'{"prompt": "x"}')
        assert r.status == 200
        await r.read()

    await asyncio.gather(*(one() for _ in range(WAVE)))


async def test_pool_keeps_a_connection_per_concurrent_leg():
    mock = await MockServer(MockConfig(role="decode", delay_s=0.05, record=False)).start()
    pool = Pool(mock.url)
    try:
        await _wave(pool)
        assert mock.state.connections == WAVE
        await _wave(pool)  # the same concurrency again: every connection is reused
        assert mock.state.connections == WAVE
        assert mock.state.completed == 2 * WAVE
    finally:
        pool.close()
        await mock.stop()


async def test_pool_idle_cap_still_bounds_what_it_keeps():
    mock = await MockServer(MockConfig(role="decode", delay_s=0.05, record=False)).start()
    pool = Pool(mock.url, max_idle=8)
    try:
        await _wave(pool)
        await asyncio.sleep(0.05)  # the closed ones reach the server
        assert len(mock.conns) == 8
    finally:
        pool.close()
        await mock.stop()


def test_settle_heap_freezes_startup_objects_and_hands_the_collector_to_the_clock():
    code = (
        "import gc, json\n"
        "from pdctl.sdk.router.server import settle_heap\n"
        "before = gc.get_freeze_count()\n"
        "settle_heap()\n"
        "print(json.dumps([before, gc.get_freeze_count(), gc.isenabled()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    before, frozen, enabled = json.loads(out)
    assert before == 0
    assert frozen > 1000  # the modules and what they built
    assert not enabled  # no allocation-driven collections: collect_on_clock runs them


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


async def test_the_clock_frees_cycles_while_allocations_alone_would_not():
    """With the allocation-driven collector off, a cycle left behind (an error path's) is
    freed by the clock's next young collection, and by nothing else."""
    import gc
    import weakref

    enabled = gc.isenabled()
    gc.disable()
    clock = asyncio.create_task(collect_on_clock(0.05))
    try:
        left = _Cyclic()
        gone = weakref.ref(left)
        del left
        kept: list[list[int]] = [[] for _ in range(5000)]  # past CPython's young threshold
        assert gone() is not None
        assert len(kept) == 5000
        for _ in range(100):
            await asyncio.sleep(0.02)
            if gone() is None:
                break
        assert gone() is None
    finally:
        clock.cancel()
        if enabled:
            gc.enable()


def test_a_costly_collection_stretches_the_clock_to_keep_the_collectors_share():
    """A cheap collection keeps the clock's period; one that took longer than its share
    of the period waits that much longer before the next, up to GC_LONGEST_S."""
    assert gc_wait(0.001, 1.0) == 1.0
    assert gc_wait(0.0, 0.05) == 0.05
    assert gc_wait(0.06, 1.0) == pytest.approx(0.06 / GC_SHARE)
    assert gc_wait(0.06, 1.0) > 1.0
    assert gc_wait(60.0, 1.0) == GC_LONGEST_S


class _Wire:
    """A transport that records what is written to it, one entry per write call."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _answer(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    whole = [*HEAD, (b"content-length", b"12")] if scope["path"] == "/whole" else HEAD
    await send({"type": "http.response.start", "status": 200, "headers": whole})
    if scope["path"] == "/stream":
        await asyncio.sleep(0.05)  # the first event is not ready yet
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.body", "body": b'{"ok": true}', "more_body": False})


HEAD = [(b"content-type", b"application/json")]


def _protocol(wire: _Wire) -> Any:
    import uvicorn
    from uvicorn.server import ServerState

    from pdctl.sdk.router.hardening import Limits
    from pdctl.sdk.router.httpproto import hardened_protocol

    config = uvicorn.Config(_answer, lifespan="off", access_log=False, log_level="warning")
    config.load()
    make: Any = hardened_protocol(Limits())
    proto = make(config=config, server_state=ServerState(), app_state={})
    proto.connection_made(wire)
    return proto


async def _ask(proto: Any, path: str) -> None:
    """One request on ``proto``'s connection, and a few turns of the loop for its app."""
    proto.data_received(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    for _ in range(10):
        await asyncio.sleep(0)


async def test_an_answer_sent_whole_leaves_in_one_write_head_and_body():
    wire = _Wire()
    proto = _protocol(wire)
    await _ask(proto, "/whole")
    assert len(wire.writes) == 1
    (out,) = wire.writes
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert out.endswith(b'\r\n\r\n{"ok": true}')
    await _ask(proto, "/whole")  # the next request on the connection: the same
    assert len(wire.writes) == 2
    assert wire.writes[1].endswith(b'{"ok": true}')
    proto.connection_lost(None)


async def test_a_streams_head_is_not_held_for_its_first_event():
    wire = _Wire()
    proto = _protocol(wire)
    await _ask(proto, "/stream")
    assert len(wire.writes) == 1  # the head alone, before any event
    assert wire.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert wire.writes[0].endswith(b"\r\n\r\n")
    await asyncio.sleep(0.2)
    assert wire.writes[1:] == [b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]
    proto.connection_lost(None)


async def test_the_server_tells_the_app_once_when_a_client_leaves_mid_answer():
    from pdctl.sdk.router.hardening import GONE

    calls: list[str] = []
    wire = _Wire()
    proto = _protocol(wire)
    proto.data_received(b"GET /whole HTTP/1.1\r\nhost: x\r\n\r\n")
    proto.cycle.scope["extensions"][GONE].callback = lambda: calls.append("whole")
    for _ in range(10):
        await asyncio.sleep(0)
    proto.data_received(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    proto.cycle.scope["extensions"][GONE].callback = lambda: calls.append("stream")
    await asyncio.sleep(0)
    proto.connection_lost(None)  # mid-stream
    proto.connection_lost(None)
    assert calls == ["stream"]  # not the answered one, and only once
