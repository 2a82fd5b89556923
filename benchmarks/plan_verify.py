"""Does `pdctl plan` predict what `pdctl bench` measures, and pick the best layout?

For each workload: `pdctl plan` on the profile (budget 2: colocated x1, colocated x2,
1P1D push, 1P1D pull), then every one of those layouts is started from the spec and
measured with bench's load generator and statistics (same prompts, Poisson arrivals at
the workload's rate, SLO goodput as `pdctl bench --slo` counts it). Prints predicted /
measured TTFT p50 and ITL p50 per layout, and whether the recommended layout has the
best measured goodput; writes a JSON record.

    flock /tmp/pdctl-fleet.lock python benchmarks/plan_verify.py --profile P [-f SPEC]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.sdk.bench.arrivals import arrival_offsets
from pdctl.sdk.bench.loadgen import Prompt, run_cell, synthetic_prompts
from pdctl.sdk.bench.stats import Slo, summarize
from pdctl.sdk.fleet import AsyncFleet
from pdctl.sdk.modelinfo import read_model_info, text_config
from pdctl.sdk.plan import Layout, Slos, Workload, fit, load_profile, make_plan, transfers
from pdctl.sdk.plan.specout import spec_for_layout
from pdctl.sdk.specload import load_spec
from pdctl.sdk.urls import router_url

DEMO = Path(__file__).resolve().parent.parent / "sdk" / "pdctl" / "sdk" / "data" / "demo.toml"
LAYOUTS = (
    Layout("colocated", 1),
    Layout("colocated", 2),
    Layout("push", 1, 1),
    Layout("pull", 1, 1),
)


@dataclass(frozen=True)
class Case:
    name: str
    work: Workload
    slos: Slos


SHAPES = (
    ("short prompts / long outputs", Workload(32, 160, 1.0)),
    ("long prompts / short outputs", Workload(768, 12, 1.0)),
    ("mixed", Workload(192, 48, 1.0, isl_p95=640)),
)


def cases(prof: Any, load: float) -> list[Case]:
    """Each shape at a rate that keeps one instance ``load`` busy (prefill + decode time
    per request x rate), with SLOs from the profile's own fits: TTFT 3 x prefill(ISL) +
    50 ms, TPOT 2 x the batch-1 step at that context."""
    curves = fit(prof)
    out = []
    for name, w in SHAPES:
        busy = curves.prefill_s(w.isl) + (w.osl - 1) * curves.step_s(1, w.isl + w.osl / 2)
        rate = round(load / busy, 2)
        slos = Slos(3 * curves.prefill_s(w.isl) + 0.05, 2 * curves.step_s(1, w.isl + w.osl / 2))
        out.append(Case(name, Workload(w.isl, w.osl, rate, w.isl_p95), slos))
    return out


def prompts_for(w: Workload, n: int, vocab: int, first: int) -> list[Prompt]:
    rng = random.Random(first)
    lens = w.lengths()
    out: list[Prompt] = []
    for i in range(n):
        length = max(2, round(rng.choice(lens))) if w.isl_p95 else w.isl
        out += synthetic_prompts(1, length, vocab, seed=first + i, first_index=first + i)
    return out


async def measure(spec: Any, layout: Layout, items: list[Case], n: int, vocab: int) -> list[Any]:
    s = spec_for_layout(spec, layout)
    s = s.model_copy(update={"fleet": s.fleet.model_copy(update={"name": "planverify"})})
    fleet = AsyncFleet(s, ready_timeout=600.0)
    t0 = time.monotonic()
    await fleet.up()
    print(f"  {layout.name}: ready in {time.monotonic() - t0:.0f} s", flush=True)
    out = []
    try:
        url = router_url(s)
        for k, case in enumerate(items):
            prompts = prompts_for(case.work, n + 2, vocab, 1000 * k + 17)
            offsets = arrival_offsets(case.work.rate, len(prompts), burstiness=1.0, seed=k)
            run = await run_cell(
                url,
                s.model.effective_served_name,
                prompts,
                case.work.osl,
                offsets=offsets,
                warmup=2,
                max_duration_s=300,
            )
            slo = Slo(case.slos.ttft_s * 1e3, case.slos.tpot_s * 1e3)  # type: ignore[operator]
            out.append(summarize(run.results, run.duration_s, slo))
    finally:
        await fleet.down()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("-f", "--file", default=str(DEMO))
    ap.add_argument("--requests", type=int, default=24, help="measured requests per cell")
    ap.add_argument("--load", type=float, default=0.6, help="busy share of one instance")
    ap.add_argument("--out", default="plan-verify.json")
    ap.add_argument("--dry-run", action="store_true", help="plan only, start nothing")
    args = ap.parse_args()
    prof = load_profile(args.profile)
    spec = load_spec(args.file).spec
    info = read_model_info(spec.model.path)
    vocab = int(text_config(info.raw)["vocab_size"]) if info else 0
    items = cases(prof, args.load)
    plans = []
    for case in items:
        tr = transfers(prof, case.work.isl)
        plans.append(make_plan(prof, case.work, case.slos, 2, tr))
        print(
            f"{case.name}: ISL {case.work.isl} OSL {case.work.osl} {case.work.rate} req/s, "
            f"SLO TTFT {case.slos.ttft_s * 1e3:.0f} ms TPOT {case.slos.tpot_s * 1e3:.1f} ms: "  # type: ignore[operator]
            f"{plans[-1].summary}",
            flush=True,
        )
    if args.dry_run:
        return 0
    measured: dict[str, list[Any]] = {}
    for lay in LAYOUTS:
        measured[lay.name] = asyncio.run(measure(spec, lay, items, args.requests, vocab))
    record: list[dict[str, Any]] = []
    for k, (case, plan) in enumerate(zip(items, plans, strict=True)):
        print(f"\n{case.name} (ISL {case.work.isl}, OSL {case.work.osl}, {case.work.rate} req/s)")
        best_measured = max(LAYOUTS, key=lambda lay: measured[lay.name][k].get("goodput") or 0)
        for cand in plan.candidates:
            m = measured[cand.layout.name][k]
            row = {
                "workload": case.name,
                "layout": cand.layout.name,
                "recommended": cand is plan.best,
                "pred_ttft_p50_ms": cand.pred.ttft_s["p50"] * 1e3,
                "meas_ttft_p50_ms": m["median_ttft_ms"],
                "pred_itl_p50_ms": cand.pred.itl_s["p50"] * 1e3,
                "meas_itl_p50_ms": m["median_itl_ms"],
                "pred_goodput": cand.goodput,
                "meas_goodput": m.get("goodput"),
                "failed": m["failed"],
            }
            record.append(row)
            r_t = _ratio(row["pred_ttft_p50_ms"], row["meas_ttft_p50_ms"])
            r_i = _ratio(row["pred_itl_p50_ms"], row["meas_itl_p50_ms"])
            print(
                f"  {'*' if cand is plan.best else ' '} {cand.layout.name:13} TTFT p50 "
                f"pred {row['pred_ttft_p50_ms']:7.1f} meas {_f(row['meas_ttft_p50_ms'])} "
                f"ratio {r_t}  ITL p50 pred {row['pred_itl_p50_ms']:6.1f} meas "
                f"{_f(row['meas_itl_p50_ms'])} ratio {r_i}  goodput pred "
                f"{cand.goodput:.2f} meas {_f(m.get('goodput'), 2)}"
            )
        print(f"  recommended {plan.best.layout.name}; best measured goodput {best_measured.name}")
    meta = [
        {
            "workload": c.name,
            "isl": c.work.isl,
            "isl_p95": c.work.isl_p95,
            "osl": c.work.osl,
            "rate": c.work.rate,
            "ttft_slo_ms": (c.slos.ttft_s or 0) * 1e3,
            "tpot_slo_ms": (c.slos.tpot_s or 0) * 1e3,
            "recommended": p.best.layout.name,
        }
        for c, p in zip(items, plans, strict=True)
    ]
    doc = {"profile": prof.tag(), "cases": meta, "rows": record}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


def _ratio(p: float, m: float | None) -> str:
    return "-" if not m or math.isinf(p) else f"{p / m:.2f}"


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:7.{nd}f}"


if __name__ == "__main__":
    sys.exit(main())
