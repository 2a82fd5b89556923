"""``pdctl restart INSTANCE``: stop one instance and start it again, waiting until ready."""

from __future__ import annotations

import argparse

from pdctl.cli.common import add_fleet_arguments, console, resolve_fleet_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("instance", help="instance name, e.g. prefill-0")
    add_fleet_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.fleet import remote_restart

    out = console()
    name = resolve_fleet_name(args)
    with out.status(f"restarting {args.instance} in fleet {name}…"):
        remote_restart(name, args.instance)
    out.print(f"{args.instance}: restarted and ready")
    return 0
