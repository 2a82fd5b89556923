"""The router's per-request path, A/B: pdctl's router from another source tree (the
baseline: a checkout of an earlier commit) against this tree's, in the same run.

Both routers run in push mode in front of the same in-process mock prefill and decode
(:mod:`pdctl.sdk.router.mock`, answering at once), one at a time, pinned to core 0 (the
client and the mocks on core 1); each round measures every configuration on both, in
alternating order. Per configuration — concurrency 1, 64 and 256, JSON and streamed —
the medians over rounds of mean latency, requests/s and router CPU per request, and
their ratios (this tree over the baseline: latency and CPU below 1.0, requests/s above
1.0 mean this tree is faster).

    git worktree add /tmp/router-base <commit>
    python benchmarks/router_ab.py --baseline /tmp/router-base [--rounds 5]
        [--out router_ab.json]

The baseline tree must have ``sdk/``, ``tui/`` and ``connector/`` (it runs with its own
sources first on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _bench import free_port, pdctl_router_argv
from router_overhead import cpu_s, load, wait_up

from pdctl.sdk.router.mock import MockConfig, MockServer

HERE = Path(__file__).resolve().parent
CONFIGS = ((1, 300), (64, 2000), (256, 4000))
"""(concurrency, requests per measurement)."""


def tree_env(tree: Path) -> dict[str, str]:
    src = [str(tree / d) for d in ("sdk", "tui", "connector")] + [str(tree)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(src)}


def start(tree: Path, p: str, d: str, tmp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    argv = ["taskset", "-c", "0", *pdctl_router_argv(p, d, port, tmp)]
    proc = subprocess.Popen(
        argv, env=tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return f"http://127.0.0.1:{port}", proc


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {1})
    pm = await MockServer(MockConfig(role="prefill", engine_id="prefill-0")).start()
    dm = await MockServer(MockConfig(role="decode")).start()
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-ab-"))
    trees = {"baseline": args.baseline, "current": HERE.parent}
    routers = {name: start(tree, pm.url, dm.url, tmp) for name, tree in trees.items()}
    reps: dict[tuple[str, bool, int], list[dict[str, float]]] = {}
    try:
        for url, _ in routers.values():
            await wait_up(url)
            await load(url, 300, 8, False)  # warm-up
        order = list(routers)
        for rnd in range(args.rounds):
            for stream in (False, True):
                for conc, n in CONFIGS:
                    for name in order if rnd % 2 == 0 else reversed(order):
                        url, proc = routers[name]
                        c0 = cpu_s(proc.pid)
                        lat, wall = await load(url, n, conc, stream)
                        reps.setdefault((name, stream, conc), []).append(
                            {
                                "mean_us": statistics.mean(lat) * 1e6,
                                "rps": n / wall,
                                "cpu_ms_per_req": (cpu_s(proc.pid) - c0) * 1000 / n,
                            }
                        )
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    finally:
        for _, proc in routers.values():
            proc.terminate()
        for _, proc in routers.values():
            proc.wait(10)
        await pm.stop()
        await dm.stop()
    rows: list[dict[str, Any]] = []
    for stream in (False, True):
        for conc, n in CONFIGS:
            med = {
                name: {
                    k: statistics.median(r[k] for r in reps[(name, stream, conc)])
                    for k in ("mean_us", "rps", "cpu_ms_per_req")
                }
                for name in routers
            }
            b, c = med["baseline"], med["current"]
            row = {
                "stream": stream,
                "concurrency": conc,
                "requests": n,
                "rounds": args.rounds,
                "baseline": {k: round(v, 3) for k, v in b.items()},
                "current": {k: round(v, 3) for k, v in c.items()},
                "latency_ratio": round(c["mean_us"] / b["mean_us"], 3),
                "rps_ratio": round(c["rps"] / b["rps"], 3),
                "cpu_ratio": round(c["cpu_ms_per_req"] / max(b["cpu_ms_per_req"], 1e-9), 3),
            }
            rows.append(row)
    return {"baseline": str(trees["baseline"]), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="a source tree of the router to compare")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="router_ab.json")
    args = ap.parse_args()
    args.baseline = Path(args.baseline).resolve()
    # stopped from outside (a timeout): unwind, so that both routers are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import uvloop

    rec = uvloop.run(run(args))
    print(f"{'config':>12} {'latency':>8} {'req/s':>8} {'cpu/req':>8}  (current / baseline)")
    for r in rec["rows"]:
        key = f"{'stream' if r['stream'] else 'json'} c{r['concurrency']}"
        print(f"{key:>12} {r['latency_ratio']:>8} {r['rps_ratio']:>8} {r['cpu_ratio']:>8}")
    Path(args.out).write_text(json.dumps(rec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
