"""``pdctl preflight``: before deploying, which path KV takes and whether disaggregation pays.

Exit codes: 0 OK, 1 warnings, 2 a blocking problem (DO NOT DISAGGREGATE, a path that
cannot work, unreadable input).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from pdctl.cli.args import Grammar, emit, spec_given
from pdctl.cli.common import console, load_or_report

if TYPE_CHECKING:
    from rich.console import Console

    from pdctl.sdk.preflight import PreflightReport

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_VERDICT_STYLE = {
    "OK": "green",
    "MARGINAL": "yellow",
    "UNLIKELY TO PAY OFF": "bold yellow",
    "DO NOT DISAGGREGATE": "bold red",
    "UNKNOWN": "dim",
}


def _prompt_len(text: str) -> tuple[int, int | None]:
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p.replace("_", "")) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,P95 in tokens, got {text!r}") from None
    if len(values) > 2 or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected N or N,P95 (positive tokens), got {text!r}")
    return values[0], values[1] if len(values) == 2 else None


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


GRAMMAR = Grammar()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="model directory or its config.json")
    p.add_argument(
        "--prompt-len",
        metavar="N[,P95]",
        type=_prompt_len,
        default=(8192, None),
        help="intended prompt length in tokens, optionally with the p95 (default 8192)",
    )
    p.add_argument("--rate", type=_positive, metavar="R", help="requests per second per pair")
    p.add_argument(
        "--ttft-colocated",
        type=_positive,
        metavar="S",
        help="measured colocated TTFT at this prompt length, seconds (the prefill time)",
    )
    p.add_argument(
        "--measured-transfer",
        type=_positive,
        metavar="S",
        help="measured KV transfer time of one prompt, seconds (overrides the estimate)",
    )
    p.add_argument(
        "--peak-tflops",
        type=_positive,
        metavar="T",
        help="GPU dense bf16 peak, for a prefill-time estimate when no TTFT is given",
    )
    p.add_argument("--kv-dtype", metavar="DTYPE", help="KV cache dtype (default: the spec's)")
    p.add_argument("--mode", choices=("push", "pull"), help="transfer mode (default: the spec's)")
    p.add_argument("--from-topo", metavar="FILE", help="saved nvidia-smi topo -m (+ -p2p) output")
    p.add_argument("--sysfs-root", metavar="DIR", help="recorded sysfs tree (plays /sys)")
    p.add_argument(
        "--log",
        metavar="FILE",
        action="append",
        default=[],
        help="vLLM/nixlbench/NCCL/UCX log with measured transfers (repeatable)",
    )
    p.add_argument(
        "--collect",
        metavar="OUT.tar.gz",
        help="run every source here (nvidia-smi, NVML, sysfs, ucx_info, fi_info, ibv_devinfo, "
        "lsmod, NIXL, versions) and bundle the outputs with a manifest; no analysis",
    )
    p.add_argument(
        "--evidence",
        metavar="PATH",
        action="append",
        default=[],
        help="analyse recorded evidence instead of this machine: a --collect bundle (one host "
        "each; repeat for a cross-host plan), a directory, or recorded tool outputs and logs",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="also push this prompt's KV through NIXL between two local processes (pdctl "
        "probe; needs the cpu or gpu extra) and compare measured with expected bandwidth",
    )


def collect(args: argparse.Namespace) -> int:
    """``--collect``: the texts every source gives on this host, bundled; nothing analysed."""
    import time

    from pdctl.sdk.preflight.sources import collect_sources, write_bundle

    t0 = time.monotonic()
    src = collect_sources(logs=[Path(p) for p in args.log])
    out = write_bundle(src, Path(args.collect).expanduser())
    took = time.monotonic() - t0
    manifest = src.manifest()
    if emit(args, {"bundle": str(out), "seconds": round(took, 2), "manifest": manifest}):
        return 0
    from rich.markup import escape

    con = console()
    con.print(f"[bold]collected[/] {escape(str(out))} from {escape(src.host)} in {took:.1f} s")
    for rec in manifest["sources"]:
        what = " ".join(rec["argv"]) or rec["name"]
        rc = "" if rec["rc"] in (None, 0) else f" (exit {rec['rc']})"
        detail = f" — {rec['detail']}" if rec["detail"] and rec["state"] != "ok" else ""
        con.print(f"  {rec['state']:>7}  {escape(what)}{rc}{escape(detail)}")
    con.print(f"[dim]analyse it anywhere: pdctl preflight --evidence {escape(str(out))}[/]")
    return 0


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.preflight import run_preflight

    if args.collect:
        return collect(args)
    spec = None
    source = None
    if spec_given(args) or Path("pdctl.toml").is_file():
        loaded = load_or_report(args)
        if loaded is None:
            return 2
        spec, source = loaded.spec, loaded.source
    prompt_len, p95 = args.prompt_len
    preflight = functools.partial(
        run_preflight,
        spec,
        model=args.model,
        prompt_len=prompt_len,
        prompt_len_p95=p95,
        rate=args.rate,
        ttft_colocated_s=args.ttft_colocated,
        peak_tflops=args.peak_tflops,
        kv_dtype=args.kv_dtype,
        mode=args.mode,
        from_topo=args.from_topo,
        sysfs_root=args.sysfs_root,
        logs=args.log,
        evidence_files=args.evidence,
    )
    report = preflight(measured_transfer_s=args.measured_transfer)
    probe, line = None, ""
    if args.probe:
        from pdctl.cli.proberun import measured_vs_expected, probe_for_preflight

        worst = report.worst_pair()
        model = args.model or (spec.model.path if spec else None)
        probe = probe_for_preflight(model, prompt_len, worst.tp if worst else 1, args.kv_dtype)
        if args.measured_transfer is None and probe["transfer_ms"]["p50"]:
            measured_s = probe["transfer_ms"]["p50"] / 1e3
            report = preflight(measured_transfer_s=measured_s, inventory=report.inventory)
        line, probe["degraded"] = measured_vs_expected(probe, worst.expected_bps if worst else None)
    report.source = source
    if not emit(args, {**report.as_dict(), **({"probe": probe} if probe else {})}):
        show(report, console())
        if probe:
            console().print(line, style="bold yellow" if probe["degraded"] else None)
    return report.exit_code


def show(report: PreflightReport, out: Console) -> None:
    """Warnings first, then the pair table, the GPU matrix, the inventory and assumptions."""
    from rich.markup import escape

    inv = report.inventory
    if inv.topology is None:
        where = "this machine" if inv.host == "this host" else inv.host
        out.print(f"[bold yellow]No GPU found on {escape(where)}.[/]")
    for w in report.warnings:
        where = f" ({', '.join(w.pairs[:3])}{' …' if len(w.pairs) > 3 else ''})" if w.pairs else ""
        out.print(
            f"[{_SEVERITY_STYLE[w.severity]}]{w.severity}[/] [bold]{w.code}[/]{escape(where)}"
        )
        out.print(f"  {escape(w.message)}")
    if report.pairs:
        out.print(_pair_table(report))
    if inv.topology is not None and report.source is None and len(inv.topology.gpus) <= 16:
        out.print(_matrix(report))
    _inventory(report, out)
    verdict = report.verdict.value
    out.print(
        f"[{_VERDICT_STYLE[verdict]}]verdict: {verdict}[/] "
        f"(exit {report.exit_code}; {sum(w.severity == 'error' for w in report.warnings)} "
        f"error(s), {sum(w.severity == 'warning' for w in report.warnings)} warning(s))"
    )


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pair_table(report: PreflightReport) -> object:
    from rich.table import Table

    t = Table(title="P -> D pairs", title_justify="left")
    for col in ("pair", "path", "GB/s", "from", "KV/rank", "transfer", "prefill", "r", "load"):
        t.add_column(col, justify="left" if col in ("pair", "path", "from") else "right")
    t.add_column("verdict")
    for p in report.pairs:
        src = p.bandwidth_source.split(" (")[0].split(":")[0]
        t.add_row(
            p.name,
            p.path.value,
            _num(p.bandwidth_bps / 1e9 if p.bandwidth_bps else None, ".2f"),
            src,
            "-" if p.kv_bytes is None else f"{p.kv_bytes / 1e6:,.1f} MB",
            _num(p.transfer_s, ".3f"),
            _num(p.prefill_s, ".3f"),
            _num(p.ratio, ".2f"),
            _num(p.link_load, ".2f"),
            f"[{_VERDICT_STYLE[p.verdict.value]}]{p.verdict.value}[/]",
        )
    return t


def _matrix(report: PreflightReport) -> object:
    from rich.table import Table

    topo = report.inventory.topology
    assert topo is not None
    t = Table(title=f"GPU links ({topo.source})", title_justify="left")
    t.add_column("")
    for g in topo.gpus:
        t.add_column(f"GPU{g.index}", justify="center")
    t.add_column("NUMA", justify="right")
    for a in topo.gpus:
        cells = [topo.link(a.index, b.index) or "?" for b in topo.gpus]
        t.add_row(f"GPU{a.index}", *cells, "-" if a.numa is None else str(a.numa))
    return t


def _inventory(report: PreflightReport, out: Console) -> None:
    from rich.markup import escape

    inv, kv = report.inventory, report.kv
    gpus = len(inv.gpus)
    nics = ", ".join(f"{n.name} ({n.kind}, {n.rate_gbps or '?'} Gb/s)" for n in inv.nics)
    out.print(f"[bold]inventory[/]: {gpus} GPU(s); RDMA NICs: {escape(nics) or 'none'}")
    out.print("[dim]checked:[/]")
    for c in inv.checks:
        out.print(f"  {escape(c.name)}: {c.state} — {escape(c.detail)}")
    if kv.bytes_per_token is not None and kv.bytes_per_prompt is not None:
        out.print(
            f"[bold]KV[/]: {kv.bytes_per_token:,} bytes/token ({kv.kind}, {kv.dtype}); "
            f"{kv.bytes_per_prompt / 1e6:,.1f} MB per {kv.prompt_len:,}-token prompt"
            + (
                f", {kv.bytes_per_prompt_p95 / 1e6:,.1f} MB at p95 {kv.prompt_len_p95:,}"
                if kv.bytes_per_prompt_p95 and kv.prompt_len_p95 != kv.prompt_len
                else ""
            )
        )
    for a in report.assumptions:
        out.print(f"[dim]assumed: {escape(a)}[/]")
    out.print(f"[dim]{escape(report.measure_hint)}[/]")
