"""What pdctl's CPU knobs (fleet.cpu_tuning: the pdctl connector's
``pdctl_nixl_progress_thread`` / ``pdctl_reserve_kv_core``) buy on a small machine.

Starts the embedded 1P1D demo fleet twice in one run — tuning off (stock vLLM + NIXL),
then on — and for each measures: time until both servers are ready, CPU the idle fleet
burns over a few seconds, and the latency of sequentially sent push-mode requests
(both legs at once). Prints the on/off ratios and writes a JSON record.

    python benchmarks/cpu_tuning.py [--requests 20] [--idle 5] [--out cpu_tuning.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import AsyncFleet
from pdctl.sdk.fleet.procs import cpu_seconds, instance_pids
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.pd import PrefillIdentity, push_request


async def measure(tuning: bool, args: argparse.Namespace) -> dict[str, Any]:
    spec = load_demo_spec(
        tiny_model_dir(),
        [f"fleet.cpu_tuning={str(tuning).lower()}", "fleet.name=bench-cpu-tuning"],
    ).spec
    fleet = AsyncFleet(spec, ready_timeout=400, grace=5)
    t0 = time.perf_counter()
    await fleet.up()
    ready_s = time.perf_counter() - t0
    try:
        pids = instance_pids([i.record.shepherd_pid for i in fleet._instances.values()])
        await asyncio.sleep(2)
        c0, w0 = cpu_seconds(pids), time.perf_counter()
        await asyncio.sleep(args.idle)
        idle_cpu_pct = 100 * (cpu_seconds(pids) - c0) / (time.perf_counter() - w0)
        p, d = fleet.plan.instances
        ident = PrefillIdentity.from_plan(p)
        lat: list[float] = []
        async with httpx.AsyncClient() as c:
            for i in range(args.requests + 2):
                body = {
                    "model": "tiny",
                    "prompt": f"request {i} " + "cache block " * 40,
                    "max_tokens": 16,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                r = await push_request(c, p.url, d.url, ident, body, timeout_s=120)
                if i >= 2:  # warm-up excluded
                    lat.append(r.latency_s)
    finally:
        await fleet.down()
    return {
        "cpu_tuning": tuning,
        "ready_s": round(ready_s, 2),
        "idle_cpu_pct": round(idle_cpu_pct, 1),
        "median_latency_ms": round(statistics.median(lat) * 1000, 1),
        "p90_latency_ms": round(sorted(lat)[int(0.9 * (len(lat) - 1))] * 1000, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--out", default="cpu_tuning.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-bench-"))
    off = asyncio.run(measure(False, args))
    print("tuning off:", off, flush=True)
    on = asyncio.run(measure(True, args))
    print("tuning on: ", on, flush=True)
    ratios = {
        "ready_time_on_over_off": round(on["ready_s"] / off["ready_s"], 2),
        "idle_cpu_on_over_off": round(on["idle_cpu_pct"] / max(off["idle_cpu_pct"], 0.1), 3),
        "median_latency_on_over_off": round(on["median_latency_ms"] / off["median_latency_ms"], 2),
    }
    print("ratios (on/off, lower is better):", ratios)
    Path(args.out).write_text(json.dumps({"off": off, "on": on, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
