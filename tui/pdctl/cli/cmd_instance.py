"""``pdctl stop|start|restart INSTANCE...``: one instance (or a few) of a running fleet.

``stop`` stops each (SIGTERM, SIGKILL after ``--grace``) and leaves it stopped; the
router hears ``down`` first. ``start`` starts a stopped instance again and waits until
it is ready (one that is already running is left alone); ``restart`` stops and starts
each, waiting until ready. The fleet's supervisor does the work (``pdctl up`` here or
``pdctl up -d``); the Ray and Kubernetes backends do not offer single instances.
Exit codes: 0 done, 2 no such fleet or instance, or the supervisor refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pdctl.cli.args import Grammar, add_ready_timeout, emit, human
from pdctl.cli.common import console, resolve_fleet_name

GRAMMAR = Grammar(
    backends=("local",),
    backend_why="single instances are controlled through this machine's supervisor",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("instances", nargs="+", metavar="INSTANCE", help="instance name, e.g. prefill-0")
    add_ready_timeout(p, "each started instance is")
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="stop: seconds between SIGTERM and SIGKILL (default 10)",
    )


def run_stop(args: argparse.Namespace) -> int:
    from pdctl.sdk.fleet import remote_stop

    def stop(fleet: str, name: str) -> str:
        remote_stop(fleet, name, grace=args.grace)
        return "stopped"

    return _each(args, "stopping", stop)


def run_restart(args: argparse.Namespace) -> int:
    from pdctl.sdk.fleet import remote_restart

    def restart(fleet: str, name: str) -> str:
        remote_restart(fleet, name, timeout=args.ready_timeout + 30)
        return "restarted and ready"

    return _each(args, "restarting", restart)


def run_start(args: argparse.Namespace) -> int:
    import asyncio

    from pdctl.sdk.fleet import fleet_status, remote_restart

    def start(fleet: str, name: str) -> str:
        st = asyncio.run(fleet_status(fleet))
        state = next((i.state for i in st.instances if i.name == name), None)
        if state in ("ready", "starting"):
            return f"already {state} (pdctl restart starts it afresh)"
        remote_restart(fleet, name, timeout=args.ready_timeout + 30)
        return "started and ready"

    return _each(args, "starting", start)


def _each(args: argparse.Namespace, doing: str, act: Callable[[str, str], str]) -> int:
    out = console(stderr=not human(args))
    fleet = resolve_fleet_name(args)
    done = []
    for name in args.instances:
        with out.status(f"{doing} {name} in fleet {fleet}…"):
            result = act(fleet, name)
        done.append({"fleet": fleet, "instance": name, "result": result})
        if human(args):
            out.print(f"{name}: {result}")
    emit(args, done)
    return 0
