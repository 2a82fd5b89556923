"""``pdctl bench``: the same-budget A/B of push, push-sequential, pull and colocated.

Starts the fleet in each mode from one spec (same instances, devices, cores), sweeps
input lengths x request rates through the router with streaming requests, and writes
``bench.json`` (one record per cell, ``vllm bench serve``-style fields), ``bench.csv``
and ``bench.png`` (TTFT and TPOT against rate, one line per mode, one panel per input
length) into ``--out``; prints a table with the ratios between modes.

Without ``-f`` and without ``./pdctl.toml`` it runs on the embedded CPU demo fleet
(building the tiny model if needed). Exit codes: 0 all requests succeeded and the
sampled outputs matched; 1 some failed or mismatched; 2 invalid arguments or spec.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdctl.cli.args import Grammar, emit, human
from pdctl.cli.common import console, progress_bars
from pdctl.cli.tinymodel import spec_or_demo
from pdctl.sdk.bench import report

if TYPE_CHECKING:
    from pdctl.sdk.bench.plan import BenchPlan
    from pdctl.sdk.spec import FleetSpec


GRAMMAR = Grammar(
    backends=("local",),
    backend_why="bench starts its fleets on this machine",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        choices=("cpu-smoke", "paper", "shared-prefix", "overload"),
        default=None,
        help="cpu-smoke: minutes on the local CPU demo fleet; shared-prefix: router "
        "policies on prompts sharing prefixes; paper: the published grid "
        "(1k-16k input, 1-8 req/s, 128 output, push vs pull) for GPU fleets; overload: "
        "--load x the fleet's capacity with priority classes and SLOs, through a router "
        "with admission and one without, alternating (--duration, --rounds)",
    )
    p.add_argument("--load", type=float, help="overload: offered load x capacity (default 4)")
    p.add_argument("--rounds", type=int, help="overload: rounds of both arms (default 1)")
    p.add_argument("--modes", help="comma list of push,push-sequential,pull,colocated")
    p.add_argument("--input-lens", help="comma list of prompt lengths in tokens")
    p.add_argument("--rates", help="comma list of request rates (req/s; 'inf' = all at once)")
    p.add_argument("--output-len", type=int, help="output tokens per request")
    p.add_argument("--duration", type=float, help="seconds of arrivals per cell")
    p.add_argument("--max-requests", type=int, help="cap on requests per cell")
    p.add_argument("--warmup", type=int, help="unmeasured requests before each cell")
    p.add_argument("--burstiness", type=float, help="gamma shape of arrivals (1 = Poisson)")
    p.add_argument("--concurrency", type=int, help="closed loop with N in flight (no rates)")
    p.add_argument("--slo", help="goodput SLO, e.g. ttft:500,tpot:50 (milliseconds)")
    p.add_argument("--verify", type=int, help="outputs per cell checked against one instance")
    p.add_argument("--dataset", help="JSON-lines prompts instead of synthetic ones")
    p.add_argument("--seed", type=int, help="random seed (arrivals and prompts)")
    p.add_argument("--out", default="pdctl-bench", help="output directory (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its duration")
    p.add_argument(
        "--api-key",
        default=os.environ.get("PDCTL_API_KEY"),
        help="the router key the load carries (default $PDCTL_API_KEY, else the spec's first "
        "readable inference key; prefer the variable: a command line is visible in ps)",
    )


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"pdctl bench: {what}: {text!r} is not a comma list of numbers") from None


def build_plan(args: argparse.Namespace) -> BenchPlan:
    from pdctl.sdk.bench.plan import PRESETS, BenchPlan
    from pdctl.sdk.bench.stats import Slo

    plan = PRESETS[args.preset] if args.preset else BenchPlan()
    kw: dict[str, Any] = {}
    if args.modes:
        kw["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if args.input_lens:
        kw["input_lens"] = tuple(int(x) for x in _floats(args.input_lens, "--input-lens"))
    if args.rates:
        kw["rates"] = _floats(args.rates, "--rates")
    for arg, field in (
        ("output_len", "output_len"),
        ("duration", "cell_duration_s"),
        ("max_requests", "max_requests"),
        ("warmup", "warmup"),
        ("burstiness", "burstiness"),
        ("concurrency", "concurrency"),
        ("verify", "verify"),
        ("seed", "seed"),
    ):
        if getattr(args, arg) is not None:
            kw[field] = getattr(args, arg)
    try:
        if args.slo:
            kw["slo"] = Slo.parse(args.slo)
    except ValueError as e:
        raise SystemExit(f"pdctl bench: {e}") from None
    return plan.with_(**kw) if kw else plan


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.{nd}f}"
    return str(v)


def table(records: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    t = Table(
        title="pdctl bench (ms; same = sampled outputs equal to one instance's own)",
        header_style="bold",
    )
    cols = [
        "mode",
        "in",
        "rate",
        "ok/err",
        "same",
        "req/s",
        "TTFT50",
        "TTFT99",
        "TPOT50",
        "ITL99",
        "KV MB",
        "reg1st",
    ]
    # the shared-prefix preset compares router policies: name them, with their hit rates
    policies = report.compares_policies(records)
    if policies:
        cols[1:1] = ["policy"]
        cols += ["hit P", "hit all", "D alone"]
    for col in cols:
        left = col in ("mode", "policy")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
    for r in records:
        bad = (r.get("mismatched") or 0) + (r.get("wrong_length") or 0)
        extra = [
            _fmt(r.get("prefill_prefix_hit_rate"), 2),
            _fmt(r.get("fleet_prefix_hit_rate"), 2),
            _fmt(r.get("decode_alone_share"), 2),
        ]
        t.add_row(
            r["mode"],
            *([str(r.get("policy"))] if policies else []),
            str(r["input_len"]),
            str(r["request_rate"]),
            f"{r['completed']}/{r['failed']}",
            f"{r.get('verified', 0) - bad}/{r.get('verified', 0)}",
            _fmt(r.get("request_throughput"), 2),
            _fmt(r.get("median_ttft_ms")),
            _fmt(r.get("p99_ttft_ms")),
            _fmt(r.get("median_tpot_ms")),
            _fmt(r.get("p99_itl_ms")),
            _fmt((r.get("kv_bytes_moved") or 0) / 1e6, 2),
            _fmt(r.get("registration_first_ratio"), 2),
            *(extra if policies else []),
        )
    return t


def ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median-TTFT ratio of every arm to the first, cell by cell; an arm is a mode, or a
    mode and a router policy when the records compare policies."""
    if not records:
        return []
    arm = report.arm_of(records)
    first = arm(records[0])

    def cell(r: dict[str, Any]) -> tuple[Any, str]:
        return r["input_len"], str(r["request_rate"])

    base = {cell(r): r for r in records if arm(r) == first}
    out = []
    for r in records:
        b = base.get(cell(r))
        if arm(r) == first or b is None:
            continue
        if r.get("median_ttft_ms") and b.get("median_ttft_ms"):
            out.append(
                {
                    "mode": arm(r),
                    "vs": first,
                    "input_len": r["input_len"],
                    "request_rate": r["request_rate"],
                    "median_ttft_ratio": r["median_ttft_ms"] / b["median_ttft_ms"],
                }
            )
    return out


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.bench.loadgen import BenchError

    if args.preset == "overload":
        from pdctl.cli import benchoverload

        spec, source = spec_or_demo(args)
        if args.dry_run:
            plan = benchoverload.plan_of(args)
            if not emit(args, {"plan": plan.as_dict(), "spec": source}):
                console().print(f"[bold]pdctl bench --preset overload[/] on {source}: {plan}")
            return 0
        return benchoverload.run(args, spec, source)
    try:
        plan = build_plan(args)
    except BenchError as e:
        raise SystemExit(f"pdctl bench: {e}") from None
    spec, source = spec_or_demo(args)
    if args.dry_run:
        return _dry_run(plan, spec, source, args)
    return asyncio.run(_run(plan, spec, source, args))


def _dry_run(plan: BenchPlan, spec: FleetSpec, source: str, args: argparse.Namespace) -> int:
    cells = plan.cells()
    est = plan.estimate_s()
    if emit(
        args,
        {
            "plan": plan.as_dict(),
            "spec": source,
            "cells": [
                {
                    "mode": c.mode,
                    "input_len": c.input_len,
                    "rate": _fmt(c.rate, 2),
                    "requests": plan.requests_in(c),
                }
                for c in cells
            ],
            "fleet_starts": plan.fleet_modes,
            "estimated_s": round(est),
        },
    ):
        return 0
    out = console()
    out.print(f"[bold]pdctl bench[/] on {source}: {len(cells)} cells, fleets {plan.fleet_modes}")
    for c in cells:
        out.print(
            f"  {c.mode:16} input {c.input_len:6}  rate {_fmt(c.rate, 2):>5}  "
            f"{plan.requests_in(c)} requests (+{plan.warmup} warm-up, {plan.verify} checked)"
            + (f"  policy {c.policy}" if c.policy else "")
        )
    out.print(f"expected duration: about {est / 60:.1f} min (fleet starts assumed 60 s)")
    return 0


async def _run(plan: BenchPlan, spec: FleetSpec, source: str, args: argparse.Namespace) -> int:

    from pdctl.sdk.bench.suite import BenchSuite
    from pdctl.sdk.bench.suite import Progress as Hooks

    out_dir = Path(args.out)
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    err = console(stderr=True)
    started = time.time()
    with progress_bars(err, not human(args)) as bar:
        total = bar.add_task("cells", total=len(plan.cells()))
        cell_task: list[Any] = [None]

        def cell_start(cell: Any, n: int) -> None:
            desc = f"{cell.mode} in={cell.input_len} rate={_fmt(cell.rate, 2)}"
            if cell_task[0] is not None:
                bar.remove_task(cell_task[0])
            cell_task[0] = bar.add_task(desc, total=n + plan.warmup)

        def request_done(_: Any) -> None:
            if cell_task[0] is not None:
                bar.advance(cell_task[0])

        hooks = Hooks(
            on_phase=lambda msg: err.print(f"[dim]{msg}[/]"),
            on_cell_start=cell_start,
            on_request=request_done,
            on_cell_done=lambda rec: bar.advance(total),
        )
        suite = BenchSuite(
            spec, plan, dataset=args.dataset, progress=hooks, api_key=args.api_key or None
        )
        records = await suite.run()
    meta = {
        "spec": source,
        "fleet": spec.fleet.name,
        "started": started,
        "wall_s": time.time() - started,
    }
    report.write_json(out_dir / "bench.json", plan, records, meta)
    report.write_csv(out_dir / "bench.csv", records)
    png = report.plot(
        out_dir / "bench.png", records, title=f"pdctl bench: {spec.model.effective_served_name}"
    )
    rs = ratios(records)
    if not emit(args, {"results": records, "ratios": rs, "out": str(out_dir)}):
        out = console()
        if not out.is_terminal:
            out.width = max(out.width, 170)
        out.print(table(records))
        for r in rs:
            out.print(
                f"median TTFT {r['mode']} / {r['vs']} at input {r['input_len']}, rate "
                f"{r['request_rate']}: [bold]{r['median_ttft_ratio']:.2f}[/]"
            )
        out.print(
            f"wrote {out_dir}/bench.json, bench.csv"
            + (", bench.png" if png else " (no matplotlib: no plot)")
        )
    bad = sum(
        (r.get("failed") or 0) + (r.get("mismatched") or 0) + (r.get("wrong_length") or 0)
        for r in records
    )
    return 1 if bad else 0
