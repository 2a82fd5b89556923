"""Where disaggregation's extra TTFT goes, segment by segment, on a real vLLM-CPU 1P1D fleet.

For each arm (a set of spec overrides; the first is the baseline) the demo fleet is
started, and round by round, 1 request/s, one fresh streamed prompt goes through pdctl's
router in push mode and another straight to the decode instance, which then computes
the whole prompt itself (the single-instance baseline, measured in the same run on the
same cores). The router's flight recorder splits each push request's TTFT into segments;
the script prints, per arm, client TTFT p50 push vs single instance, the difference, and
the p50 of every segment — which of them is the prefill itself, which is NIXL's WRITE,
and which are the hand-offs around it — then per-segment ratios of each arm against the
baseline. A JSON record goes to ``--out``.

    python benchmarks/ttft_split.py [--rounds 20] [--prompt-words 127]
        [--arm NAME=KEY=VALUE,KEY=VALUE ...] [--out ttft_split.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import httpx
from _bench import greedy_body, write_record

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics.flight import segment_stats
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.router import flightrec as fr
from pdctl.sdk.urls import router_url

OWNER = {
    fr.ROUTER: "pdctl router",
    fr.HANDOFF: "vLLM: finished blocks reach the push writer with the next engine step",
    fr.WRITE: "NIXL/UCX (no progress thread: progresses when polled)",
    fr.NOTIFICATION: "UCX delivery + decode's push writer woken once per engine step",
    fr.PICKUP: "vLLM: decode's engine drains notifications once per step",
    fr.DECODE_SCHEDULE: "vLLM: the request is scheduled on the step after its KV arrived",
}
"""Who owns each disaggregation-only segment (the rest a single instance pays too)."""


def ttft_ms(c: httpx.Client, url: str, prompt: str) -> float:
    body = greedy_body(prompt, 4)
    t0 = time.perf_counter()
    with c.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for _ in r.iter_bytes():
            return (time.perf_counter() - t0) * 1000
    raise RuntimeError("empty answer")


def completion(c: httpx.Client, url: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = c.post(url + "/v1/completions", json=body)
    r.raise_for_status()
    return str(r.json()["choices"][0]["text"])


def prompt(n: int, words: int) -> str:
    return f"#{n} " + " ".join(DEMO_WORDS[(n * 7 + j) % len(DEMO_WORDS)] for j in range(words))


def run_arm(
    name: str, overrides: list[str], rounds: int, words: int, gap_s: float
) -> dict[str, Any]:
    spec = load_demo_spec(tiny_model_dir(), overrides).spec
    router = router_url(spec)
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        decode = next(i.url for i in fleet.fleet.plan.instances if i.role == "decode")
        push: list[float] = []
        single: list[float] = []
        with httpx.Client(timeout=120) as c:
            for i in range(2):  # warm-up: handshakes, first compiles
                ttft_ms(c, router, prompt(10_000 + i, words))
                ttft_ms(c, decode, prompt(20_000 + i, words))
            time.sleep(1.0)
            first = len(c.get(router + "/v1/pdctl/requests?limit=10000").json()["requests"])
            for i in range(rounds):
                t = time.monotonic()
                push.append(ttft_ms(c, router, prompt(i, words)))
                single.append(ttft_ms(c, decode, prompt(50_000 + i, words)))
                time.sleep(max(0.0, gap_s - (time.monotonic() - t)))
            same = [
                completion(c, router, prompt(90_000 + i, words))
                == completion(c, decode, prompt(90_000 + i, words))
                for i in range(3)
            ]
            time.sleep(1.0)
            deadline = time.monotonic() + 15
            while True:
                reqs = c.get(router + "/v1/pdctl/requests?limit=10000").json()["requests"]
                mine = reqs[: len(reqs) - first]
                if all(r["push"]["write_ms"] is not None for r in mine):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    split = segment_stats(mine)
    return {
        "arm": name,
        "overrides": overrides,
        "rounds": rounds,
        "outputs_match_single_instance": all(same),
        "client_ttft_p50_ms": {
            "push": statistics.median(push),
            "single": statistics.median(single),
        },
        "router_ttft_p50_ms": split.get("ttft", {}).get("p50_ms"),
        "segments": split,
        "prompt_tokens_p50": statistics.median(r["prompt_tokens"] or 0 for r in mine),
        "bytes_p50": statistics.median(r["push"]["bytes"] or 0 for r in mine),
    }


def report(rec: dict[str, Any]) -> None:
    c = rec["client_ttft_p50_ms"]
    extra = c["push"] - c["single"]
    seg = rec["segments"]
    print(
        f"\n[{rec['arm']}] {rec['rounds']} rounds, prompt p50 {rec['prompt_tokens_p50']:.0f} "
        f"tokens, {rec['bytes_p50']:.0f} B pushed per request"
    )
    print(
        f"  client TTFT p50: push {c['push']:.1f} ms, single instance {c['single']:.1f} ms "
        f"-> disaggregation costs {extra:+.1f} ms (ratio {c['push'] / c['single']:.2f})"
    )
    print(
        f"  greedy outputs equal to the single instance's: {rec['outputs_match_single_instance']}"
    )
    print(f"  router TTFT p50 {rec['router_ttft_p50_ms']} ms, split (p50 / p99 ms):")
    for name in fr.LEGEND:
        if name in seg and name != fr.STREAMING:
            s = seg[name]
            owner = f"  [{OWNER[name]}]" if name in OWNER else ""
            print(f"    {name:24s} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f}{owner}")
    only = sum(seg[n]["p50_ms"] for n in OWNER if n in seg)
    print(f"  disaggregation-only segments, sum of p50s: {only:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompt-words", type=int, default=127, help="≈ 256 tokens by default")
    ap.add_argument("--gap-s", type=float, default=1.0, help="seconds between rounds (1 req/s)")
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        help="NAME=OVERRIDE,OVERRIDE (spec overrides); the first arm is the baseline",
    )
    ap.add_argument("--out", default="ttft_split.json")
    args = ap.parse_args()
    arms: list[tuple[str, list[str]]] = [("default", [])]
    for a in args.arm:
        name, _, rest = a.partition("=")
        arms.append((name, [o for o in rest.split(",") if o]))
    records = [run_arm(n, o, args.rounds, args.prompt_words, args.gap_s) for n, o in arms]
    for rec in records:
        report(rec)
    base = records[0]["segments"]
    for rec in records[1:]:
        print(f"\n{rec['arm']} / {records[0]['arm']} (p50 ratio per segment):")
        for name, s in rec["segments"].items():
            b = base.get(name, {}).get("p50_ms")
            if b:
                print(f"    {name:24s} {s['p50_ms'] / b:6.2f}")
    write_record(args.out, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
