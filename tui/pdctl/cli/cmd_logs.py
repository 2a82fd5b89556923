"""``pdctl logs INSTANCE [--follow]``: an instance's log (also after the fleet stopped).

``-f`` names the spec here as on every command; ``--follow`` (``-F``) follows. The old
``pdctl logs INSTANCE -f`` (``-f`` with no path after it) still follows, with a note."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pdctl.cli.args import Grammar, deprecated
from pdctl.cli.common import resolve_fleet_name

GRAMMAR = Grammar(
    outputs=("table",),
    backends=("local",),
    backend_why="logs are read from this machine's state directory",
    bare_file=True,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("instance", help="instance name, e.g. decode-0 (or 'supervisor')")
    p.add_argument("-F", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("-n", "--lines", type=int, default=50, help="lines of history (default 50)")


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import NotRunningError
    from pdctl.sdk.fleet import fleet_dir, tail

    if args.bare_file:
        deprecated(f"pdctl logs {args.instance} -f", f"pdctl logs {args.instance} --follow")
        args.follow = True
    name = resolve_fleet_name(args)
    d = fleet_dir(name)
    path = (
        d / "supervisor.log"
        if args.instance == "supervisor"
        else (d / "logs" / f"{args.instance}.log")
    )
    if not path.exists():
        have = sorted(p.stem for p in (d / "logs").glob("*.log"))
        raise NotRunningError(
            f"no log for {args.instance!r} in fleet {name!r}"
            + (f" (have: {', '.join(have)})" if have else "")
        )
    for ln in tail(path, args.lines):
        sys.stdout.write(ln + "\n")
    sys.stdout.flush()
    if args.follow:
        _follow(path)
    return 0


def _follow(path: Path) -> None:
    with open(path, "rb") as f:
        f.seek(0, 2)
        while True:
            chunk = f.read()
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            else:
                if path.stat().st_size < f.tell():  # truncated
                    f.seek(0)
                time.sleep(0.2)
