"""The chaos soak on the real CPU 1P1D demo fleet: does the push lifecycle survive bad
input, client-disconnect storms and overload, and does every KV block come back?

For each arm (a set of spec overrides) it starts the embedded demo fleet, reads the
fresh idle KV usage and idle CPU, then runs ``--rounds`` rounds of: a burst of input the
prefill accepts and the decode rejects, a storm of clients that hang up at random
points, and an overload burst (``--overload`` concurrent requests, ≥ 8x max_num_seqs).
After every fault it measures each instance's time back to its fresh KV value and the
time until the router serves again; after every round it checks both engines are alive
(a dead one is counted as a crash and restarted so the soak goes on). Prints per-arm
totals and the ratio of each arm against the first, and writes a JSON record.

    python benchmarks/chaos.py --arms strict,none --rounds 10 [--out chaos.json]

Arms: ``strict`` — pdctl's CPU knobs with the agent's STRICT sync mode (the default);
``none`` — the same knobs with NIXL's NONE sync mode (the crash-prone setting);
``stock`` — ``fleet.cpu_tuning = false`` (NIXL progress threads busy-polling);
``nowatch`` — ``strict`` without decode's watch on its prefills (``pdctl_peer_watch_s =
0``: the connector before that fix); ``norelease`` — ``strict`` without the router's
release requests (``router.release_kv_on_failure = false``: the router before that fix).

``--faults`` picks the faults of a round (default ``bad,storm,overload``); the kills and
the side channel (:mod:`pdctl.sdk.chaos.kills`, :mod:`pdctl.sdk.chaos.sidechannel`):

    python benchmarks/chaos.py --arms strict,nowatch --rounds 2 --faults \
        kill-decode-after-registration,kill-decode-mid-stream,kill-prefill-before-write,\
        side-channel-refused,side-channel-blackholed

``side-channel-cut-refused`` / ``side-channel-cut-blackholed`` cut decode off from the
prefill's side channel (the connector's failpoint) under traffic through the router:

    python benchmarks/chaos.py --arms strict,norelease --rounds 2 --faults \
        side-channel-cut-refused,side-channel-cut-blackholed

``kv-corrupt`` (:mod:`pdctl.sdk.chaos.kvcorrupt`) arms the KV digest check at rate 1.0
and the corrupting failpoint (the prefill misplaces two blocks of every tagged WRITE);
each round sends ``--corrupt-n`` requests, one in four tagged, and reports how many were
detected (``undetected`` and ``false_positives`` must be 0) and how they were answered:

    python benchmarks/chaos.py --arms strict --rounds 2 --faults kv-corrupt

``--engine-kills decode,prefill`` adds the engine-core kills under a mixed overload
(:mod:`pdctl.sdk.chaos.mixed`): ``--mix`` concurrent greedy requests (half streamed,
completions and chat, 32 to 96 tokens) and a SIGKILL of one instance's EngineCore only
(its API server stays up answering vLLM's engine-dead 500), ``--kill-runs`` times on one
fleet: ``decode`` on 1P2D (decode-0's engine; the router migrates), ``prefill`` on 2P1D
(prefill-0's engine; the router retries on prefill-1). Each run's answers are compared
token for token with one instance alone; the baseline is the same mix with no kill, in
the same run (its completions and its p50, against which each kill's p50 is a ratio):

    python benchmarks/chaos.py --engine-kills decode,prefill --kill-runs 10 --mix 48

``--path tokens`` runs the same kills with a render server in front and the router on
its tokens path (render, token ids to the engines' ``/inference/v1/generate``,
derender).

A killed instance is restarted by the fleet's supervisor (not by the benchmark); the
report's ``service_back_s`` is the time from the kill until the router served again.
Loopback only; bounded by ``--rounds`` and the per-request timeouts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk import chaos
from pdctl.sdk.chaos import kills, kvcorrupt, mixed, sidechannel
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import AsyncFleet
from pdctl.sdk.fleet.procs import cpu_seconds, instance_pids
from pdctl.sdk.freeports import free_ports
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.pd import PrefillIdentity
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import router_url

ARMS: dict[str, list[str]] = {
    "strict": ["fleet.cpu_tuning=true"],
    "none": ["fleet.cpu_tuning=true", "fleet.connector_options.pdctl_nixl_sync_mode=none"],
    "rw": ["fleet.cpu_tuning=true", "fleet.connector_options.pdctl_nixl_sync_mode=rw"],
    "stock": ["fleet.cpu_tuning=false"],
    "nowatch": ["fleet.cpu_tuning=true", "fleet.connector_options.pdctl_peer_watch_s=0"],
    "norelease": ["fleet.cpu_tuning=true", "router.release_kv_on_failure=false"],
}
RESTARTS = [
    f"{g}.0.{k}" for g in ("prefill", "decode") for k in ("max_restarts=100", "restart_window_s=20")
]
"""Kill faults restart instances every round: no crash-loop verdict, no growing backoff."""
DEFAULT_FAULTS = "bad,storm,overload"
KILLS = kills.POINTS


async def idle_cpu_pct(fleet: AsyncFleet, seconds: float) -> float:
    pids = instance_pids([i.record.shepherd_pid for i in fleet._instances.values()])
    c0, w0 = cpu_seconds(pids), time.perf_counter()
    await asyncio.sleep(seconds)
    return 100 * (cpu_seconds(pids) - c0) / (time.perf_counter() - w0)


async def kill_prefill(
    fleet: AsyncFleet,
    c: httpx.AsyncClient,
    router: str,
    baseline: dict[str, float],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """SIGKILL the prefill's engine under load; every client must get an answer, the
    decode must free its blocks; then restart the prefill and time the way back."""
    p, d = fleet.plan.instances[:2]
    inst = fleet._instances[p.name]
    pids = chaos.engine_pids(instance_pids([inst.record.shepherd_pid]))
    answers = await chaos.kill_during_load(c, router, pids, n=args.kill_n, after_s=args.kill_after)
    t0 = time.perf_counter()
    back, last = await chaos.kv_back_to_idle(c, {d.url: baseline[d.url]})
    await fleet.restart(p.name)
    service = await chaos.time_to_service(c, router)
    rep = chaos.FaultReport("kill-prefill", answers, back, last, service)
    out = rep.as_dict()
    out["restart_and_service_s"] = time.perf_counter() - t0
    out["engine_pids_killed"] = len(pids)
    return out


def port_overrides() -> list[str]:
    hp, sp, hd, sd, rp = free_ports(5)
    return [
        f"prefill.0.http_port={hp}",
        f"prefill.0.side_channel_port={sp}",
        f"decode.0.http_port={hd}",
        f"decode.0.side_channel_port={sd}",
        f"router.port={rp}",
    ]


async def _counters(c: httpx.AsyncClient, url: str) -> dict[str, float | None]:
    """Prefill's early releases by reason, its expiries, and vLLM's expired leases."""
    try:
        m = parse((await c.get(url + "/metrics", timeout=5)).text)
    except httpx.HTTPError:
        return {}
    out: dict[str, float | None] = {
        f"released_{r}": total(m, rv.RELEASED + "_total", {rv.REASON_LABEL: r})
        for r in ("decode_aborted", "write_failed", "handshake_failed")
    }
    out["push_expired"] = total(m, rv.EXPIRED + "_total")
    out["vllm_kv_expired"] = total(m, "vllm:nixl_num_kv_expired_reqs_total")
    return out


def _engines(fleet: AsyncFleet, name: str) -> list[int]:
    return chaos.engine_pids(instance_pids([fleet._instances[name].record.shepherd_pid]))


async def _idle_kv(c: httpx.AsyncClient, url: str, wait_s: float = 120.0) -> float:
    """A (re)started instance's fresh idle KV usage, once it answers."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < wait_s:
        s = await chaos.scrape(c, url)
        if s is not None:
            return s[chaos.KV_USAGE]
        await asyncio.sleep(0.5)
    return 0.0


async def new_fault(
    name: str,
    fleet: AsyncFleet,
    c: httpx.AsyncClient,
    router: str,
    switches: tuple[Path, Path],
    baseline: dict[str, float],
    delay_ms: float,
) -> dict[str, Any]:
    """One kill or side-channel fault; the killed instance comes back by the supervisor
    (``switches``: the failpoints' files, WRITE delay and side-channel cut)."""
    switch, cut = switches
    delay_s = delay_ms / 1000
    p, d = fleet.plan.instances[:2]
    mode: sidechannel.Mode = "blackholed" if "blackhole" in name else "refused"
    if name in kills.POINTS:
        killed, survivor = (p, d) if "prefill" in name else (d, p)
        rep = await kills.kill_at(
            name,
            c,
            router,
            _engines(fleet, killed.name),
            (survivor.url, baseline[survivor.url]),
            switch=switch,
            delay_s=delay_s,
        )
    elif name.startswith("side-channel-cut"):
        rep = await sidechannel.side_channel_cut(c, router, cut, baseline, mode=mode)
    else:
        plan = fleet._instances[p.name].plan
        rep = await sidechannel.side_channel_unreachable(
            c, (p.url, PrefillIdentity.from_plan(plan)), d.url, baseline, mode=mode
        )
    out = rep.as_dict()
    out["kv_samples"] = out["kv_samples"][:40]
    out["prefill_counters"] = await _counters(c, p.url)
    dead = d if "decode" in name else p if "prefill" in name else None
    if dead is not None:
        rec = fleet._instances[dead.name].record
        out["restarted"] = {"restarts": rec.restarts, "engine_id": rec.engine_id}
        after = await _idle_kv(c, dead.url)
        out["restarted_kv_vs_fresh"] = [after, baseline[dead.url]]
    print(
        f"  {name}: {rep.statuses} after fault {out.get('answers_after_fault_s')} "
        f"kv_back={rep.kv_back_s} service_back={rep.service_back_s}",
        flush=True,
    )
    return out


async def soak(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    state = Path(os.environ["PDCTL_STATE_DIR"])
    switch = state / f"chaos-{arm}-delay-writes"
    overrides = [*ARMS[arm], f"fleet.name=chaos-{arm}", *RESTARTS, *port_overrides()]
    cut = state / f"chaos-{arm}-cut-side-channel"
    overrides.append(
        f"fleet.connector_options.pdctl_failpoint_write_delay={args.write_delay_ms}:while:{switch}"
    )
    overrides.append(f"fleet.connector_options.pdctl_failpoint_side_channel=refused:while:{cut}")
    if "kv-corrupt" in args.faults.split(","):
        overrides.extend(kvcorrupt.overrides())
    spec = load_demo_spec(tiny_model_dir(), overrides).spec
    router = router_url(spec)
    max_len = spec.model.max_model_len or 1024
    fleet = AsyncFleet(spec, ready_timeout=400, grace=5)
    await fleet.up()
    rng = random.Random(args.seed)
    rounds: list[dict[str, Any]] = []
    crashes = 0
    try:
        urls = [p.url for p in fleet.plan.instances]
        names = [p.name for p in fleet.plan.instances]
        async with httpx.AsyncClient(timeout=None) as c:
            await chaos.time_to_service(c, router)  # warm both legs once
            await asyncio.sleep(2)
            idle = await idle_cpu_pct(fleet, args.idle)
            baseline = await chaos.fresh_idle(c, urls)
            faults = args.faults.split(",")
            for n in range(args.rounds):
                reports: list[dict[str, Any]] = []
                if "bad" in faults:
                    bad = await chaos.bad_input(c, router, args.bad, max_model_len=max_len)
                    rep = await chaos.run_fault("bad-input", c, router, baseline, bad)
                    reports.append(rep.as_dict())
                if "storm" in faults:
                    storm = await chaos.disconnect_storm(c, router, args.storm, rng=rng)
                    rep = await chaos.run_fault("disconnect-storm", c, router, baseline, storm)
                    reports.append(rep.as_dict())
                if "overload" in faults:
                    over = await chaos.overload(c, router, args.overload)
                    rep = await chaos.run_fault("overload", c, router, baseline, over)
                    reports.append(
                        {**rep.as_dict(), "p50_s": statistics.median(a.seconds for a in over)}
                    )
                if "kv-corrupt" in faults:
                    p, d = fleet.plan.instances[:2]
                    ident = PrefillIdentity.from_plan(fleet._instances[p.name].plan)
                    kv = await kvcorrupt.kv_corrupt(c, (p.url, ident), d.url, n=args.corrupt_n)
                    # every block back on both sides, the failed receives included
                    kv["kv_back_s"], _ = await chaos.kv_back_to_idle(c, baseline, wait_s=30)
                    kv["lost"] = 0  # every request is answered (tagged and clean statuses)
                    print(f"  kv-corrupt: {kv}", flush=True)
                    reports.append(kv)
                for name in [f for f in faults if f in KILLS or f.startswith("side-channel")]:
                    reports.append(
                        await new_fault(
                            name, fleet, c, router, (switch, cut), baseline, args.write_delay_ms
                        )
                    )
                    if name in KILLS:
                        baseline = {u: await _idle_kv(c, u) for u in urls}
                dead = [
                    nm for nm, u in zip(names, urls, strict=True) if not await chaos.healthy(c, u)
                ]
                crashes += len(dead)
                rounds.append({"round": n, "faults": reports, "dead": dead})
                over_s = [
                    f"overload={f['statuses']} p50={f['p50_s']:.1f}s kv_back={f['kv_back_s']}"
                    for f in reports
                    if f["fault"] == "overload"
                ]
                print(f"[{arm}] round {n}: dead={dead} {' '.join(over_s)}", flush=True)
                for nm in dead:
                    await fleet.restart(nm)
                    baseline = await chaos.fresh_idle(c, urls)
                if args.kill_prefill:
                    kill = await kill_prefill(fleet, c, router, baseline, args)
                    rounds[-1]["faults"].append(kill)
                    baseline = await chaos.fresh_idle(c, urls)
    finally:
        await fleet.down()
    faults = [f for r in rounds for f in r["faults"]]
    bursts = [f for f in faults if f["fault"] == "overload"]
    kills = [f for f in faults if f["fault"] == "kill-prefill"]
    kv_back = [v for f in faults for v in f["kv_back_s"].values()]
    return {
        "arm": arm,
        "overrides": ARMS[arm],
        "rounds": len(rounds),
        "engine_crashes": crashes,
        "idle_cpu_pct": round(idle, 1),
        "overload_ok": sum(f["statuses"].get("200", 0) for f in bursts),
        "overload_sent": args.overload * len(bursts),
        "overload_p50_s_median": (
            round(statistics.median(f["p50_s"] for f in bursts), 2) if bursts else None
        ),
        "kv_back_max_s": max((v for v in kv_back if v is not None), default=None),
        "kv_not_back": sum(v is None for v in kv_back),
        "lost": sum(f["lost"] for f in faults),
        "kill_answer_p100_s": max((f["answer_p100_s"] for f in kills), default=None),
        "kill_decode_kv_back_s": [f["kv_back_s"] for f in kills],
        "new_faults": _new_fault_summary(faults),
        "kv_corrupt": _corrupt_summary(faults),
        "detail": rounds,
    }


def _corrupt_summary(faults: list[dict[str, Any]]) -> dict[str, Any] | None:
    runs = [f for f in faults if f["fault"] == "kv-corrupt"]
    if not runs:
        return None
    return {
        "tagged": sum(f["tagged"] for f in runs),
        "detected": sum(f["verify"]["mismatch"] for f in runs),
        "undetected": sum(f["undetected"] for f in runs),
        "false_positives": sum(f["false_positives"] for f in runs),
        "verified_ok": sum(f["verify"]["ok"] for f in runs),
        "tagged_200": sum(f["tagged_statuses"].get("200", 0) for f in runs),
    }


def _new_fault_summary(faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kill/side-channel fault: answers after the fault (p100), statuses, lost, KV
    back (max over rounds, None if any was not back), time back to service."""
    out: dict[str, Any] = {}
    for f in faults:
        name = f["fault"]
        if name in ("bad-input", "disconnect-storm", "overload", "kill-prefill", "kv-corrupt"):
            continue
        s = out.setdefault(
            name,
            {
                "statuses": {},
                "lost": 0,
                "answer_after_fault_p100_s": 0.0,
                "kv_back_s": [],
                "service_back_s": [],
            },
        )
        for k, v in f["statuses"].items():
            s["statuses"][k] = s["statuses"].get(k, 0) + v
        s["lost"] += f["lost"]
        s["answer_after_fault_p100_s"] = max(
            s["answer_after_fault_p100_s"], max(f.get("answers_after_fault_s") or [0.0])
        )
        s["kv_back_s"].append(f["kv_back_s"])
        s["service_back_s"].append(f["service_back_s"])
    return out


def _legs_on(c: httpx.AsyncClient, router: str, name: str, n: int) -> Callable[[], Awaitable[bool]]:
    """Whether the router holds at least ``n`` legs in flight on instance ``name`` (the
    kill then lands on requests it is serving, however fast the machine is)."""

    async def ready() -> bool:
        r = await c.get(router + "/v1/pdctl/state")
        found = [i for i in r.json().get("instances", []) if i.get("name") == name]
        return bool(found) and int(found[0].get("in_flight") or 0) >= n

    return ready


async def _failed_timelines(c: httpx.AsyncClient, router: str, limit: int) -> list[dict[str, Any]]:
    """The router's own record of the requests it did not answer 200 or moved (their
    legs, retries, migrations and notes), newest first: why each failure happened."""
    r = await c.get(router + "/v1/pdctl/requests", params={"limit": limit})
    if r.status_code != 200:
        return [{"error": f"/v1/pdctl/requests answered {r.status_code}"}]
    keep = ("id", "status", "outcome", "prefill", "decode", "retries", "migrations", "notes")
    return [
        {k: t.get(k) for k in keep}
        for t in r.json().get("requests", [])
        if t.get("status") != 200 or t.get("migrations") or t.get("retries")
    ]


async def engine_kills(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--kill-runs`` engine-core kills of ``kind`` (decode: 1P2D, prefill: 2P1D) under
    the mix, after one run of the mix with no kill (the baseline)."""
    group = "decode" if kind == "decode" else "prefill"
    name = f"{group}-0"
    topo = [f"{group}.0.count=2", f"{group}.0.restart_backoff_s=0.5"]
    tokens = args.path == "tokens"
    fleet_name = f"chaos-core-{kind}{'-tokens' if tokens else ''}"
    overrides = ["fleet.cpu_tuning=true", f"fleet.name={fleet_name}", *RESTARTS]
    spec = load_demo_spec(tiny_model_dir(), [*overrides, *topo, *port_overrides()]).spec
    if tokens:  # a render server in front, the router on the tokens path
        d = spec.model_dump()
        d["render"] = [{"host": "127.0.0.1", "http_port": free_ports(1)[0]}]
        d["router"]["path"] = "tokens"
        spec = FleetSpec(**d)
    router = router_url(spec)
    fleet = AsyncFleet(spec, ready_timeout=400, grace=5)
    await fleet.up()
    reqs = mixed.mixed_requests(args.mix)
    runs: list[dict[str, Any]] = []
    try:
        urls = {p.name: p.url for p in fleet.plan.instances}
        alone = urls["decode-1" if kind == "decode" else "decode-0"]
        async with httpx.AsyncClient(timeout=None) as c:
            await chaos.time_to_service(c, router)
            want = await mixed.reference(c, alone, reqs)
            for n in range(args.kill_runs + 1):
                await asyncio.sleep(1)
                base = await chaos.fresh_idle(c, list(urls.values()))
                rec = fleet._instances[name].record
                before = rec.restarts
                pids = _engines(fleet, name) if n else []

                def kill(pids: list[int] = pids) -> int:
                    return kills.sigkill(pids)

                got = await mixed.kill_under_mix(
                    c, router, reqs, kill,
                    min_streams=4 if kind == "decode" else 0,
                    after_s=1.5 if kind == "decode" else 3.0,
                    ready=None if kind == "decode" else _legs_on(c, router, name, 4),
                )  # fmt: skip
                failed = got.failures(want)
                timelines = await _failed_timelines(c, router, len(reqs)) if n else []
                live = {u: base[u] for nm, u in urls.items() if nm != name}
                back, _ = await chaos.kv_back_to_idle(c, live, wait_s=15)
                t0 = time.perf_counter()
                restarted_s = None
                while n and time.perf_counter() - t0 < 180:
                    if rec.restarts > before and rec.state == "ready":
                        restarted_s = round(time.perf_counter() - t0, 1)
                        break
                    await asyncio.sleep(0.5)
                served = await chaos.time_to_service(c, router, wait_s=60)
                row = {
                    "run": n,
                    "killed": bool(n),
                    "killed_at_s": got.killed_at_s,
                    "streams_mid_answer": got.streams_mid_answer,
                    "complete": got.complete(want),
                    "identical": got.identical(want),
                    "failures": failed[:10],
                    "retried_on_another_prefill": sum(bool(t.get("retries")) for t in timelines),
                    "moved_decode_only": sum(
                        any("through_prefill" not in m for m in t.get("migrations") or ())
                        for t in timelines
                    ),
                    "disaggregated_again": sum(
                        any("through_prefill" in m for m in t.get("migrations") or ())
                        for t in timelines
                    ),
                    # the moved ones first: their notes say why they moved
                    "failed_or_moved": sorted(timelines, key=lambda t: not t.get("migrations"))[
                        :20
                    ],
                    "p50_s": statistics.median(a.seconds for a in got.answers),
                    "kv_back_s": back,
                    "restarted_after_answers_s": restarted_s,
                    "restarts": rec.restarts,
                    "served_again": served is not None,
                }
                runs.append(row)
                print(
                    f"  [{kind}] run {n}{' (no kill)' if not n else ''}: "
                    f"{row['complete']}/{len(reqs)} complete, {row['identical']}/{len(reqs)} "
                    f"identical, p50 {row['p50_s']:.1f} s, KV back {back}, restarted "
                    f"{restarted_s} s after; {row['retried_on_another_prefill']} retried on "
                    f"another prefill, {row['moved_decode_only']} moved decode-only, "
                    f"{row['disaggregated_again']} disaggregated again",
                    flush=True,
                )
                for t in [t for t in timelines if t.get("status") != 200][:3]:
                    print(f"    failed: {json.dumps(t)[:1500]}", flush=True)
    finally:
        await fleet.down()
    killed = [r for r in runs if r["killed"]]
    base_p50 = runs[0]["p50_s"]
    return {
        "engine_kill": kind,
        "path": args.path,
        "topology": "1P2D" if kind == "decode" else "2P1D",
        "mix": len(reqs),
        "runs": len(killed),
        "baseline_complete": runs[0]["complete"],
        "baseline_identical": runs[0]["identical"],
        "all_complete_runs": sum(r["complete"] == len(reqs) for r in killed),
        "identical_ge_n_minus_2_runs": sum(r["identical"] >= len(reqs) - 2 for r in killed),
        "p50_ratio_vs_no_kill": [round(r["p50_s"] / max(base_p50, 1e-3), 2) for r in killed],
        "kv_not_back": sum(v is None for r in killed for v in r["kv_back_s"].values()),
        "restarted_runs": sum(r["restarted_after_answers_s"] is not None for r in killed),
        "detail": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default="strict,none")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--bad", type=int, default=8)
    ap.add_argument("--storm", type=int, default=32)
    ap.add_argument("--overload", type=int, default=64)
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--kill-prefill", action="store_true", help="add a SIGKILL fault per round")
    ap.add_argument("--kill-n", type=int, default=8, help="requests in flight at the kill")
    ap.add_argument("--kill-after", type=float, default=0.5, help="seconds into the burst")
    ap.add_argument("--faults", default=DEFAULT_FAULTS, help="faults per round (comma list)")
    ap.add_argument(
        "--write-delay-ms", type=int, default=1500, help="WRITE delay of the kill faults"
    )
    ap.add_argument("--corrupt-n", type=int, default=16, help="requests per kv-corrupt fault")
    ap.add_argument(
        "--engine-kills", default="", help="engine-core kills under the mix: decode,prefill"
    )
    ap.add_argument("--kill-runs", type=int, default=10, help="engine-core kills per kind")
    ap.add_argument("--mix", type=int, default=48, help="concurrent requests at each kill")
    ap.add_argument(
        "--path",
        choices=("text", "tokens"),
        default="text",
        help="the router's path for the engine kills (tokens: a render server in front)",
    )
    ap.add_argument("--out", default="chaos.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-chaos-"))
    os.environ["PDCTL_ALLOW_FAILPOINTS"] = "1"
    model = ["-m", "pdctl.connector.tinymodel", "--out", str(tiny_model_dir())]
    subprocess.run([sys.executable, *model], check=True)
    if args.engine_kills:
        out = []
        for kind in args.engine_kills.split(","):
            res = asyncio.run(engine_kills(kind.strip(), args))
            out.append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "detail"}), flush=True)
            Path(args.out).write_text(json.dumps(out, indent=2))
        return 0
    results = []
    for arm in args.arms.split(","):
        res = asyncio.run(soak(arm.strip(), args))
        results.append(res)
        summary = {k: v for k, v in res.items() if k != "detail"}
        print(json.dumps(summary), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
    base = results[0]
    for r in results[1:]:
        if base["overload_p50_s_median"] is None or r["overload_p50_s_median"] is None:
            continue
        print(
            f"{r['arm']}/{base['arm']}: crashes {r['engine_crashes']} vs {base['engine_crashes']}, "
            f"idle CPU x{r['idle_cpu_pct'] / max(base['idle_cpu_pct'], 0.1):.2f}, overload p50 "
            f"x{r['overload_p50_s_median'] / max(base['overload_p50_s_median'], 0.01):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
