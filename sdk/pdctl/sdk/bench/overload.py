"""Overload: goodput through a router with admission control against the same fleet
through a router without it, in one run (``pdctl bench --preset overload``,
``benchmarks/overload.py``).

The fleet's capacity is measured first (a closed loop through the arm without
admission); then ``load`` times that capacity is offered as Poisson arrivals for
``duration_s`` through each arm in turn, alternating which goes first over ``rounds``,
with a mix of priority classes and ``pdctl-slo-ttft-ms`` headers (:data:`MIX`). A client
gives up after ``give_up_s`` (it closes its connection: the router cancels both legs).

The load is offered by ``client_processes`` processes of their own (each a Poisson
stream of its share of the rate: together one Poisson stream), so that the clients'
event loops share nothing with the process that started the fleet and the routers, and
no one client's loop is so busy that it delays the answers it times.

Per arm and round (:func:`summary`): goodput (requests whose first token came within
their SLO, per second of offered load), answers by status, shed answers (429/503/504
with ``pdctl-drop-reason``) by status, reason and class and how many came within 50 ms
as the client saw them, and as the router timed them from reading the request to its
answer sent, at arrival or after queueing (``router_shed``,
:mod:`~pdctl.sdk.bench.overloadside`), every non-2xx answer later than 50 ms by cause
(:func:`late_by_cause`), the client's event-loop lag, p99 TTFT of admitted
interactive requests, requests lost (no answer and no error), the router's TTFT
predictions against what it measured (median |error|) and, given the instances, the
seconds until their KV is back at idle.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk import chaos
from pdctl.sdk.bench.overloadside import (
    FAST_S,
    LOOP_LAG,
    SHED_ANSWER,
    Lags,
    cpu_seconds,
    histogram_delta,
    router_histograms,
    tcp_drops,
)
from pdctl.sdk.chaos import completion
from pdctl.sdk.router.httpclient import Pool, UpstreamError
from pdctl.sdk.router.looplag import LoopLag
from pdctl.sdk.router.predictor import error_summary
from pdctl.sdk.router.running import run
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import router_url

MIX = (("interactive", 1500, 0.2), ("standard", 3000, 0.5), ("batch", 10000, 0.3))
"""(class, SLO on the time to first token in ms, share of requests)."""
WITH, WITHOUT = "with admission", "without admission"
SHED_FAST_S = FAST_S
WORDS = ("prefill", "decode", "cache", "push", "block", "layer", "token", "router")


@dataclass(frozen=True)
class OverloadPlan:
    load: float = 4.0
    """Offered load, times the measured capacity."""
    duration_s: float = 60.0
    rounds: int = 1
    capacity_s: float = 15.0
    conc: int = 4
    """Closed-loop clients while measuring capacity."""
    prompt_words: int = 120
    max_tokens: int = 16
    give_up_s: float = 20.0
    """A client's timeout."""
    prefill_in_flight: int = 2
    decode_in_flight: int = 4
    max_queued: int = 64
    seed: int = 1
    client_processes: int = 2
    """Processes offering the load, each its share (0: the caller's event loop)."""
    engine_nice: int = 10
    """The engines' CPU priority while the benchmark runs (``nice``; 0 leaves it):
    where engines, routers and the client share a few cores, the engines' busy threads
    would otherwise delay the router's and the client's answers
    (:func:`~pdctl.sdk.bench.overloadside.renice`)."""
    words: tuple[str, ...] = WORDS
    """The prompts' vocabulary (the benchmark uses the demo's words)."""

    def admission(self) -> dict[str, Any]:
        """The arm with admission: limits tuned to a small fleet."""
        return {
            "decode_in_flight_per_instance": self.decode_in_flight,
            "prefill_in_flight_per_instance": self.prefill_in_flight,
            "max_queued": self.max_queued,
        }

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("words")
        return d


@dataclass
class Outcome:
    klass: str
    slo_s: float
    status: int | None = None
    """None: no answer (given up by the client, or lost)."""
    ttft_s: float | None = None
    answered_s: float | None = None
    reason: str | None = None
    when: str | None = None
    """A shed answer's ``pdctl-shed-when`` (``arrival`` or ``queued``), if it had one."""
    gave_up: bool = False
    sent_s: float = 0.0
    """When it was sent, seconds into its arm."""


def prompt(plan: OverloadPlan, i: int) -> str:
    w = plan.words
    return " ".join(w[(i * 7 + j) % len(w)] for j in range(plan.prompt_words)) + f" {i}"


async def one(
    pool: Pool, i: int, klass: str, slo_ms: int, plan: OverloadPlan, sent_s: float = 0.0
) -> Outcome:
    """One streamed request with its class and SLO headers, as the client saw it. The
    client is the router's own lean one (:class:`~pdctl.sdk.router.httpclient.Pool`): at
    tens of requests per second per process, a general-purpose client's CPU made the
    clients' own event loops late, and their lateness counted in the answers they timed."""
    out = Outcome(klass, slo_ms / 1000, sent_s=sent_s)
    headers = [
        ("content-type", "application/json"),
        ("pdctl-priority", klass),
        ("pdctl-slo-ttft-ms", str(slo_ms)),
    ]
    body = json.dumps(completion(prompt(plan, i), plan.max_tokens, stream=True)).encode()
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(plan.give_up_s):
            r = await pool.request("POST", "/v1/completions", body, headers)
            out.status = r.status
            if r.status != 200:
                await r.read()
                out.answered_s = time.perf_counter() - t0
                out.reason = _text(r.header(b"pdctl-drop-reason"))
                out.when = _text(r.header(b"pdctl-shed-when"))
                return out
            async for chunk in r.iter_chunks():
                if out.ttft_s is None and b"data:" in chunk:
                    out.ttft_s = time.perf_counter() - t0
            out.answered_s = time.perf_counter() - t0
    except TimeoutError:
        out.gave_up = True
    except UpstreamError:
        out.status = out.status or -1
    return out


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def capacity(url: str, plan: OverloadPlan) -> float:
    """Requests/s the fleet finishes with ``plan.conc`` clients in a closed loop."""
    done = 0
    stop = time.perf_counter() + plan.capacity_s
    async with httpx.AsyncClient(timeout=120) as c:

        async def worker(w: int) -> None:
            nonlocal done
            i = w * 100000
            while time.perf_counter() < stop:
                body = completion(prompt(plan, i), plan.max_tokens, stream=True)
                r = await c.post(url + "/v1/completions", json=body)
                done += r.status_code == 200
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(plan.conc)))
        return done / (time.perf_counter() - t0)


async def arm(
    url: str, rate: float, plan: OverloadPlan, seed: int
) -> tuple[list[Outcome], dict[str, float | None]]:
    """Poisson arrivals at ``rate`` for ``plan.duration_s``, classes drawn from MIX; the
    outcomes and the client's event-loop lag meanwhile."""
    rng = random.Random(seed)
    pool = Pool(url)
    lag = Lags()
    cpu0 = time.process_time()
    try:
        async with LoopLag(lag.lags.append):
            tasks: list[asyncio.Task[Outcome]] = []
            t0 = time.perf_counter()
            at, i = 0.0, 0
            while at < plan.duration_s:
                at += rng.expovariate(rate)
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                klass, slo, _ = rng.choices(MIX, weights=[m[2] for m in MIX])[0]
                n = seed * 1000000 + i
                tasks.append(asyncio.create_task(one(pool, n, klass, slo, plan, sent_s=at)))
                i += 1
            outs = await asyncio.gather(*tasks)
    finally:
        pool.close()
    busy = (time.process_time() - cpu0) / max(1e-9, time.perf_counter() - t0)
    return outs, {**lag.summary(), "cpu_share": round(busy, 3)}


def _arm_here(
    url: str, rate: float, plan: OverloadPlan, seed: int
) -> tuple[list[Outcome], dict[str, float | None]]:
    """:func:`arm` in a process of its own (its entry point), on uvloop where installed."""
    return run(arm(url, rate, plan, seed))


async def offer(
    url: str, rate: float, plan: OverloadPlan, seed: int
) -> tuple[list[Outcome], dict[str, Any]]:
    """:func:`arm` at ``rate`` in all, from ``plan.client_processes`` processes of their
    own; the outcomes together, and per process its loop lag and CPU share."""
    k = plan.client_processes
    if k <= 0:
        outs, lag = await arm(url, rate, plan, seed)
        return outs, {"processes": [lag]}
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(k, mp_context=ctx) as pool:
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(pool, _arm_here, url, rate / k, plan, seed * 100 + j)
                for j in range(k)
            )
        )
    return [o for outs, _ in parts for o in outs], {"processes": [lag for _, lag in parts]}


def summary(outs: Sequence[Outcome], duration_s: float) -> dict[str, Any]:
    """What one arm's round came to (the module's docstring lists the figures)."""
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
        "goodput_rps": len(good) / duration_s,
        "good": len(good),
        "good_by_class": {k: sum(o.klass == k for o in good) for k, _, _ in MIX},
        "by_status": by_status,
        "shed_reasons": reasons,
        "shed_answer_max_ms": round(shed_s[-1] * 1000, 1) if shed_s else None,
        "shed_answer_p50_ms": round(_q(shed_s, 0.5) * 1000, 1) if shed_s else None,
        "shed_answer_p99_ms": round(_q(shed_s, 0.99) * 1000, 1) if shed_s else None,
        "interactive_ttft_p99_ms": round(_q(inter, 0.99) * 1000, 1) if inter else None,
        "lost": sum(o.status is None and not o.gave_up for o in outs),
        "shed_by": shed_by(shed),
        "shed": len(shed),
        "shed_within_50ms": sum(1 for x in shed_s if x <= SHED_FAST_S),
        "late_by_cause": late_by_cause(outs),
    }


CAUSES = ("evicted", "deadline_in_queue", "queue_timeout", "arrival", "other")
"""Why a non-2xx answer came: ``evicted`` (queued, then its place given to a higher
class: 429 after queueing), ``deadline_in_queue`` (its SLO or deadline passed while it
was queued: 504), ``queue_timeout`` (queued ``max_queue_wait_s`` without room: 503),
``arrival`` (shed at arrival) and ``other`` (any other error answer: not shed by
admission, e.g. 504 ``deadline_exceeded`` once admitted, or an upstream error)."""


def cause_of(o: Outcome) -> str:
    """The cause (:data:`CAUSES`) of a non-2xx answer, from its status and its
    ``pdctl-shed-when`` header."""
    if o.when == "arrival":
        return "arrival"
    if o.when == "queued":
        return {429: "evicted", 504: "deadline_in_queue", 503: "queue_timeout"}.get(
            o.status or 0, "other"
        )
    return "other"


LATE_LISTED = 20
"""Late answers per cause whose class and send time :func:`late_by_cause` lists."""


def late_by_cause(outs: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Non-2xx answers slower than 50 ms as the client saw them, per cause
    (:func:`cause_of`): how many, the median and the slowest (ms), and the first
    :data:`LATE_LISTED` as ``class@seconds into the arm`` (whether they came together,
    and when); every cause present, 0 when none."""
    late: dict[str, list[Outcome]] = {c: [] for c in CAUSES}
    for o in outs:
        if o.status is None or o.status == 200 or o.answered_s is None:
            continue
        if o.answered_s > SHED_FAST_S:
            late[cause_of(o)].append(o)
    out: dict[str, dict[str, Any]] = {}
    for c, os_ in late.items():
        xs = sorted(o.answered_s or 0.0 for o in os_)
        p50 = round(_q(xs, 0.5) * 1000, 1) if xs else None
        out[c] = {"n": len(xs), "p50_ms": p50, "max_ms": round(xs[-1] * 1000, 1) if xs else None}
        first = sorted(os_, key=lambda o: o.sent_s)[:LATE_LISTED]
        out[c]["sent"] = [f"{o.klass}@{o.sent_s:.1f}" for o in first]
    return out


def shed_by(shed: Sequence[Outcome]) -> dict[str, dict[str, float]]:
    """Per ``status reason class``: how many, and the slowest answer (ms)."""
    out: dict[str, dict[str, float]] = {}
    for o in shed:
        k = f"{o.status} {o.reason} {o.klass}"
        row = out.setdefault(k, {"n": 0, "max_ms": 0.0})
        row["n"] += 1
        row["max_ms"] = max(row["max_ms"], round((o.answered_s or 0) * 1000, 1))
    return out


def _q(xs: Sequence[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


AfterArm = Callable[[str, str], Awaitable[dict[str, Any]]]
"""Called after each arm's round with (arm, url): more figures for its summary (the
benchmark adds the seconds until the instances' KV is back at idle)."""


async def run_overload(
    arms: Mapping[str, str],
    plan: OverloadPlan,
    *,
    instances: Sequence[str] = (),
    router_pids: Mapping[str, int] | None = None,
    after_arm: AfterArm | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Capacity through the arm without admission, then each round offers ``plan.load``
    times it through every arm, the arms' order alternating round by round. ``arms``
    maps :data:`WITH` and :data:`WITHOUT` to router URLs; given the ``instances``' URLs,
    each arm's figures add the seconds until their KV is back at its idle value; given
    each arm's router process (``router_pids``), the share of a core it used."""
    async with httpx.AsyncClient(timeout=30) as c:
        idle = await chaos.fresh_idle(c, instances) if instances else {}
    cap = await capacity(arms[WITHOUT], plan)
    rate = max(cap, 0.1) * plan.load
    if say:
        say(f"capacity {cap:.2f} req/s; offering {rate:.2f} req/s for {plan.duration_s:g} s")
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
    for r in range(plan.rounds):
        order = list(arms.items()) if r % 2 == 0 else list(arms.items())[::-1]
        for name, url in order:
            async with httpx.AsyncClient(timeout=30) as c:
                before, drops = await router_histograms(c, url), tcp_drops()
            pid = (router_pids or {}).get(name)
            cpu0, t0 = cpu_seconds(pid), time.perf_counter()
            outs, lag = await offer(url, rate, plan, seed=plan.seed + r)
            cpu1, took = cpu_seconds(pid), time.perf_counter() - t0
            s = summary(outs, plan.duration_s)
            s["client_loop_lag"] = lag
            known = cpu0 is not None and cpu1 is not None
            share = ((cpu1 or 0.0) - (cpu0 or 0.0)) / took
            s["router_cpu_share"] = round(share, 3) if known else None
            s["tcp_drops"] = {k: v - drops.get(k, 0) for k, v in tcp_drops().items()}
            async with httpx.AsyncClient(timeout=30) as c:
                if idle:
                    s["kv_idle_after_s"] = (await chaos.kv_back_to_idle(c, idle, wait_s=60))[0]
                after = await router_histograms(c, url)
                s["router_shed"] = histogram_delta(before.get(SHED_ANSWER), after.get(SHED_ANSWER))
                lags = histogram_delta(before.get(LOOP_LAG), after.get(LOOP_LAG))
                s["router_loop_lag"] = None if lags is None else lags.get("")
                reqs = (await c.get(url + "/v1/pdctl/requests?limit=10000")).json()["requests"]
            # the router's TTFT predictions against what it measured (its last 1,000)
            s["ttft_prediction"] = error_summary(reqs)
            if after_arm is not None:
                s.update(await after_arm(name, url))
            rounds[name].append(s)
            if say:
                say(f"round {r + 1} {name}: goodput {s['goodput_rps']:.2f} req/s")
    med = {k: statistics.median(x["goodput_rps"] for x in v) for k, v in rounds.items() if v}
    base = med.get(WITHOUT)
    return {
        "capacity_rps": cap,
        "offered_rps": rate,
        "plan": plan.as_dict(),
        "rounds": rounds,
        "goodput_median_rps": med,
        "goodput_ratio": med[WITH] / base if base and WITH in med else None,
    }


def start_router(
    spec: FleetSpec, admission: Mapping[str, Any], folder: Path, port: int
) -> tuple[str, subprocess.Popen[bytes]]:
    """A router of one worker for ``spec``'s fleet on ``port`` with these admission
    settings, in its own process (``python -m pdctl.sdk.router.server``)."""
    assert spec.router is not None
    adm = spec.router.admission.model_copy(update=dict(admission))
    r = spec.router.model_copy(update={"port": port, "workers": 1, "admission": adm})
    s = spec.model_copy(update={"router": r})
    f = folder / f"router-{port}.json"
    f.write_text(s.model_dump_json())
    argv = [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]
    return router_url(s), subprocess.Popen(argv)
