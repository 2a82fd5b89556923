"""``pdctl up``: start the fleet, wait until it is ready, keep supervising it.

In the foreground (default) pdctl stays attached, shows each instance live and takes
everything down on Ctrl-C. With ``--detach`` a background supervisor keeps the fleet and
``pdctl status|logs|restart|down`` work from any shell.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

from pdctl.cli.args import (
    Grammar,
    add_address_argument,
    add_ready_timeout,
    apply_address,
    emit,
)
from pdctl.cli.backendargs import chosen_backend, open_chosen_backend, print_backend_status
from pdctl.cli.common import console, load

GRAMMAR = Grammar(outputs=("table", "json"))
"""-o json: lifecycle events as JSON lines (with another backend: its status at the end)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_address_argument(p)
    add_ready_timeout(p, "every instance is", old=True)
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL when stopping (default 10)",
    )
    p.add_argument(
        "--ignore-lint",
        action="append",
        default=[],
        metavar="CODE",
        help="launch although lint reports error CODE (e.g. PD005), to reproduce what it "
        "predicts; logged as a warning at every check (repeatable)",
    )
    p.add_argument(
        "-d",
        "--detach",
        action="store_true",
        help="return once ready; a background supervisor keeps the fleet",
    )


def _fleet(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from pdctl.sdk.fleet import AsyncFleet

    loaded = load(args)
    if args.ignore_lint:
        console().print(
            f"[bold yellow]warning:[/] launching past lint errors {', '.join(args.ignore_lint)} "
            "(--ignore-lint): what they predict will happen",
        )
    return AsyncFleet(
        loaded.spec,
        source=loaded.source,
        ready_timeout=args.ready_timeout,
        grace=args.grace,
        ignore_lint=args.ignore_lint,
    )


def run(args: argparse.Namespace) -> int:
    apply_address(args)
    if chosen_backend(args) != "local":
        return _on_backend(args)
    if args.detach:
        return _detach(args)
    return asyncio.run(_foreground(args))


async def _foreground(args: argparse.Namespace) -> int:
    from pdctl.cli.supervise import supervise

    fleet = _fleet(args)
    return await supervise(
        fleet,
        console(),
        title=f"fleet {fleet.spec.fleet.name} ({fleet.source})",
        json_events=args.json,
        ready_hint="— Ctrl-C stops it; from another shell: "
        "pdctl status | logs | stop | restart | down",
    )


def _detach(args: argparse.Namespace) -> int:
    from pdctl.cli.fleetview import status_table
    from pdctl.sdk.errors import FleetRunningError
    from pdctl.sdk.fleet import fleet_dir, read_state, remote_down, tail
    from pdctl.sdk.fleet.procs import alive

    loaded = load(args)
    name = loaded.spec.fleet.name
    d = fleet_dir(name)
    rec = read_state(d)
    if rec is not None and alive(rec.supervisor_pid, rec.supervisor_ticks):
        raise FleetRunningError(
            f"fleet {name!r} is already running (supervisor pid {rec.supervisor_pid}); "
            "see `pdctl status`, or stop it with `pdctl down`"
        )
    cmd = [
        sys.executable,
        "-m",
        "pdctl.cli.main",
        "up",
        "--json",
        "--ready-timeout",
        str(args.ready_timeout),
        "--grace",
        str(args.grace),
    ]
    if args.file:
        cmd += ["-f", os.path.abspath(args.file)]
    for o in args.overrides:
        cmd += ["--set", o]
    for code in args.ignore_lint:
        cmd += ["--ignore-lint", code]
    for flag in ("fleet", "backend"):
        if getattr(args, flag):
            cmd += [f"--{flag}", getattr(args, flag)]
    d.mkdir(parents=True, exist_ok=True)
    log_path = d / "supervisor.log"
    out = console()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    t0 = time.monotonic()
    try:
        with out.status(f"starting fleet {name} (supervisor pid {proc.pid})…") as spinner:
            while True:
                if proc.poll() is not None:
                    out.print(
                        f"[bold red]error[/]: the supervisor exited with code "
                        f"{proc.returncode}; last lines of {log_path}:"
                    )
                    for ln in tail(log_path, 20):
                        out.print("  " + ln, markup=False)
                    return 2
                rec = read_state(d)
                if rec is not None and rec.supervisor_pid == proc.pid and rec.instances:
                    states = {i.name: i.state for i in rec.instances}
                    spinner.update(
                        f"starting fleet {name} ({int(time.monotonic() - t0)}s): "
                        + ", ".join(f"{n} {s}" for n, s in states.items())
                    )
                    if all(s == "ready" for s in states.values()):
                        break
                time.sleep(0.5)
    except KeyboardInterrupt:
        out.print("interrupted: stopping the fleet")
        remote_down(name, grace=args.grace)
        return 130
    from pdctl.sdk.fleet import fleet_status

    st = asyncio.run(fleet_status(name))
    out.print(
        status_table(
            st.instances,
            title=f"fleet {name} ready in {time.monotonic() - t0:.0f}s (supervisor pid {proc.pid})",
        )
    )
    out.print("stop it with `pdctl down`; logs: `pdctl logs INSTANCE --follow`")
    return 0


def _on_backend(args: argparse.Namespace) -> int:
    """Apply the fleet to its backend (e.g. a cluster), which then supervises it; wait
    until every instance is ready unless ``--detach``."""
    backend = open_chosen_backend(args, ready_timeout=args.ready_timeout, grace=args.grace)
    name = backend.spec.fleet.name
    out = console(stderr=args.json)
    with out.status(f"starting fleet {name} on {backend.kind}…"):
        asyncio.run(backend.up(wait=not args.detach))
    st = asyncio.run(backend.status())
    if emit(args, st.as_dict()):
        return 0
    print_backend_status(st, out)
    out.print(f"stop it with `pdctl down --backend {backend.kind}`")
    return 0
