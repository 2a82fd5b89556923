"""``pdctl metrics``: the fleet metrics stream (NDJSON with --json, a live table without)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from pdctl.cli.common import add_spec_arguments, console, load

if TYPE_CHECKING:
    from pdctl.sdk.metrics.monitor import FleetMonitor
    from pdctl.sdk.plan.live import PlanWatch


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--window",
        type=float,
        default=60.0,
        help="sliding window for rates and quantiles, seconds (default 60)",
    )
    p.add_argument("--timeout", type=float, default=2.0, help="per-target scrape timeout (s)")
    p.add_argument(
        "--expect-gbps",
        type=float,
        default=None,
        help="expected KV transfer throughput (e.g. from preflight), GB/s",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)
    add_monitor_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON snapshot per line (NDJSON)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots")
    p.add_argument("--count", type=int, default=None, help="stop after this many snapshots")
    p.add_argument(
        "--plan-profile",
        metavar="P",
        help="a pdctl profile: add the planner's correction factors (observed/predicted "
        "TTFT and ITL p50 of the current layout at the live rate) to every snapshot",
    )
    p.add_argument("--plan-isl", type=int, default=None, help="with --plan-profile: ISL")
    p.add_argument("--plan-osl", type=int, default=None, help="with --plan-profile: OSL")


def make_monitor(args: argparse.Namespace, interval: float = 1.0) -> FleetMonitor:
    from pdctl.sdk.backends import observed
    from pdctl.sdk.metrics.monitor import FleetMonitor

    spec, plan = observed(load(args).spec)
    return FleetMonitor.for_fleet(
        spec,
        plan,
        interval_s=interval,
        timeout_s=args.timeout,
        window_s=args.window,
        expected_throughput_bps=args.expect_gbps * 1e9 if args.expect_gbps else None,
    )


def _watch(args: argparse.Namespace) -> PlanWatch | None:
    if not args.plan_profile:
        return None
    from pdctl.sdk.plan.live import PlanWatch
    from pdctl.sdk.plan.profile import load_profile

    if not args.plan_isl or not args.plan_osl:
        raise SystemExit("pdctl metrics: --plan-profile needs --plan-isl N and --plan-osl N")
    return PlanWatch(load_profile(args.plan_profile), load(args).spec, args.plan_isl, args.plan_osl)


def run(args: argparse.Namespace) -> int:
    watch = _watch(args)
    mon = make_monitor(args, args.interval)
    try:
        return asyncio.run(_stream(mon, args, watch))
    except KeyboardInterrupt:
        return 130


async def _stream(mon: FleetMonitor, args: argparse.Namespace, watch: PlanWatch | None) -> int:
    from pdctl.cli.metricsview import snapshot_view

    if args.json:
        async for snap in mon.snapshots(args.count):
            doc = snap.as_dict()
            if watch is not None:
                doc["plan"] = watch.check(snap)
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()
        return 0
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    out = console()
    with Live(console=out, refresh_per_second=2) as live:
        async for snap in mon.snapshots(args.count):
            view = snapshot_view(snap)
            if watch is not None:
                view = Group(view, Text(f"plan: {watch.check(snap)}"))
            live.update(view)
    return 0
