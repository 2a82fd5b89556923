"""Screenshots of the real UI on the real CPU demo fleet (docs/screenshots/demo/).

Starts the demo fleet (one prefill, one decode, the router), streams traffic through the
router, kills decode's API server once so the supervisor restarts it (the timeline then
holds a real incident), and exports SVGs of the UI driven headless at one size: the fleet
view, latency (each pair's bottleneck), requests, one request's drill-down, preflight and
the timeline. Takes a few minutes; run it where an e2e run may (it starts a fleet):

    python scripts/screenshots_demo.py [--out docs/screenshots/demo] [--size 120x32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path

from pdctl.sdk.bench.loadgen import stream_one
from pdctl.sdk.bench.stats import RequestResult
from pdctl.sdk.fleet import AsyncFleet, read_state
from pdctl.tui.app import PdctlApp
from pdctl.tui.source import LiveSource

WORDS = ("the", "prefill", "engine", "builds", "the", "cache", "and", "pushes", "it", "to",
         "decode", "over", "NIXL")  # fmt: skip
SHOTS = (  # name, keys pressed (after the previous shot)
    ("fleet", ()),
    ("latency", ("4",)),
    ("requests", ("5",)),
    ("flight", ("enter",)),
    ("preflight", ("escape", "6")),
    ("events", ("8",)),
)


async def traffic(url: str, model: str, stop: asyncio.Event, rate: float) -> None:
    import httpx

    rng = random.Random(0)
    async with httpx.AsyncClient() as client:
        tasks: set[asyncio.Task[list[int]]] = set()
        n = 0
        while not stop.is_set():
            n += 1
            body = {
                "model": model,
                "prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))),
                "max_tokens": 16,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            res = RequestResult(index=n, prompt_tokens=0, sent_at=0.0)
            t = asyncio.create_task(stream_one(client, url, body, res, 60))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / rate)
        if tasks:
            await asyncio.wait(tasks, timeout=60)


def kill_api_server(fleet: AsyncFleet, name: str) -> None:
    rec = read_state(fleet.dir)
    assert rec is not None
    pg = rec.instance(name).shepherd_pid
    assert pg
    kids = Path(f"/proc/{pg}/task/{pg}/children").read_text().split()
    os.kill(int(kids[0]), signal.SIGKILL)


async def main(out: Path, size: tuple[int, int], warm_s: float) -> int:
    async with AsyncFleet.demo() as fleet:
        events = fleet.events()
        stop = asyncio.Event()
        model = fleet.spec.model.effective_served_name
        load = asyncio.create_task(traffic(fleet.router_url, model, stop, rate=2.0))
        await asyncio.sleep(warm_s)
        kill_api_server(fleet, "decode-0")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ev = await asyncio.wait_for(anext(events), deadline - time.monotonic())
            if ev.kind == "restarted" and ev.instance == "decode-0":
                break
        await asyncio.sleep(warm_s)
        source = LiveSource(fleet.spec, fleet.plan, fleet_name=fleet.spec.fleet.name)
        app = PdctlApp(source)
        async with app.run_test(size=size) as pilot:
            await pilot.pause(5.0)  # a few rounds: windows and rates need two scrapes
            for name, keys in SHOTS:
                for k in keys:
                    await pilot.press(k)
                    await pilot.pause(0.5)
                if name == "preflight":
                    await pilot.pause(10.0)  # the report runs on a worker
                await pilot.pause(2.0)
                svg = app.export_screenshot(title=f"pdctl — {name} (CPU demo fleet)")
                (out / f"{name}.svg").write_text(svg)
                print(f"wrote {out / name}.svg", flush=True)
            await pilot.press("q")
        stop.set()
        await load
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("docs/screenshots/demo"))
    p.add_argument("--size", default="120x32", help="WxH (default 120x32)")
    p.add_argument("--warm", type=float, default=15.0, help="seconds of traffic per phase")
    a = p.parse_args()
    w, h = (int(x) for x in a.size.split("x"))
    a.out.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main(a.out, (w, h), a.warm)))
