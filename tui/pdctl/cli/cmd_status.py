"""``pdctl status``: every instance of a running fleet, from any shell.

Exit codes: 0 every instance ready; 1 some instance not ready (starting, unhealthy,
exited); 2 no such fleet or another error.
"""

from __future__ import annotations

import argparse
import asyncio

from pdctl.cli.backendargs import (
    add_backend_argument,
    chosen_backend,
    open_chosen_backend,
    print_backend_status,
)
from pdctl.cli.cmd_up import add_address_argument, apply_address
from pdctl.cli.common import add_fleet_arguments, console, print_json, resolve_fleet_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pdctl.cli.cmd_metrics import add_monitor_arguments

    add_fleet_arguments(p)
    add_backend_argument(p)
    add_address_argument(p)
    p.add_argument("--json", action="store_true", help="machine-readable status")
    p.add_argument(
        "--once",
        action="store_true",
        help="one metrics snapshot (every instance's figures and alerts) instead",
    )
    add_monitor_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.once:
        return _once(args)
    apply_address(args)
    if chosen_backend(args) != "local":
        bst = asyncio.run(open_chosen_backend(args).status())
        if args.json:
            print_json(bst.as_dict())
        else:
            print_backend_status(bst, console())
        return 0 if bst.all_ready else 1
    from pdctl.cli.fleetview import status_table
    from pdctl.sdk.fleet import fleet_status

    name = resolve_fleet_name(args)
    st = asyncio.run(fleet_status(name))
    all_ready = all(i.state == "ready" for i in st.instances)
    if args.json:
        print_json(st.as_dict())
        return 0 if all_ready else 1
    out = console()
    sup = (
        f"supervisor pid {st.supervisor_pid}"
        if st.supervisor_alive
        else "[bold red]supervisor gone (crashed?)[/]: `pdctl down` cleans up"
    )
    out.print(status_table(st.instances, title=f"fleet {st.fleet} — {sup}"))
    for i in st.instances:
        if i.last_failure and i.state != "ready":
            out.print(f"[bold]{i.name}[/] last failure: {i.last_failure}", highlight=False)
        if i.log_tail:
            out.print(
                f"[bold red]{i.name}[/] {i.state} (code {i.exit_code}); last lines of {i.log}:"
            )
            for ln in i.log_tail:
                out.print("  " + ln, markup=False, highlight=False)
    return 0 if all_ready else 1


def _once(args: argparse.Namespace) -> int:
    """One metrics snapshot from a single scrape: latencies and totals since each
    instance started (rates need two scrapes: use ``pdctl metrics``). Exit 0 without
    alerts, 1 with."""
    import asyncio

    from pdctl.cli.cmd_metrics import make_monitor
    from pdctl.cli.metricsview import snapshot_view

    snap = asyncio.run(make_monitor(args).poll())
    if args.json:
        print_json(snap.as_dict())
    else:
        console().print(snapshot_view(snap))
    return 1 if snap.alerts else 0
