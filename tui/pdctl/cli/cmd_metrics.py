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


def run(args: argparse.Namespace) -> int:
    mon = make_monitor(args, args.interval)
    try:
        return asyncio.run(_stream(mon, args))
    except KeyboardInterrupt:
        return 130


async def _stream(mon: FleetMonitor, args: argparse.Namespace) -> int:
    from pdctl.cli.metricsview import snapshot_view

    if args.json:
        async for snap in mon.snapshots(args.count):
            sys.stdout.write(json.dumps(snap.as_dict()) + "\n")
            sys.stdout.flush()
        return 0
    from rich.live import Live

    out = console()
    with Live(console=out, refresh_per_second=2) as live:
        async for snap in mon.snapshots(args.count):
            live.update(snapshot_view(snap))
    return 0
