"""``pdctl dashboards``: Grafana dashboards (overview, rendezvous, transfers, latency,
router) on the series a fleet's Prometheus scrapes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdctl.cli.args import Grammar, add_old_name, emit
from pdctl.cli.common import console, load

GRAMMAR = Grammar(outputs=("json", "yaml"), out_path=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write one <uid>.json per dashboard here (default: print them as one list)",
    )
    add_old_name(p, "--output-dir", "--out", "out")


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import SpecError
    from pdctl.sdk.observability import dashboards, grafana_json

    fleet: str | None = args.fleet
    if fleet is None:
        try:
            fleet = load(args).spec.fleet.name
        except SpecError:
            fleet = None  # the dashboards do not need a spec; it only preselects the fleet
    docs = [grafana_json(d, fleet) for d in dashboards()]
    if args.out is None:
        args.output = args.output or "json"
    emit(args, docs)  # with --out only when -o asks for it too
    if args.out is None:
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for d in docs:
        path = out / f"{d['uid']}.json"
        path.write_text(json.dumps(d, indent=2) + "\n")
        if args.output is None:
            console().print(f"{path}: {len(d['panels'])} panels ({d['title']})")
    return 0
