"""``pdctl metrics``: the fleet's derived metrics and alerts. ``--once``: one snapshot (the
one spelling of it: exit 1 when an alert is open); otherwise a stream (``-o json``: one
JSON snapshot per line; ``-o yaml``: one YAML document per snapshot; a live table
without ``-o``) until Ctrl-C or ``--count``."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from pdctl.cli.args import (
    Grammar,
    add_monitor_arguments,
    add_source_arguments,
    emit_record,
    human,
)
from pdctl.cli.common import console, load
from pdctl.cli.metricsview import make_monitor, print_snapshot

if TYPE_CHECKING:
    from pdctl.sdk.metrics.monitor import FleetMonitor
    from pdctl.sdk.plan.live import PlanWatch

GRAMMAR = Grammar()


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_monitor_arguments(p)
    add_source_arguments(p)
    p.add_argument(
        "--once",
        action="store_true",
        help="one snapshot from a single scrape, then exit (1 when an alert is open)",
    )
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


def _watch(args: argparse.Namespace) -> PlanWatch | None:
    if not args.plan_profile:
        return None
    from pdctl.sdk.plan.live import PlanWatch
    from pdctl.sdk.plan.profile import load_profile

    if not args.plan_isl or not args.plan_osl:
        raise SystemExit("pdctl metrics: --plan-profile needs --plan-isl N and --plan-osl N")
    return PlanWatch(load_profile(args.plan_profile), load(args).spec, args.plan_isl, args.plan_osl)


def run(args: argparse.Namespace) -> int:
    if args.once and not args.plan_profile:
        return print_snapshot(args)
    if args.once:
        args.count = 1
    watch = _watch(args)
    mon = make_monitor(args, args.interval)
    try:
        return asyncio.run(_stream(mon, args, watch))
    except KeyboardInterrupt:
        return 130


async def _stream(mon: FleetMonitor, args: argparse.Namespace, watch: PlanWatch | None) -> int:
    from pdctl.cli.metricsview import snapshot_doc, snapshot_view

    if not human(args):
        async for snap in mon.snapshots(args.count):
            doc = snapshot_doc(snap)
            if watch is not None:
                doc["plan"] = watch.check(snap)
            emit_record(args, doc)
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
