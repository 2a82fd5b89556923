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


def spec_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` with ``--fleet NAME`` and ``--backend KIND`` as the fields they name."""
    out = list(getattr(args, "overrides", None) or [])
    if getattr(args, "fleet", None):
        out.append(f"fleet.name={args.fleet}")
    if getattr(args, "backend", None):
        out.append(f"backend.kind={args.backend}")
    return out


def load(args: argparse.Namespace) -> LoadedSpec:
    """The spec of ``-f`` (default ./pdctl.toml) with :func:`spec_overrides`."""
    from pdctl.sdk.specload import load_spec

    return load_spec(args.file, spec_overrides(args))


def load_or_report(args: argparse.Namespace) -> LoadedSpec | None:
    """The spec, or None after printing why it is invalid (in the ``-o`` format when that
    is json or yaml); the caller then exits 2."""
    from pdctl.sdk.errors import SpecError

    try:
        return load(args)
    except SpecError as e:
        from pdctl.cli.args import emit

        if not emit(args, spec_error_json(e)):
            console(stderr=True).print(f"[bold red]error[/]: {e}", markup=True)
        return None


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


def resolve_fleet_name(args: argparse.Namespace) -> str:
    """--fleet, else the spec's fleet.name, else the only fleet with state on this machine."""
    from pdctl.sdk.errors import NotRunningError, SpecError
    from pdctl.sdk.fleet.state import state_root

    if args.fleet:
        return str(args.fleet)
    try:
        return load(args).spec.fleet.name
    except SpecError:
        if args.file is not None:
            raise
    root = state_root()
    running = sorted(p.parent.name for p in root.glob("*/state.json"))
    if len(running) == 1:
        return running[0]
    if not running:
        raise NotRunningError(f"no fleet is running (no state under {root})")
    raise NotRunningError(
        f"several fleets are running ({', '.join(running)}); choose one with --fleet NAME"
    )


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


STATE_STYLE = {
    "ready": "green",
    "starting": "yellow",
    "unhealthy": "red",
    "backoff": "yellow",
    "failed": "bold red",
    "exited": "bold red",
    "gone": "bold red",
    "stopping": "magenta",
    "stopped": "dim",
}


def progress_bars(err: Console, quiet: bool) -> Any:
    """rich progress bars (description, bar, done/total, elapsed) on ``err``; hidden when
    ``quiet`` and ``err`` is not a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal and quiet,
    )
