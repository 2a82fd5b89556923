"""``pdctl probe``: push KV-shaped bytes through NIXL between two local processes (or
across hosts) and report GB/s, transfer time, descriptor counts, the UCX transport and
checksums.

The transfer engine runs as ``python -m pdctl.connector.probe`` in a subprocess with this
interpreter (:mod:`pdctl.cli.proberun`), so the CLI never imports NIXL. Exit codes: 0 ok,
1 the run had failed requests or bad checksums, 2 bad options or setup failure, 130
interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pdctl.cli.args import emit, without_spec
from pdctl.cli.common import console
from pdctl.cli.proberun import ProbeFailed, explain, run_probe

GRAMMAR = without_spec(
    "the probe takes no fleet spec: give the model's KV shape with --model PATH",
    "the probe runs outside any fleet: drop --fleet",
    "the probe runs its two ends as processes here or with --listen/--connect",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pdctl.connector.probe.options import add_arguments as add_probe_arguments

    add_probe_arguments(p)


def probe_argv(args: argparse.Namespace) -> list[str]:
    from pdctl.connector.probe.options import to_argv

    return [sys.executable, "-m", "pdctl.connector.probe", *to_argv(args), "--progress"]


def run(args: argparse.Namespace) -> int:
    argv = probe_argv(args)
    if args.output is not None and args.output != "table":
        result = run_probe(argv)
        emit(args, result)
        return int(result["exit_code"])
    out = console()
    from rich.progress import Progress

    with Progress(console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("warming up", total=args.count)

        def on_event(ev: dict[str, Any]) -> None:
            if ev.get("event") == "request":
                bar.update(task, completed=ev["done"], description="transferring")
            elif ev.get("event") == "listening":
                bar.update(task, description=f"listening on port {ev['port']}")

        result = run_probe(argv, on_event)
    if result.get("error"):
        raise ProbeFailed(explain(str(result["error"])))
    show(result, out)
    return int(result["exit_code"])


def show(r: dict[str, Any], out: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    geo, cfg = r["config"]["geometry"], r["config"]
    mib = r["bytes_per_request"] / (1 << 20)
    out.print(
        f"[bold]probe[/]: {r['requests']['completed']}/{r['requests']['measured']} requests of "
        f"{mib:,.1f} MiB ({cfg['tp']} rank(s) x {geo['regions']} region(s) x "
        f"{geo['blocks_per_request']} blocks of {geo['block_len']:,} B), "
        f"{'merged' if cfg['merge'] else 'one descriptor per block'}, {cfg['device']}"
    )
    t = Table(show_header=True, header_style="bold")
    for col in ("GB/s", "GB/s per request", "transfer p50", "p99", "receive p50", "descs"):
        t.add_column(col, justify="right")
    d = r["descriptors"]
    t.add_row(
        _f(r["gbps"]),
        _f(r["gbps_per_request_p50"]),
        _ms(r["transfer_ms"]["p50"]),
        _ms(r["transfer_ms"]["p99"]),
        _ms(r["receive_ms"]["p50"]),
        f"{d['posted']} (merged {d['merged']}, per block {d['unmerged']})",
    )
    out.print(t)
    tr = r["ucx"]["transports"]
    out.print(f"UCX transport: {escape(', '.join(tr) if isinstance(tr, list) else str(tr))}")
    integ = r["integrity"]
    style = "green" if not integ["mismatched"] else "bold red"
    out.print(f"[{style}]checksums: {integ['matched']}/{integ['checked']} requests match[/]")
    for e in r["errors"][:10]:
        out.print(f"[bold red]error[/] {escape(e)}")
    for n in r["notes"][:10]:
        out.print(f"[dim]note: {escape(n)}[/]")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"
