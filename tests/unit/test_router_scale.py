"""What keeps the router's cost per request flat as requests in flight grow: upstream
connections kept for as many legs as run at once, and a collector that does not traverse
the router's whole heap for every few hundred requests. (benchmarks/router_scale.py
measures the effect; these check the mechanisms.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.mock import MockConfig, MockServer

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


def test_settle_heap_freezes_startup_objects_and_raises_thresholds():
    code = (
        "import gc, json\n"
        "from pdctl.sdk.router.server import GC_THRESHOLD, settle_heap\n"
        "before = gc.get_freeze_count()\n"
        "settle_heap()\n"
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold(),"
        " list(GC_THRESHOLD), gc.isenabled()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    before, frozen, threshold, wanted, enabled = json.loads(out)
    assert before == 0
    assert frozen > 1000  # the modules and what they built
    assert threshold == wanted
    assert threshold[0] > 700  # above CPython's default
    assert enabled  # cycles from error paths are still collected
