"""Router CPU per request: ``cache_aware`` vs ``least_loaded``, on mocks, in one run.

Two mock prefills and one mock decode (answering at once; the mocks' ``/tokenize`` gives
one token per character), two pdctl routers in push mode over them — one per policy,
``cache_aware`` without KV events (its index from routing history: the lookup, hashing
and ``/tokenize`` work are the same as with events) — both pinned to core 0. A
shared-prefix workload (``--groups`` prefixes of ``--prefix-chars`` characters, unique
suffixes) is sent through each router in turn, ``--repeats`` times, at concurrency 1
and 16, as text (cache_aware asks ``/tokenize``) and as token ids (as on the tokens
path: no ``/tokenize``). Reported: router CPU ms per request (from /proc) and the ratio
cache_aware / least_loaded, plus the share of requests cache_aware kept on their
group's prefill.

    python benchmarks/router_cache_cpu.py [--requests 400] [--repeats 3] [--out FILE]
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

from _bench import free_port
from router_overhead import cpu_s

from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.mock import MockConfig, MockServer


def router_argv(prefills: list[str], decode: str, port: int, policy: str, tmp: Path) -> list[str]:
    from pdctl.sdk.spec import FleetSpec

    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu", "kv_events": False},
        prefill=[
            {"name": f"p{i}", "http_port": int(u.rsplit(":", 1)[1]), "devices": [i]}
            for i, u in enumerate(prefills)
        ],
        decode=[{"http_port": int(decode.rsplit(":", 1)[1]), "devices": [7]}],
        # every prompt disaggregated: both routers run the same legs, so the difference
        # is the cache-aware choice itself (the default threshold would send follow-ups
        # to decode alone, a cheaper route, flattering cache_aware)
        router={"port": port, "policy": policy, "disaggregate_min_uncached_tokens": 0},
    )
    f = tmp / f"spec-{port}.json"
    f.write_text(spec.model_dump_json())
    return [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]


def prompts(n: int, groups: int, prefix_chars: int, seed: int) -> list[str]:
    out = []
    for i in range(n):
        g = (i * 7 + seed) % groups
        prefix = f"group {g} " + "".join(chr(97 + (g * 3 + k) % 26) for k in range(prefix_chars))
        out.append(f"{prefix} question {seed}-{i}")
    return out


async def load(url: str, texts: list[str], conc: int, ids: bool = False) -> float:
    pool = Pool(url, max_idle=conc + 4)
    hdrs = [("Content-Type", "application/json")]
    todo = list(texts)

    async def worker() -> None:
        while todo:
            text = todo.pop()
            prompt: str | list[int] = [ord(c) for c in text] if ids else text
            body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 8}).encode()
            r = await pool.request("POST", "/v1/completions", body, hdrs)
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    pool.close()
    return time.perf_counter() - t0


async def wait_up(url: str) -> None:
    for _ in range(150):
        try:
            await load(url, ["warm"], 1)
            return
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never answered")


def start_routers(
    prefills: list[str], decode: str, tmp: Path
) -> dict[str, tuple[str, subprocess.Popen[bytes]]]:
    """One router per policy, pinned to core 0: policy -> (URL, process)."""
    procs = {}
    for policy in ("least_loaded", "cache_aware"):
        port = free_port()
        argv = ["taskset", "-c", "0", *router_argv(prefills, decode, port, policy, tmp)]
        procs[policy] = (
            f"http://127.0.0.1:{port}",
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        )
    return procs


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {1})
    ps = [await MockServer(MockConfig(role="prefill", engine_id=f"p{i}-0")).start() for i in (0, 1)]
    dm = await MockServer(MockConfig(role="decode")).start()
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-"))
    procs = start_routers([p.url for p in ps], dm.url, tmp)
    try:
        for url, _ in procs.values():
            await wait_up(url)
            await load(url, prompts(100, args.groups, args.prefix_chars, 999), 4)  # warm-up
        results: dict[str, Any] = {}
        for conc, ids in ((1, False), (16, False), (1, True), (16, True)):
            per: dict[str, list[float]] = {p: [] for p in procs}
            for rep in range(args.repeats):
                texts = prompts(args.requests, args.groups, args.prefix_chars, rep + conc * 100)
                for policy, (url, proc) in procs.items():
                    c0 = cpu_s(proc.pid)
                    await load(url, texts, conc, ids)
                    per[policy].append((cpu_s(proc.pid) - c0) * 1000 / len(texts))
            med = {p: statistics.median(v) for p, v in per.items()}
            results[f"c{conc}{'-token-ids' if ids else '-text'}"] = {
                "cpu_ms_per_req": med,
                "ratio_cache_aware_vs_least_loaded": med["cache_aware"] / med["least_loaded"],
                "repeats": per,
            }
            print(
                f"{'token ids' if ids else 'text     '} concurrency {conc:>2}: "
                f"router CPU per request least_loaded "
                f"{med['least_loaded']:.3f} ms, cache_aware {med['cache_aware']:.3f} ms, "
                f"ratio {med['cache_aware'] / med['least_loaded']:.2f}"
            )
        return {
            "benchmark": "router_cache_cpu",
            "groups": args.groups,
            "prefix_chars": args.prefix_chars,
            "requests": args.requests,
            "results": results,
        }
    finally:
        for _, proc in procs.values():
            proc.terminate()
            proc.wait(10)
        for m in [*ps, dm]:
            await m.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prefix-chars", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path("router_cache_cpu.json"))
    args = ap.parse_args()
    rec = asyncio.run(run(args))
    args.out.write_text(json.dumps(rec, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
