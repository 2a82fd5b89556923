"""``pdctl down``: stop a running fleet from any shell (or clean up after a crash)."""

from __future__ import annotations

import argparse

from pdctl.cli.backendargs import add_backend_argument, chosen_backend, open_chosen_backend
from pdctl.cli.cmd_up import add_address_argument, apply_address
from pdctl.cli.common import add_fleet_arguments, console, resolve_fleet_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_fleet_arguments(p)
    add_backend_argument(p)
    add_address_argument(p)
    p.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)"
    )


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import NotRunningError
    from pdctl.sdk.fleet import remote_down

    out = console()
    apply_address(args)
    if chosen_backend(args) != "local":
        import asyncio

        backend = open_chosen_backend(args, grace=args.grace)
        with out.status(f"deleting fleet {backend.spec.fleet.name} from {backend.kind}…"):
            result = asyncio.run(backend.down())
        out.print(f"fleet {backend.spec.fleet.name}: {result}")
        return 0
    try:
        name = resolve_fleet_name(args)
        with out.status(f"stopping fleet {name}…"):
            result = remote_down(name, grace=args.grace)
    except NotRunningError as e:
        out.print(str(e))
        return 0
    out.print(f"fleet {name}: {result}")
    return 0
