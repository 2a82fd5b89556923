"""Tenant rate limits: a tenant over its limit is refused at once, the others do not notice.

One pdctl router (a subprocess, pinned to core 0) over a mock prefill and a streaming mock
decode, with two inference keys: tenant ``web`` (no limit) and tenant ``batch``
(``tokens_per_s`` far below what it asks for). Each round measures, in the same run:

* baseline: ``web`` alone, ``--conc`` streams in flight: time to first token (TTFT);
* contended: the same ``web`` load while ``batch`` sends ``--flood-rps``
  requests a second (open loop): ``web``'s TTFT, and how long ``batch``'s 429s take (client round
  trip, and the router's own time from its ``pdctl_router_tenant_rejection_seconds``).
  The flood runs in its own process on the client's core, so the web client and the mocks
  share that core with it: the ratio includes that CPU contention.
* control: the same flood, same rate, same key, same process placement, sent as
  ``GET /v1/completions``: the router checks the key as for the 429s and answers 405
  before the rate limiter is asked (no audit line, no admission). ``web``'s TTFT under it
  is what any refused flood costs on this machine (the router's and the client core's
  CPU); the 429 flood's TTFT over it is the rate limiter's own part (its admitted
  ``batch`` requests included).

Prints the contended/baseline and contended/control TTFT ratios (medians of the rounds'
ratios) and the 429 latency percentiles, and writes a JSON record.

    python benchmarks/tenant_limits.py [--rounds 5] [--requests 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _bench import free_port, pair_spec

from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.sdk.spec import FleetSpec

KEYS = {"BENCH_WEB_KEY": "web-bench-key-0001", "BENCH_BATCH_KEY": "batch-bench-key-0002"}

BODY = {"model": "tiny", "prompt": "hello there, how are prefill and decode", "max_tokens": 8}


def router_spec(p: int, d: int, port: int) -> FleetSpec:
    return pair_spec(
        p,
        d,
        port,
        {
            "keys": [
                {"name": "web", "tenant": "web", "env": "BENCH_WEB_KEY"},
                {"name": "batch", "tenant": "batch", "env": "BENCH_BATCH_KEY"},
            ],
            "tenants": {"batch": {"tokens_per_s": 50, "burst_s": 1.0}},
            "audit": {"path": "-"},
        },
    )


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def ttfts(c: httpx.AsyncClient, url: str, key: str, n: int, conc: int) -> list[float]:
    out: list[float] = []
    left = n
    hdrs = {"Authorization": f"Bearer {key}"}

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            async with c.stream(
                "POST", url + "/v1/completions", json={**BODY, "stream": True}, headers=hdrs
            ) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"web answered {r.status_code}")
                first = None
                async for chunk in r.aiter_bytes():
                    if chunk and first is None:
                        first = time.perf_counter() - t
                out.append(first if first is not None else float("nan"))

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out


async def flood(
    c: httpx.AsyncClient, url: str, key: str, stop: asyncio.Event, rps: float, method: str
) -> dict[str, Any]:
    """``batch`` at ``rps`` requests a second (open loop: one sent every 1/rps s, whatever
    the answers do), far beyond its tokens/s limit."""
    refusals: list[float] = []
    retry_after: set[str] = set()
    admitted = 0
    hdrs = {"Authorization": f"Bearer {key}"}

    async def one() -> None:
        nonlocal admitted
        t = time.perf_counter()
        r = await c.request(
            method, url + "/v1/completions", json={**BODY, "max_tokens": 64}, headers=hdrs
        )
        dt = time.perf_counter() - t
        if r.status_code == 405 and method == "GET":
            refusals.append(dt)
        elif r.status_code == 429:
            refusals.append(dt)
            retry_after.add(r.headers.get("retry-after", "?"))
            if r.headers.get("pdctl-drop-reason") != "tenant_limit":
                raise RuntimeError("429 without pdctl-drop-reason: tenant_limit")
        elif r.status_code == 200:
            admitted += 1
        else:
            raise RuntimeError(f"batch answered {r.status_code}")

    sent: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    while not stop.is_set():
        sent.append(asyncio.create_task(one()))
        nxt = start + len(sent) / rps
        await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
    await asyncio.gather(*sent)
    return {"refusals": refusals, "admitted": admitted, "retry_after": sorted(retry_after)}


async def flood_main(url: str, rps: float, seconds: float, method: str) -> None:
    """The flood as its own process (so its client CPU is not the web client's)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c:
        f = await flood(c, url, KEYS["BENCH_BATCH_KEY"], stop, rps, method)
    print(json.dumps(f), flush=True)


async def flooded(
    c: httpx.AsyncClient, url: str, web: str, args: argparse.Namespace, method: str
) -> tuple[list[float], dict[str, Any]]:
    """``web``'s TTFTs while a flood process sends ``batch``'s ``args.flood_rps``
    requests/s as ``method``; and the flood's own record."""
    flooder = await asyncio.create_subprocess_exec(
        "taskset",
        "-c",
        "1",
        sys.executable,
        __file__,
        "--flood-only",
        url,
        "--flood-rps",
        str(args.flood_rps),
        "--flood-s",
        str(args.flood_s),
        "--flood-method",
        method,
        stdout=asyncio.subprocess.PIPE,
    )
    await asyncio.sleep(0.5)
    ttft = await ttfts(c, url, web, args.requests, args.conc)
    out, _ = await flooder.communicate()
    return ttft, json.loads(out.decode().strip().splitlines()[-1])


async def router_refusal_s(c: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(sum, count) of the router's own 429 times for tenant batch, from /metrics."""
    got = {"sum": 0.0, "count": 0.0}
    for line in (await c.get(url + "/metrics")).text.splitlines():
        for k in got:
            if line.startswith(f'pdctl_router_tenant_rejection_seconds_{k}{{tenant="batch"}}'):
                got[k] = float(line.rsplit(" ", 1)[1])
    return got["sum"], got["count"]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {1})
    pm = await MockServer(MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.02)).start()
    dm = await MockServer(MockConfig(role="decode", chunk_delay_s=0.005, chunks=4)).start()
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-"))
    port = free_port()
    spec_file = tmp / "spec.json"
    spec_file.write_text(router_spec(pm.port, dm.port, port).model_dump_json())
    argv = ["taskset", "-c", "0", sys.executable, "-m", "pdctl.sdk.router.server"]
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before any timing
        [*argv, "--spec-json", str(spec_file)],
        env={**os.environ, **KEYS},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    web = KEYS["BENCH_WEB_KEY"]
    limits = httpx.Limits(max_connections=args.conc + 64)
    rounds: list[dict[str, Any]] = []
    try:
        async with httpx.AsyncClient(timeout=30, limits=limits) as c:
            for _ in range(300):
                try:
                    if (await c.get(url + "/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            await ttfts(c, url, web, 50, args.conc)  # warm-up
            for _ in range(args.rounds):
                base = await ttfts(c, url, web, args.requests, args.conc)
                s0, n0 = await router_refusal_s(c, url)
                control, _ = await flooded(c, url, web, args, "GET")
                loaded, f = await flooded(c, url, web, args, "POST")
                s1, n1 = await router_refusal_s(c, url)
                if not f["refusals"] or n1 <= n0:
                    raise RuntimeError("the flood was never refused: the limit did not act")
                rounds.append(
                    {
                        "baseline_ttft_ms": statistics.median(base) * 1000,
                        "contended_ttft_ms": statistics.median(loaded) * 1000,
                        "control_ttft_ms": statistics.median(control) * 1000,
                        "ratio": statistics.median(loaded) / statistics.median(base),
                        "control_ratio": statistics.median(control) / statistics.median(base),
                        "limiter_ratio": statistics.median(loaded) / statistics.median(control),
                        "refusals": len(f["refusals"]),
                        "admitted": f["admitted"],
                        "router_refusal_mean_ms": (s1 - s0) / (n1 - n0) * 1000,
                        "refusal_rtt_p50_ms": pct(f["refusals"], 0.5) * 1000,
                        "refusal_rtt_p99_ms": pct(f["refusals"], 0.99) * 1000,
                        "retry_after": f["retry_after"],
                    }
                )
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        await pm.stop()
        await dm.stop()
    return {
        "rounds": rounds,
        "ttft_ratio_median": statistics.median(r["ratio"] for r in rounds),
        "control_ratio_median": statistics.median(r["control_ratio"] for r in rounds),
        "limiter_ratio_median": statistics.median(r["limiter_ratio"] for r in rounds),
        "admitted_median": statistics.median(r["admitted"] for r in rounds),
        "router_refusal_mean_ms_median": statistics.median(
            r["router_refusal_mean_ms"] for r in rounds
        ),
        "refusal_rtt_p50_ms_median": statistics.median(r["refusal_rtt_p50_ms"] for r in rounds),
        "refusal_rtt_p99_ms_median": statistics.median(r["refusal_rtt_p99_ms"] for r in rounds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100, help="web requests per phase")
    ap.add_argument("--conc", type=int, default=4, help="web streams in flight")
    ap.add_argument("--flood-rps", type=float, default=100, help="batch requests per second")
    ap.add_argument("--flood-s", type=float, default=3.0, help="how long each flood lasts")
    ap.add_argument("--flood-only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--flood-method", default="POST", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="tenant_limits.json")
    args = ap.parse_args()
    if args.flood_only:
        asyncio.run(flood_main(args.flood_only, args.flood_rps, args.flood_s, args.flood_method))
        return
    rec = asyncio.run(run(args))
    print(
        f"web TTFT contended/baseline: {rec['ttft_ratio_median']:.3f}, 405-flood "
        f"control/baseline: {rec['control_ratio_median']:.3f}, contended/control (the "
        f"limiter's part): {rec['limiter_ratio_median']:.3f} (medians of "
        f"{len(rec['rounds'])} rounds; batch admitted {rec['admitted_median']} a round); "
        f"batch's 429: router time mean "
        f"{rec['router_refusal_mean_ms_median']:.3f} ms, client round trip p50 "
        f"{rec['refusal_rtt_p50_ms_median']:.2f} ms, p99 {rec['refusal_rtt_p99_ms_median']:.2f} ms"
    )
    Path(args.out).write_text(json.dumps(rec, indent=2) + "\n")


if __name__ == "__main__":
    main()
