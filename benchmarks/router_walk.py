"""Walk one push request through the router and count its hand-offs between files.

One router (push mode, the text path, the default policy) in front of an in-process mock
prefill and decode (:mod:`pdctl.sdk.router.mock`); after a warm-up request, one more is
sent through the router's ASGI app with a profiler on. Every call from a function in one
pdctl file into a function in another is a *hand-off* (calls made by the event loop —
a coroutine resumed, a protocol callback — are not: nobody in pdctl handed anything
over); a file's *visits* are the hand-offs into it. With ``--routing`` only the files
that hold routing objects count (leaf modules — the HTTP client, the timeline record and
metrics, tracing, request bodies, replies, the leases, the instance record, the
hardening limits and JSON depth check — are left out).

    python benchmarks/router_walk.py [--routing] [--stream] [--json]

Run it on another source tree with that tree's sources first on ``PYTHONPATH`` to compare
(``benchmarks/router_ab.py`` does so for speed).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

import pdctl.sdk
from pdctl.sdk.lint import lint
from pdctl.sdk.router import Router, RouterApp
from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.sdk.spec import FleetSpec

SDK = Path(pdctl.sdk.__file__).resolve().parent
LEAVES = {
    "router/httpclient.py",
    "router/timeline.py",
    "router/tracing.py",
    "router/promreg.py",
    "router/replies.py",
    "router/migrate.py",
    "router/lease.py",
    "router/instances.py",
    "router/hardening.py",
    "pd.py",
}
"""Leaf modules: data, bookkeeping and I/O helpers every routing object uses."""
RESUMABLE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_GENERATOR


def rel(code: types.CodeType) -> str | None:
    try:
        p = Path(code.co_filename).resolve().relative_to(SDK)
    except ValueError:
        return None
    s = str(p)
    return None if s == "router/mock.py" else s


async def walk(stream: bool, routing: bool) -> dict[str, Any]:
    pm = await MockServer(MockConfig(role="prefill", engine_id="prefill-0")).start()
    dm = await MockServer(MockConfig(role="decode")).start()
    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": pm.port, "devices": [0]}],
        decode=[{"http_port": dm.port, "devices": [1]}],
        router={"port": 1},
    )
    plan = lint(spec, check_bound_ports=False).plan
    assert plan is not None
    app = RouterApp(Router(spec, plan))
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": stream}
    hops: list[tuple[str, str, str]] = []
    started: list[types.FrameType] = []  # kept alive: their ids stay theirs

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_back is None:
            return
        if frame.f_code.co_flags & RESUMABLE:
            if any(f is frame for f in started):
                return  # a coroutine or generator resumed, not called
            started.append(frame)
        callee, caller = rel(frame.f_code), rel(frame.f_back.f_code)
        if callee is None or caller is None or callee == caller:
            return
        if routing and (callee in LEAVES or caller in LEAVES):
            return
        hops.append((caller, callee, frame.f_code.co_qualname))

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
        for measured in (False, True):
            if measured:
                sys.setprofile(profile)
            try:
                r = await c.post("/v1/completions", json=body)
                r.raise_for_status()
            finally:
                sys.setprofile(None)
    await app.router.stop()
    await pm.stop()
    await dm.stop()
    visits = Counter(callee for _, callee, _ in hops)
    return {
        "stream": stream,
        "routing_only": routing,
        "hand_offs": len(hops),
        "files": len({f for hop in hops for f in hop[:2]}),
        "files_visited_more_than_once": {f: n for f, n in visits.items() if n > 1},
        "walk": [f"{a} -> {b} {q}" for a, b, q in hops],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routing", action="store_true", help="count routing files only")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rec = asyncio.run(walk(args.stream, args.routing))
    if args.json:
        print(json.dumps(rec, indent=1))
        return 0
    for step in rec["walk"]:
        print(step)
    print(
        f"{rec['hand_offs']} hand-offs between {rec['files']} files; visited more than once: "
        f"{rec['files_visited_more_than_once'] or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
