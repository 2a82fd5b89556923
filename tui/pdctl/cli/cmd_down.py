"""``pdctl down``: stop a running fleet from any shell (or clean up after a crash)."""

from __future__ import annotations

import argparse

from pdctl.cli.args import Grammar, add_address_argument, apply_address, emit, human
from pdctl.cli.backendargs import chosen_backend, open_chosen_backend
from pdctl.cli.common import console, resolve_fleet_name

GRAMMAR = Grammar()


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_address_argument(p)
    p.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)"
    )


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import NotRunningError
    from pdctl.sdk.fleet import remote_down

    out = console(stderr=not human(args))
    apply_address(args)
    if chosen_backend(args) != "local":
        import asyncio

        backend = open_chosen_backend(args, grace=args.grace)
        name = backend.spec.fleet.name
        with out.status(f"deleting fleet {name} from {backend.kind}…"):
            result = asyncio.run(backend.down())
    else:
        try:
            name = resolve_fleet_name(args)
            with out.status(f"stopping fleet {name}…"):
                result = remote_down(name, grace=args.grace)
        except NotRunningError as e:
            if not emit(args, {"fleet": None, "result": str(e)}):
                out.print(str(e))
            return 0
    if not emit(args, {"fleet": name, "result": result}):
        out.print(f"fleet {name}: {result}")
    return 0
