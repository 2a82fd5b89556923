"""What the GPU-less front end costs and saves: the router's text path vs its tokens path
on the same real vLLM-CPU fleet, in one run.

Starts the CPU demo pair (prefill + decode with ``--enable-scale-out``) plus one render
server, then two pdctl routers over it — ``router.path = "text"`` and ``"tokens"`` —
and sends the same prompts through each, interleaved. Reports, per path: median and p90
latency, router CPU per request and (tokens path) render-server CPU per request, from
``/proc``; then the ratios tokens/text. With ``--threshold N`` short prompts skip
prefill on the tokens path (conditional disaggregation), which the text path cannot do.

    python benchmarks/tokens_path.py [--requests 40] [--threshold 0] [--stream]
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

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import free_port, greedy_body

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import AsyncFleet
from pdctl.sdk.fleet.procs import cpu_seconds, instance_pids
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.urls import router_url


def prompts(n: int) -> list[str]:
    return [
        " ".join(DEMO_WORDS[(i * 7 + j) % len(DEMO_WORDS)] for j in range(8 + (i * 13) % 120))
        + f" #{i}"
        for i in range(n)
    ]


def start_router(spec: FleetSpec, path: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    assert spec.router is not None
    s = spec.model_copy(deep=True)
    s.router = spec.router.model_copy(update={"port": free_port(), "path": path})
    f = tmp / f"spec-{path}.json"
    f.write_text(s.model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)],
        stderr=subprocess.DEVNULL,
    )
    return proc, router_url(s)


async def wait_up(url: str) -> None:
    async with httpx.AsyncClient() as c:
        for _ in range(300):
            try:
                if (await c.get(url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"router at {url} did not come up")


async def one(c: httpx.AsyncClient, url: str, prompt: str, stream: bool) -> float:
    body = greedy_body(prompt, 16, stream)
    t0 = time.perf_counter()
    if stream:
        async with c.stream("POST", url + "/v1/completions", json=body) as r:
            async for _ in r.aiter_bytes():
                pass
            ok = r.status_code == 200
    else:
        r = await c.post(url + "/v1/completions", json=body)
        ok = r.status_code == 200
    if not ok:
        raise SystemExit(f"request through {url} failed: {r.status_code}")
    return time.perf_counter() - t0


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    d: dict[str, Any] = load_demo_spec(
        tiny_model_dir(), ["fleet.name=bench-tokens"]
    ).spec.model_dump()
    d["render"] = [{"host": "127.0.0.1", "http_port": free_port()}]
    d["router"].update(path="tokens", disaggregate_min_tokens=args.threshold, port=free_port())
    spec = FleetSpec(**d)
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-bench-tokens-"))
    fleet = AsyncFleet(spec, ready_timeout=400, grace=5, with_router=False)
    await fleet.up()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        text_proc, text_url = start_router(spec, "text", tmp)
        tok_proc, tok_url = start_router(spec, "tokens", tmp)
        procs = [text_proc, tok_proc]
        await asyncio.gather(wait_up(text_url), wait_up(tok_url))
        render_pids = instance_pids(
            [i.record.shepherd_pid for n, i in fleet._instances.items() if n.startswith("render")]
        )
        ps = prompts(args.requests)
        lat: dict[str, list[float]] = {"text": [], "tokens": []}
        cpu: dict[str, float] = {"text": 0.0, "tokens": 0.0}
        render_cpu = 0.0
        async with httpx.AsyncClient(timeout=120) as c:
            for p in ps[:4]:  # warm-up, both paths
                await one(c, text_url, p, args.stream)
                await one(c, tok_url, p, args.stream)
            for p in ps:
                for name, url, proc in (
                    ("text", text_url, text_proc),
                    ("tokens", tok_url, tok_proc),
                ):
                    c0, r0 = cpu_seconds([proc.pid]), cpu_seconds(render_pids)
                    lat[name].append(await one(c, url, p, args.stream))
                    cpu[name] += cpu_seconds([proc.pid]) - c0
                    if name == "tokens":
                        render_cpu += cpu_seconds(render_pids) - r0
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        await fleet.down()
    n = args.requests

    def summary(name: str) -> dict[str, float]:
        xs = sorted(lat[name])
        return {
            "median_ms": round(statistics.median(xs) * 1000, 2),
            "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 2),
            "router_cpu_ms_per_request": round(cpu[name] / n * 1000, 3),
        }

    text, tokens = summary("text"), summary("tokens")
    tokens["render_cpu_ms_per_request"] = round(render_cpu / n * 1000, 3)
    return {
        "requests": n,
        "stream": args.stream,
        "threshold": args.threshold,
        "text": text,
        "tokens": tokens,
        "ratios_tokens_over_text": {
            "median_latency": round(tokens["median_ms"] / text["median_ms"], 3),
            "router_cpu_per_request": round(
                tokens["router_cpu_ms_per_request"] / max(text["router_cpu_ms_per_request"], 1e-6),
                3,
            ),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--threshold", type=int, default=0, help="router.disaggregate_min_tokens")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--out", default="tokens_path.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-bench-"))
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
