"""Does the bottleneck verdict name the bottleneck we inject? On a real vLLM-CPU 1P1D push
fleet (the demo spec), trial after trial:

* ``prefill``: a burst of long prompts (``--burst`` at once, one token each) saturates
  prefill;
* ``decode``: long generations (``--gens`` streams of ``--gen-tokens``, back to back until
  the probes are through) keep decode busy;
* ``transfer``: the connector's write-delay failpoint holds every WRITE ``--delay-ms``
  (switched on by a file, so one fleet serves every kind);
* ``baseline``: probes alone (what the verdict says with nothing injected).

Each trial sends its load plus ``--probes`` streamed probes through pdctl's router, reads
the flight recorder's timelines of that trial's requests and asks
:func:`pdctl.sdk.router.bottleneck.verdict` for the prefill-0 → decode-0 pair. Printed:
per kind, how many trials named the injected group (goal ≥ 9 of 10), the segment and
share of each, and the TTFT p50 of the probes against the baseline's (ratio, medians of
trials). A JSON record goes to ``--out``.

    PDCTL_ALLOW_FAILPOINTS=1 python benchmarks/bottleneck_verdict.py [--trials 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from _bench import greedy_body, write_record

from pdctl.cli.cmd_demo import DEMO_WORDS
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import tiny_model_dir
from pdctl.sdk.router.bottleneck import verdict
from pdctl.sdk.urls import router_url

KINDS = ("baseline", "prefill", "decode", "transfer")


def words(n: int, tag: str) -> str:
    """A prompt of ``n`` words, unique per ``tag`` (no prefix cache hit between them)."""
    seed = sum(map(ord, tag))
    return f"{tag} " + " ".join(DEMO_WORDS[(seed + j * 7) % len(DEMO_WORDS)] for j in range(n))


def stream(c: httpx.Client, url: str, prompt: str, max_tokens: int) -> float | None:
    body = greedy_body(prompt, max_tokens)
    t0 = time.perf_counter()
    try:
        with c.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return None
            first = None
            for _ in r.iter_bytes():
                first = first or (time.perf_counter() - t0) * 1000
            return first
    except httpx.HTTPError:
        return None


def in_threads(n: int, fn: Any) -> list[threading.Thread]:
    ts = [threading.Thread(target=fn, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    return ts


def trial(kind: str, n: int, url: str, args: argparse.Namespace, switch: Path) -> dict[str, Any]:
    tag = f"bn-{kind}-{n}-{time.monotonic_ns()}"
    probes: list[float] = []
    with httpx.Client(timeout=300) as c:
        before = {r["id"] for r in c.get(url + "/v1/pdctl/requests?limit=10000").json()["requests"]}
        load: list[threading.Thread] = []
        if kind == "transfer":
            switch.write_text("on")
        probes_done = threading.Event()
        if kind == "decode":

            def generate(i: int) -> None:
                # back to back until the probes are through: a fixed number of
                # generations can end before the probes start on a fast decode
                with httpx.Client(timeout=300) as g:
                    k = 0
                    while not probes_done.is_set():
                        stream(g, url, words(20, f"{tag}-g{i}-{k}"), args.gen_tokens)
                        k += 1

            load = in_threads(args.gens, generate)
            time.sleep(args.settle_s)
        if kind == "prefill":

            def burst(i: int) -> None:
                with httpx.Client(timeout=300) as b:
                    stream(b, url, words(args.burst_words, f"{tag}-b{i}"), 1)

            load = in_threads(args.burst, burst)
        probing = time.time()
        try:
            for i in range(args.probes):
                ttft = stream(c, url, words(args.probe_words, f"{tag}-p{i}"), 4)
                if ttft is not None:
                    probes.append(ttft)
        finally:
            probes_done.set()
            switch.unlink(missing_ok=True)
        for th in load:
            th.join(300)
        time.sleep(1.5)  # the instances' flight records reach /metrics
        deadline = time.monotonic() + 15
        while True:
            reqs = c.get(url + "/v1/pdctl/requests?limit=10000").json()["requests"]
            # the probes' window: what was sent once the injected load was under way
            mine = [r for r in reqs if r["id"] not in before and r["received"] >= probing]
            done = [r for r in mine if r.get("outcome") == "ok"]
            if all(r.get("push", {}).get("write_ms") is not None for r in done):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    v = verdict("prefill-0", "decode-0", mine)
    return {
        "kind": kind,
        "trial": n,
        "requests": len(mine),
        "named": v.bottleneck,
        "segment": v.segment,
        "share": v.share,
        "shares": v.shares,
        "advice": v.advice,
        "probe_ttft_p50_ms": statistics.median(probes) if probes else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--probes", type=int, default=6)
    ap.add_argument("--probe-words", type=int, default=40)
    ap.add_argument("--burst", type=int, default=12)
    ap.add_argument("--burst-words", type=int, default=400)
    ap.add_argument("--gens", type=int, default=12)
    ap.add_argument("--gen-tokens", type=int, default=300)
    ap.add_argument("--settle-s", type=float, default=2.0)
    ap.add_argument("--delay-ms", type=int, default=300)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", default="bottleneck_verdict.json")
    args = ap.parse_args()
    if os.environ.get("PDCTL_ALLOW_FAILPOINTS") != "1":
        raise SystemExit("set PDCTL_ALLOW_FAILPOINTS=1 (the transfer kind uses a failpoint)")
    switch = Path(tempfile.mkdtemp()) / "slow-writes"
    spec = load_demo_spec(tiny_model_dir(), []).spec
    spec.fleet.connector_options["pdctl_failpoint_write_delay"] = f"{args.delay_ms}:while:{switch}"
    url = router_url(spec)
    kinds = [k for k in args.kinds.split(",") if k]
    records: list[dict[str, Any]] = []
    with Fleet(spec, ready_timeout=400, grace=5) as _fleet, httpx.Client(timeout=300) as c:
        for i in range(3):  # warm-up: handshakes, first compiles
            stream(c, url, words(args.probe_words, f"warm-{i}"), 4)
        for n in range(args.trials):
            for kind in kinds:  # interleaved: a drift hits every kind alike
                rec = trial(kind, n, url, args, switch)
                records.append(rec)
                share = "-" if rec["share"] is None else f"{rec['share']:.0%}"
                print(
                    f"trial {n} {kind:9s} named {rec['named']!s:9s} {rec['segment']!s:24s} "
                    f"{share:>5s}  probe TTFT p50 {rec['probe_ttft_p50_ms']}",
                    flush=True,
                )
    base = [
        r["probe_ttft_p50_ms"]
        for r in records
        if r["kind"] == "baseline" and r["probe_ttft_p50_ms"]
    ]
    print()
    for kind in kinds:
        mine = [r for r in records if r["kind"] == kind]
        hits = sum(r["named"] == kind for r in mine)
        t = [r["probe_ttft_p50_ms"] for r in mine if r["probe_ttft_p50_ms"]]
        ratio = statistics.median(t) / statistics.median(base) if t and base else None
        named = sorted({str(r["named"]) for r in mine})
        goal = "" if kind == "baseline" else f"  named {hits}/{len(mine)} (goal >= 9/10)"
        print(
            f"{kind:9s}{goal}  verdicts: {', '.join(named)}  probe TTFT p50 x"
            f"{'-' if ratio is None else f'{ratio:.2f}'} of baseline"
        )
    write_record(args.out, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
