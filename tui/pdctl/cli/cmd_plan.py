"""``pdctl plan``: from a profile, a workload and its SLOs to a P:D layout.

Predicts TTFT/ITL/TPOT of colocated x k and every xPyD (push and pull) within the
budget, with prefill queueing at the rate and the KV transfer time of the measured (or
topology-derived) path; recommends the cheapest layout meeting the SLOs, says why each
other one loses, and writes the spec with ``--out`` (the old ``-o FILE`` still works, with
a note; ``-o`` names the format printed). Exit codes: 0 a layout meets the SLOs,
1 none does (the best effort is shown), 2 bad input.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from pdctl.cli.args import Grammar, emit
from pdctl.cli.common import console, load, spec_overrides

if TYPE_CHECKING:
    from pdctl.sdk.plan.planner import Plan


GRAMMAR = Grammar(out_path=True)
"""-f (with --set, --fleet, --backend): the base spec of --out, and the fleet of
--from-fleet."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="profile JSON written by pdctl profile")
    p.add_argument("--isl", required=True, help="prompt tokens: median, or MEDIAN,P95")
    p.add_argument("--osl", type=int, required=True, help="output tokens per request")
    p.add_argument(
        "--rate", type=float, help="requests per second (with --from-fleet: the live rate)"
    )
    p.add_argument("--ttft-slo", type=float, metavar="MS", help="TTFT SLO (milliseconds)")
    p.add_argument(
        "--itl-slo", type=float, metavar="MS", help="ITL SLO on each request's TPOT (ms)"
    )
    p.add_argument("--slo-pct", choices=("p50", "p90", "p99"), default="p90", help="SLO percentile")
    p.add_argument("--budget", type=int, required=True, help="GPUs (CPU: instances x TP)")
    p.add_argument("--topology", help="nvidia-smi topo -m text for the P->D path (preflight)")
    p.add_argument("--gpu-name", help="GPU product name for --topology (default: the profile's)")
    p.add_argument("--kv-gbps", type=float, help="KV path bandwidth in GB/s (overrides)")
    p.add_argument(
        "--modes", default="colocated,push,pull", help="comma list (default %(default)s)"
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the recommended layout as a spec TOML (base: -f, else the spec profiled)",
    )
    p.add_argument(
        "--from-fleet",
        action="store_true",
        help="read the running fleet of -f (rate, TTFT, ITL): re-plan at the live rate with "
        "every prediction scaled by the correction factors observed/predicted for its "
        "current layout",
    )
    p.add_argument("--window", type=float, default=10.0, help="--from-fleet: seconds observed")


def _isl(text: str) -> tuple[int, int | None]:
    try:
        parts = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"pdctl plan: --isl {text!r}: give N or N,P95 (tokens)") from None
    if not parts or len(parts) > 2 or min(parts) < 1:
        raise SystemExit(f"pdctl plan: --isl {text!r}: give N or N,P95 (positive tokens)")
    return parts[0], parts[1] if len(parts) == 2 else None


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.plan import Slos, Workload, load_profile, make_plan, transfers

    profile = load_profile(args.profile)
    isl, p95 = _isl(args.isl)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ("colocated", "push", "pull")]
    if bad:
        raise SystemExit(f"pdctl plan: --modes {','.join(bad)}: use colocated, push, pull")
    tr = transfers(
        profile,
        isl,
        topology=args.topology,
        gpu_name=args.gpu_name,
        kv_bps=args.kv_gbps * 1e9 if args.kv_gbps else None,
    )
    slos = Slos(
        ttft_s=args.ttft_slo / 1e3 if args.ttft_slo else None,
        tpot_s=args.itl_slo / 1e3 if args.itl_slo else None,
        pct=args.slo_pct,
    )
    live = _live(args) if args.from_fleet else None
    rate = args.rate or (live[1].rate if live else None)
    if not rate:
        raise SystemExit("pdctl plan: give --rate R (requests per second) or --from-fleet")
    plan = make_plan(profile, Workload(isl, args.osl, rate, p95), slos, args.budget, tr, modes)
    corr = None
    if live is not None:
        from pdctl.sdk.plan.live import correction_of, corrections, layout_of

        current = layout_of(live[0])
        at_live = plan
        if rate != live[1].rate:  # the factors are measured at the live rate
            work = Workload(isl, args.osl, live[1].rate, p95)
            at_live = make_plan(profile, work, slos, args.budget, tr, modes)
        corr = corrections(at_live, current, live[1])
        factors = correction_of(at_live, current, live[1])
        if factors is not None and (factors.ttft is not None or factors.itl is not None):
            work = Workload(isl, args.osl, rate, p95)
            plan = make_plan(profile, work, slos, args.budget, tr, modes, correction=factors)
    written = _write_spec(args, profile.spec_source, plan) if args.out else None
    out = plan.as_dict()
    out["spec_written"] = written
    if corr is not None:
        out["live"] = corr
    if not emit(args, out):
        if corr is not None:
            console().print(f"live: {corr}")
        _print(plan, written)
    return 0 if plan.best.meets else 1


def _live(args: argparse.Namespace) -> tuple[Any, Any]:
    import asyncio

    from pdctl.sdk.fleetplan import build_plan
    from pdctl.sdk.metrics.monitor import FleetMonitor
    from pdctl.sdk.plan.live import live_figures

    spec = load(args).spec

    async def observe() -> Any:
        mon = FleetMonitor.for_fleet(spec, build_plan(spec), window_s=args.window + 5)
        await mon.poll()
        await asyncio.sleep(args.window)
        return await mon.poll()

    return spec, live_figures(asyncio.run(observe()))


def _write_spec(args: argparse.Namespace, source: str | None, plan: Plan) -> str:
    from pathlib import Path

    from pdctl.sdk.errors import PdctlError
    from pdctl.sdk.plan.specout import spec_for_layout, to_toml
    from pdctl.sdk.specload import load_spec

    base = args.file or source
    if not base or base.startswith("<"):
        raise PdctlError(
            "--out needs a base spec: pass -f SPEC (the profile does not name a spec file)"
        )
    spec = spec_for_layout(load_spec(base, spec_overrides(args)).spec, plan.best.layout)
    header = f"pdctl plan: {plan.summary}\nprofile: {plan.profile}"
    Path(args.out).write_text(to_toml(spec, header), encoding="utf-8")
    return str(args.out)


def _f(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isinf(v)):
        return "∞"
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def _print(plan: Plan, written: str | None) -> None:
    from rich.table import Table

    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 160)
    out.print(f"[bold]{plan.profile}[/]")
    w = plan.workload
    out.print(
        f"workload: ISL {w.isl}{f' (p95 {w.isl_p95})' if w.isl_p95 else ''}, OSL {w.osl}, "
        f"{w.rate:g} req/s; budget {plan.budget} GPUs; SLOs at {plan.slos.pct}"
    )
    if plan.transfer is not None:
        t = plan.transfer
        out.print(
            f"KV path: {t.path}, {t.bps / 1e9:.3g} GB/s → {t.seconds(w.isl) * 1e3:.1f} ms at "
            f"ISL ({t.source})"
        )
    table = Table(title="candidates (ms)")
    for col in ("layout", "GPUs", "TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "TPOT p90"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    table.add_column("goodput", justify="right")
    table.add_column("why")
    for c in plan.candidates:
        d = c.as_dict()
        style = "bold green" if c is plan.best else None
        table.add_row(
            d["layout"],
            str(d["gpus"]),
            _f(d["ttft_ms"]["p50"]),
            _f(d["ttft_ms"]["p90"]),
            _f(d["itl_ms"]["p50"]),
            _f(d["itl_ms"]["p90"]),
            _f(d["tpot_ms"]["p90"]),
            f"{c.goodput:.2f}",
            c.why,
            style=style,
        )
    out.print(table)
    out.print(f"[bold]{plan.summary}[/]")
    for a in plan.assumptions:
        out.print(f"[dim]assumed: {a}[/]")
    if written:
        out.print(f"spec written to {written}")
