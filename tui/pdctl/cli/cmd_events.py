"""``pdctl events``: the fleet's events in time order, from its state directory's journal
(instance lifecycle, restarts and back-offs, control actions and who made them, and what
watchers saw: alerts raised and cleared, health, the router's rotation, breakers, drains,
retries, migrations, KV releases, failed requests).

``--follow`` keeps printing; ``-o json`` prints one JSON document (``--follow``: one JSON
line per event). Exit codes: 0; 2 for a bad filter or when no fleet has a journal here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from pdctl.cli.args import Grammar, emit, emit_record, human

if TYPE_CHECKING:
    from rich.console import Console

    from pdctl.sdk.events import Event, EventFilter, EventSource

GRAMMAR = Grammar(
    outputs=("table", "json", "yaml"),
    backends=("local",),
    backend_why="the journal is read from this machine's state directory",
)
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "notice": "green", "info": "dim"}


def _since(text: str) -> float:
    """``90s``, ``10m``, ``2h``, ``1d`` ago, or epoch seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1:] in units:
            return time.time() - float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: give an age (90s, 10m, 2h, 1d) or epoch seconds"
        ) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", action="append", default=[], help="only this kind (repeatable)")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        help="only from supervisor | operator | monitor | router (repeatable)",
    )
    p.add_argument(
        "--instance", action="append", default=[], help="only about this subject (repeatable)"
    )
    p.add_argument("--since", type=_since, default=None, help="age (10m, 2h) or epoch seconds")
    p.add_argument("--severity", default=None, help="at least: info | notice | warning | error")
    p.add_argument("-n", "--last", type=int, default=None, help="only the last N")
    p.add_argument("-F", "--follow", action="store_true", help="keep printing new events")
    p.add_argument("--kinds", action="store_true", help="list the kinds and exit")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pdctl.sdk.events import KINDS, EventFilter, EventSource
    from pdctl.sdk.fleet import fleet_dir

    out = Console(highlight=False)
    if args.kinds:
        rows = [
            {"kind": k.name, "source": k.source, "severity": k.severity, "meaning": k.meaning}
            for k in KINDS.values()
        ]
        if not emit(args, rows):
            for r in rows:
                out.print(f"{r['kind']:<15} {r['source']:<11} {r['severity']:<8} {r['meaning']}")
        return 0
    flt = EventFilter(
        kinds=tuple(args.kind),
        sources=tuple(args.source),
        subjects=tuple(args.instance),
        since=args.since,
        min_severity=args.severity,
    )
    try:
        flt.check()
    except ValueError as err:
        out.print(f"[red]error:[/] {err}")
        return 2
    name = _fleet(args)
    src = EventSource(fleet_dir(name), writable=False)
    events = src.history(flt)
    if args.last is not None:
        events = events[-args.last :] if args.last > 0 else []
    if args.follow:
        for e in events:
            _print(args, out, e)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_follow(args, out, src, flt))
        return 0
    if not emit(args, {"fleet": name, "events": [e.as_dict() for e in events]}):
        if not events:
            out.print(
                f"fleet {name}: no events" + (" match the filter" if flt != EventFilter() else "")
            )
        for e in events:
            _print(args, out, e)
    return 0


async def _follow(
    args: argparse.Namespace, out: Console, src: EventSource, flt: EventFilter
) -> None:
    async for e in src.follow(flt, interval_s=0.25):
        _print(args, out, e)


def _print(args: argparse.Namespace, out: Console, e: Event) -> None:
    from rich.markup import escape

    if not human(args):
        emit_record(args, e.as_dict())
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(e.at)) + f".{int(e.at * 1000) % 1000:03d}"
    style = SEVERITY_STYLE.get(e.severity, "")
    who = f"  by {escape(e.actor)}" if e.actor else ""
    out.print(
        f"{stamp} [{style}]{e.kind:<14}[/] {e.source:<10} {escape(e.subject or '-'):<14} "
        f"{escape(e.message)}{who}"
    )


def _fleet(args: argparse.Namespace) -> str:
    """The fleet named or running, else the only one whose journal is here (a stopped
    fleet keeps its events)."""
    from pdctl.cli.common import resolve_fleet_name
    from pdctl.sdk.errors import NotRunningError
    from pdctl.sdk.fleet.state import state_root

    try:
        return resolve_fleet_name(args)
    except NotRunningError:
        kept = sorted(p.parent.name for p in state_root().glob("*/events.jsonl"))
        if len(kept) == 1:
            return kept[0]
        if kept:
            raise NotRunningError(
                f"no fleet is running; journals kept for {', '.join(kept)}: choose with --fleet"
            ) from None
        raise
