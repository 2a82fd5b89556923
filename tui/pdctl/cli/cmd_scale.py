"""``pdctl scale``: set a group's instance count on a Kubernetes fleet (or apply the
counts ``pdctl plan --json`` recommends). Renders the changed spec and applies it with
``kubectl``; objects the smaller spec no longer renders are deleted. The spec file is
not edited: change ``count`` there too. Exit codes: 0 applied, 2 bad input or a
``kubectl`` error.
"""

from __future__ import annotations

import argparse
import json

from pdctl.cli.args import Grammar, emit
from pdctl.cli.common import console, load

GRAMMAR = Grammar(backends=("k8s",), backend_why="scale applies counts on Kubernetes only")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("group", nargs="?", help="group name (as pdctl status shows it)")
    p.add_argument("count", nargs="?", type=int, help="instances in the group")
    p.add_argument("--from-plan", metavar="PLAN", help="pdctl plan --json output to apply")
    p.add_argument("--wait", action="store_true", help="wait until every instance is ready")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from pdctl.sdk.backends import open_backend
    from pdctl.sdk.plan.scale import ScaleError, counts_from_plan, scaled

    loaded = load(args)
    spec = loaded.spec
    if spec.backend.kind != "k8s":
        raise ScaleError(
            f"backend.kind = {spec.backend.kind!r}: pdctl scale applies counts on Kubernetes "
            "only; on this machine change the group's count in the spec and run pdctl up"
        )
    if args.from_plan:
        with open(args.from_plan, encoding="utf-8") as fh:
            counts = counts_from_plan(spec, json.load(fh))
    elif args.group and args.count is not None:
        counts = {args.group: args.count}
    else:
        raise SystemExit("pdctl scale: give GROUP COUNT or --from-plan PLAN")
    for group, n in counts.items():
        spec = scaled(spec, group, n)
    backend = open_backend(spec, source=str(loaded.source))
    asyncio.run(backend.up(wait=args.wait))
    where = f"{spec.backend.kind}: {spec.fleet.name}"
    if not emit(args, {"applied": counts, "fleet": spec.fleet.name}):
        done = ", ".join(f"{g} = {n}" for g, n in counts.items())
        console().print(f"applied {done} ({where})")
    return 0
