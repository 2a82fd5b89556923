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
``stock`` — ``fleet.cpu_tuning = false`` (NIXL progress threads busy-polling).
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
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk import chaos
from pdctl.sdk.fleet import AsyncFleet
from pdctl.sdk.fleet.procs import cpu_seconds, instance_pids
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.specload import load_demo_spec
from pdctl.sdk.urls import router_url

ARMS: dict[str, list[str]] = {
    "strict": ["fleet.cpu_tuning=true"],
    "none": ["fleet.cpu_tuning=true", "fleet.connector_options.pdctl_nixl_sync_mode=none"],
    "rw": ["fleet.cpu_tuning=true", "fleet.connector_options.pdctl_nixl_sync_mode=rw"],
    "stock": ["fleet.cpu_tuning=false"],
}


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


async def soak(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = load_demo_spec(tiny_model_dir(), [*ARMS[arm], f"fleet.name=chaos-{arm}"]).spec
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
            for n in range(args.rounds):
                reports = []
                bad = await chaos.bad_input(c, router, args.bad, max_model_len=max_len)
                reports.append(await chaos.run_fault("bad-input", c, router, baseline, bad))
                storm = await chaos.disconnect_storm(c, router, args.storm, rng=rng)
                reports.append(
                    await chaos.run_fault("disconnect-storm", c, router, baseline, storm)
                )
                over = await chaos.overload(c, router, args.overload)
                rep = await chaos.run_fault("overload", c, router, baseline, over)
                rep_d = rep.as_dict()
                rep_d["p50_s"] = statistics.median(a.seconds for a in over)
                dead = [
                    nm for nm, u in zip(names, urls, strict=True) if not await chaos.healthy(c, u)
                ]
                crashes += len(dead)
                rounds.append(
                    {
                        "round": n,
                        "faults": [r.as_dict() for r in reports] + [rep_d],
                        "dead": dead,
                    }
                )
                print(
                    f"[{arm}] round {n}: dead={dead} overload={rep.statuses} "
                    f"p50={rep_d['p50_s']:.1f}s kv_back={rep.kv_back_s}",
                    flush=True,
                )
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
        "overload_p50_s_median": round(statistics.median(f["p50_s"] for f in bursts), 2),
        "kv_back_max_s": max((v for v in kv_back if v is not None), default=None),
        "kv_not_back": sum(v is None for v in kv_back),
        "lost": sum(f["lost"] for f in faults),
        "kill_answer_p100_s": max((f["answer_p100_s"] for f in kills), default=None),
        "kill_decode_kv_back_s": [f["kv_back_s"] for f in kills],
        "detail": rounds,
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
    ap.add_argument("--out", default="chaos.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-chaos-"))
    os.environ["PDCTL_ALLOW_FAILPOINTS"] = "1"
    model = ["-m", "pdctl.connector.tinymodel", "--out", str(tiny_model_dir())]
    subprocess.run([sys.executable, *model], check=True)
    results = []
    for arm in args.arms.split(","):
        res = asyncio.run(soak(arm.strip(), args))
        results.append(res)
        summary = {k: v for k, v in res.items() if k != "detail"}
        print(json.dumps(summary), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
    base = results[0]
    for r in results[1:]:
        print(
            f"{r['arm']}/{base['arm']}: crashes {r['engine_crashes']} vs {base['engine_crashes']}, "
            f"idle CPU x{r['idle_cpu_pct'] / max(base['idle_cpu_pct'], 0.1):.2f}, overload p50 "
            f"x{r['overload_p50_s_median'] / max(base['overload_p50_s_median'], 0.01):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
