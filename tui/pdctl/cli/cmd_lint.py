"""``pdctl lint``: find known P/D failure modes in a spec before anything starts."""

from __future__ import annotations

import argparse

from pdctl.cli.args import Grammar, emit
from pdctl.cli.common import console, load_or_report, print_findings, summary_line

GRAMMAR = Grammar()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true", help="exit 1 when there are warnings")
    p.add_argument(
        "--no-port-check",
        action="store_true",
        help="skip PD002 (ports already bound here), e.g. while the fleet is running",
    )
    p.add_argument("--rules", action="store_true", help="list every rule and exit")


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.lint import RULES, lint

    if args.rules:
        if not emit(args, [{"code": r.code, "title": r.title} for r in RULES]):
            out = console()
            for r in RULES:
                out.print(f"{r.code}  {r.title}")
        return 0
    loaded = load_or_report(args)
    if loaded is None:
        return 2
    report = lint(loaded.spec, check_bound_ports=not args.no_port_check)
    code = report.exit_code(strict=args.strict)
    d = report.as_dict()
    d["source"] = loaded.source
    d["exit_code"] = code
    if emit(args, d):
        return code
    out = console()
    print_findings(report.findings, out)
    for note in report.notes:
        out.print(f"[dim]note: {note}[/]")
    style = "red" if report.errors else ("yellow" if report.warnings else "green")
    out.print(f"[{style}]{summary_line(report, loaded.source)}[/]")
    return code
