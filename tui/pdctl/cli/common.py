"""Helpers shared by subcommands. Heavy imports stay inside functions."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from pdctl.sdk.lint import Finding, LintReport
    from pdctl.sdk.specload import LoadedSpec


def load(args: argparse.Namespace) -> LoadedSpec:
    from pdctl.sdk.specload import load_spec

    return load_spec(args.file, args.overrides)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def spec_error_json(e: Exception) -> dict[str, Any]:
    from pdctl.sdk.errors import SpecError

    if isinstance(e, SpecError):
        return {
            "ok": False,
            "source": e.source,
            "spec_errors": [p.as_dict() for p in e.problems],
        }
    return {"ok": False, "error": str(e)}


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """-f/--set shared by every subcommand that reads a fleet spec."""
    p.add_argument(
        "-f",
        "--file",
        metavar="SPEC",
        default=None,
        help="fleet spec (TOML); default ./pdctl.toml",
    )
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override a spec field, e.g. --set fleet.mode=pull --set prefill.0.tp=2 "
        "(repeatable; beats PDCTL_* environment variables, which beat the file)",
    )


_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_findings(findings: list[Finding], out: Console) -> None:
    """One block per finding: severity, code and field, then problem, cost and fix."""
    from rich.markup import escape

    for f in findings:
        out.print(f"[{_STYLE[f.severity]}]{f.severity}[/] [bold]{f.code}[/] {escape(f.field)}")
        out.print(f"  {escape(f.message)}")
        out.print(f"  [dim]cost:[/] {escape(f.cost)}")
        out.print(f"  [dim]fix:[/]  {escape(f.fix)}")


def summary_line(report: LintReport, source: str) -> str:
    e, w = len(report.errors), len(report.warnings)
    if not e and not w:
        return f"{source}: no problems found"
    return f"{source}: {e} error(s), {w} warning(s)"
