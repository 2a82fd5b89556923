"""``pdctl audit``: every listener of a running fleet, probed as an outsider (no key, no
client certificate), with what answers and the fix for each.

Locally the listeners are the launch plan's and whatever the OS shows the fleet's
processes listening on; on ``--backend k8s|ray`` they come from the launch plan and are
judged from the spec, not probed.

Exit codes: 0 nothing open that should not be; 1 something is (a finding marked OPEN);
2 no such fleet, no spec, or another error.
"""

from __future__ import annotations

import argparse
import asyncio

from pdctl.cli.args import Grammar, emit
from pdctl.cli.common import console, load, resolve_fleet_name

GRAMMAR = Grammar()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strict",
        action="store_true",
        help="count loopback as exposed too (other users of this machine are outsiders)",
    )
    p.add_argument(
        "--all", action="store_true", help="list every probe's answer, not only what answered"
    )


def run(args: argparse.Namespace) -> int:
    from pdctl.cli.backendargs import chosen_backend
    from pdctl.sdk.audit import audit_local, audit_plan

    backend = chosen_backend(args)
    if backend != "local":
        report = audit_plan(load(args).spec, backend, strict=args.strict)
    else:
        name = resolve_fleet_name(args)
        spec = load(args).spec if args.file is not None else None
        report = asyncio.run(audit_local(name, spec=spec, strict=args.strict))
    if not emit(args, report.as_dict()):
        _print(report, args.all)
    return 1 if report.open else 0


def _print(report: object, every: bool) -> None:
    from rich.table import Table

    from pdctl.sdk.audit import AuditReport

    assert isinstance(report, AuditReport)
    out = console()
    t = Table(
        title=f"fleet {report.fleet} ({report.backend}): {len(report.findings)} listeners, "
        f"{len(report.open)} open",
        title_justify="left",
    )
    for col in ("", "owner", "what", "address", "process", "verdict"):
        t.add_column(col)
    unplanned: dict[tuple[str, int | None, str, bool], list[int]] = {}
    for f in report.findings:
        x = f.listener
        mark = "[bold red]OPEN[/]" if f.open else "[green]ok[/]"
        proc = f"{x.process} {x.pid}" if x.process else ""
        if not x.planned:  # one row per process and address: libraries open dozens
            unplanned.setdefault((x.owner, x.pid, x.host, f.open), []).append(x.port or 0)
            continue
        t.add_row(mark, x.owner, x.kind, x.address, proc, f.verdict)
    procs = {(f.listener.owner, f.listener.pid): f.listener.process for f in report.findings}
    for (owner, pid, host, is_open), ports in unplanned.items():
        mark = "[bold red]OPEN[/]" if is_open else "[green]ok[/]"
        where = "beyond loopback" if is_open else "loopback only"
        t.add_row(
            mark,
            owner,
            "[yellow]unplanned[/]",
            f"{host}: {len(ports)} port{'s' * (len(ports) > 1)}",
            f"{procs.get((owner, pid))} {pid}",
            f"not in the launch plan; {where}",
        )
    out.print(t)
    fixed: set[str] = set()
    for f in report.findings:
        shown = [a for a in f.answers if every or a.open]
        if not f.listener.planned:
            if f.open and f.fix not in fixed:
                fixed.add(f.fix)
                out.print("[bold]unplanned listeners beyond loopback[/]")
                out.print(f"  fix: {f.fix}", markup=False)
            continue
        if f.open or (every and shown):
            out.print(f"[bold]{f.listener.owner} {f.listener.address}[/] ({f.listener.kind})")
            for a in shown:
                status = a.status if a.status is not None else "-"
                tag = " (public by design)" if a.public else ""
                out.print(f"  {a.probe}: {status}{tag} {a.note}".rstrip(), markup=False)
            if f.fix:
                out.print(f"  fix: {f.fix}", markup=False)
    for n in report.notes:
        out.print(f"note: {n}", markup=False)
