"""``pdctl status``: every instance of a running fleet, from any shell.

Exit codes: 0 every instance ready; 1 some instance not ready (starting, unhealthy,
exited); 2 no such fleet or another error.
"""

from __future__ import annotations

import argparse
import asyncio

from pdctl.cli.args import (
    Grammar,
    add_address_argument,
    add_monitor_arguments,
    apply_address,
    deprecated,
    emit,
)
from pdctl.cli.backendargs import chosen_backend, open_chosen_backend, print_backend_status
from pdctl.cli.common import console, resolve_fleet_name

GRAMMAR = Grammar()


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_address_argument(p)
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    g = p.add_argument_group("deprecated: status --once (use pdctl metrics --once)")
    add_monitor_arguments(g)


def run(args: argparse.Namespace) -> int:
    if args.once:
        from pdctl.cli.metricsview import print_snapshot

        deprecated("pdctl status --once", "pdctl metrics --once")
        return print_snapshot(args)
    apply_address(args)
    if chosen_backend(args) != "local":
        bst = asyncio.run(open_chosen_backend(args).status())
        if not emit(args, bst.as_dict()):
            print_backend_status(bst, console())
        return 0 if bst.all_ready else 1
    from pdctl.cli.fleetview import status_table
    from pdctl.sdk.fleet import fleet_status

    name = resolve_fleet_name(args)
    st = asyncio.run(fleet_status(name))
    all_ready = all(i.state == "ready" for i in st.instances)
    if emit(args, st.as_dict()):
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
