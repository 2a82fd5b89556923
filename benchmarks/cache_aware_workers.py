"""``cache_aware`` routing with one router worker against two, on a real vLLM-CPU fleet.

A 2P1D push fleet with prefix caching and KV events (the demo spec with
``prefill.0.count=2``), and two more pdctl routers over it, both ``cache_aware`` and
disaggregating every prompt (``disaggregate_min_uncached_tokens = 0``, so the prefills'
prefix caches carry the whole effect): one with ``router.workers = 1``, one with
``router.workers = 2`` (two processes on one ``SO_REUSEPORT`` socket, each following the
instances' KV events itself). The same shared-prefix workload (``--groups`` long
prefixes, unique suffixes, each arm with prefixes of its own so both start cold) is sent
through each arm in alternating rounds, ``--conc`` requests at a time.

Reported per arm: the prefills' prefix-cache hit rate over the arm's requests (deltas of
vLLM's ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` counters, one arm at a
time), the share of each group's follow-ups sent to the prefill that served the group
first (from the routers' own request timelines, merged across workers), and every
greedy output against the decode instance alone. Ratios: two workers over one.

    python benchmarks/cache_aware_workers.py [--groups 4] [--per-group 8] [--rounds 4]
        [--conc 4] [--out cache_aware_workers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _bench import free_port

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics.promtext import parse, total
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import router_url

PREFIX_WORDS, MAX_TOKENS = 260, 8


def workload(tag: str, groups: int, per_group: int) -> list[tuple[int, str]]:
    """(group, prompt) pairs, groups interleaved; a group's ~800-token prefix is its own."""
    out = []
    for n in range(per_group):
        for g in range(groups):
            words = " ".join(
                DEMO_WORDS[(g * 5 + k * 7) % len(DEMO_WORDS)] for k in range(PREFIX_WORDS)
            )
            out.append((g, f"{tag} {g}: {words} / question {n} {DEMO_WORDS[n % len(DEMO_WORDS)]}"))
    return out


def greedy(prompt: str) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


def start_router(spec: FleetSpec, tmp: Path, name: str, workers: int) -> tuple[Any, str]:
    spec = spec.model_copy(deep=True)
    assert spec.router is not None
    spec.router = spec.router.model_copy(
        update={"port": free_port(), "workers": workers, "disaggregate_min_uncached_tokens": 0}
    )
    f = tmp / f"{name}.json"
    f.write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]
    proc = subprocess.Popen(argv)
    url = router_url(spec)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            state = httpx.get(url + "/v1/pdctl/state", timeout=2).json()
            idx = state.get("kv_index", {}).get("instances", {})
            if idx and all(v.get("state") == "EXACT" for v in idx.values()):
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"router {name} never followed every instance's KV events")


async def counters(c: httpx.AsyncClient, urls: list[str]) -> tuple[float, float]:
    q = h = 0.0
    for u in urls:
        s = parse((await c.get(u + "/metrics")).text)
        q += total(s, "vllm:prefix_cache_queries_total") or 0.0
        h += total(s, "vllm:prefix_cache_hits_total") or 0.0
    return q, h


async def run_round(
    url: str, prefills: list[str], items: list[tuple[int, str]], conc: int
) -> tuple[float, float, list[str], list[str]]:
    """The arm's requests, ``conc`` at a time: the prefills' prefix-cache query and hit
    deltas, the texts and the answers' ids (vLLM's carry the router's request id)."""
    sem = asyncio.Semaphore(conc)
    texts: list[str] = [""] * len(items)
    ids: list[str] = [""] * len(items)
    async with httpx.AsyncClient(timeout=300) as c:
        q0, h0 = await counters(c, prefills)

        async def one(k: int, prompt: str) -> None:
            async with sem:
                r = await c.post(url + "/v1/completions", json=greedy(prompt))
                if r.status_code != 200:
                    raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")
                texts[k] = r.json()["choices"][0]["text"]
                ids[k] = str(r.json().get("id", ""))

        await asyncio.gather(*(one(k, p) for k, (_, p) in enumerate(items)))
        q1, h1 = await counters(c, prefills)
    return q1 - q0, h1 - h0, texts, ids


def stickiness(url: str, items: list[tuple[int, str]], ids: list[str]) -> float | None:
    """Share of each group's requests after its first that went to the prefill the
    group's first request went to (the routers' timelines, merged across workers)."""
    reqs = httpx.get(url + f"/v1/pdctl/requests?limit={len(items) * 4}", timeout=10).json()
    prefill_of = {str(r["id"]): r.get("prefill") for r in reqs["requests"]}
    first: dict[int, str] = {}
    same = n = 0
    for (g, _), answer_id in zip(items, ids, strict=True):
        p = next((v for k, v in prefill_of.items() if k in answer_id), None)
        if p is None:
            continue
        if g not in first:
            first[g] = p
            continue
        n += 1
        same += p == first[g]
    return same / n if n else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--conc", type=int, default=4)
    ap.add_argument("--out", default="cache_aware_workers.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-bench-"))
    tmp = Path(os.environ["PDCTL_STATE_DIR"])
    overrides = [
        "fleet.name=bench-ca-workers",
        f"router.port={free_port()}",
        "prefill.0.count=2",
        "fleet.enable_prefix_caching=true",
        "router.policy=cache_aware",
    ]
    spec = load_demo_spec(tiny_model_dir(), overrides).spec
    arms = {"1 worker": 1, "2 workers": 2}
    work = {a: workload(f"w{n}", args.groups, args.per_group) for a, n in arms.items()}
    size = len(next(iter(work.values()))) // args.rounds
    res: dict[str, dict[str, Any]] = {a: {"q": 0.0, "h": 0.0, "texts": [], "ids": []} for a in arms}
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        plan = fleet.fleet.plan
        prefills = [i.url for i in plan.instances if i.role == "prefill"]
        (decode,) = [i.url for i in plan.instances if i.role == "decode"]
        procs = {a: start_router(spec, tmp, a.replace(" ", "-"), n) for a, n in arms.items()}
        try:
            for a, (_, url) in procs.items():  # warm every router and instance
                asyncio.run(run_round(url, prefills, workload(f"warm{a[0]}", 2, 2), args.conc))
            for k in range(args.rounds):
                for a, (_, url) in procs.items():
                    part = work[a][k * size : (k + 1) * size]
                    q, h, texts, ids = asyncio.run(run_round(url, prefills, part, args.conc))
                    res[a]["q"] += q
                    res[a]["h"] += h
                    res[a]["texts"] += texts
                    res[a]["ids"] += ids
                print(f"round {k + 1}/{args.rounds} done", flush=True)
            for a, (_, url) in procs.items():
                res[a]["stickiness"] = stickiness(url, work[a][: size * args.rounds], res[a]["ids"])
            with httpx.Client(timeout=300) as c:
                for a in arms:
                    alone = []
                    for _, p in work[a][: size * args.rounds]:
                        r = c.post(decode + "/v1/completions", json=greedy(p))
                        alone.append(r.json()["choices"][0]["text"])
                    res[a]["identical"] = sum(
                        x == y for x, y in zip(res[a]["texts"], alone, strict=True)
                    )
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(30)
    summary = {
        a: {
            "requests": len(r["texts"]),
            "prefill_hit_rate": round(r["h"] / r["q"], 4) if r["q"] else None,
            "follow_ups_on_first_prefill": r["stickiness"],
            "identical_to_decode_alone": r["identical"],
        }
        for a, r in res.items()
    }
    one, two = summary["1 worker"], summary["2 workers"]
    rec = {
        "args": vars(args),
        "summary": summary,
        "ratios": {
            "hit_rate_two_over_one": (
                round(two["prefill_hit_rate"] / one["prefill_hit_rate"], 3)
                if one["prefill_hit_rate"] and two["prefill_hit_rate"] is not None
                else None
            ),
            "stickiness_two_over_one": (
                round(two["follow_ups_on_first_prefill"] / one["follow_ups_on_first_prefill"], 3)
                if one["follow_ups_on_first_prefill"]
                and two["follow_ups_on_first_prefill"] is not None
                else None
            ),
        },
    }
    print(json.dumps(rec, indent=1))
    Path(args.out).write_text(json.dumps(rec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
