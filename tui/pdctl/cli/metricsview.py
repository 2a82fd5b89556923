"""A fleet's metrics for the command line: the monitor of ``-f``, one snapshot printed,
and the rich rendering of a snapshot (one-shot table and live view)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pdctl.cli.args import emit, k8s_source, spec_free_source
from pdctl.cli.common import STATE_STYLE, console, load

if TYPE_CHECKING:
    from rich.console import RenderableType

    from pdctl.sdk.metrics.monitor import FleetMonitor, Snapshot


def make_monitor(args: argparse.Namespace, interval: float = 1.0) -> FleetMonitor:
    """The monitor of the fleet the command line names: ``--prometheus``, the endpoints
    (``--prefill``/``--decode``/``--router``) or the spec's fleet, configured as
    ``add_monitor_arguments`` says."""
    from pdctl.sdk.metrics.monitor import FleetMonitor

    kw = {
        "interval_s": interval,
        "timeout_s": args.scrape_timeout,
        "window_s": args.window,
        "expected_throughput_bps": args.expect_gbps * 1e9 if args.expect_gbps else None,
    }
    if getattr(args, "prometheus", None):
        return FleetMonitor.from_prometheus(
            args.prometheus,
            args.selector,
            router_url=args.router,
            instance_label=args.instance_label,
            role_label=args.role_label,
            **kw,
        )
    if k8s_source(args):
        return FleetMonitor.from_kubernetes(
            args.k8s_namespace,
            args.k8s_prefill_selector,
            args.k8s_decode_selector,
            args.k8s_router_selector,
            args.k8s_preset,
            router_url=args.router,
            port=args.k8s_port,
            kubeconfig=args.k8s_kubeconfig,
            context=args.k8s_context,
            **kw,
        )
    if spec_free_source(args):
        return FleetMonitor.for_endpoints(args.prefill, args.decode, args.router, **kw)
    from pdctl.sdk.backends import observed

    spec, plan = observed(load(args).spec)
    return FleetMonitor.for_fleet(spec, plan, **kw)


def print_snapshot(args: argparse.Namespace) -> int:
    """One metrics snapshot from a single scrape: latencies and totals since each
    instance started (rates need two scrapes: a stream). Exit 0 without alerts, 1 with."""
    import asyncio

    async def once() -> Snapshot:
        mon = make_monitor(args)
        try:
            return await mon.poll()
        finally:
            await mon.aclose()

    snap = asyncio.run(once())
    if not emit(args, snapshot_doc(snap)):
        console().print(snapshot_view(snap))
    return 1 if snap.alerts else 0


def snapshot_doc(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as JSON, with every panel's figures shown or said why not
    (``panels``: :func:`pdctl.sdk.metrics.panels_doc`)."""
    from pdctl.sdk.metrics import panels_doc

    return {**snap.as_dict(), "panels": panels_doc(snap)}


_HEALTH = {"UP": STATE_STYLE["ready"], "DOWN": STATE_STYLE["exited"], "STALE": "magenta"}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "-"


def snapshot_view(snap: Snapshot) -> RenderableType:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from pdctl.sdk.metrics import panels_of

    t = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        title=f"fleet metrics (window {snap.window_s:.0f}s)",
        title_justify="left",
    )
    for col in (
        "instance",
        "role",
        "health",
        "req/s",
        "TTFT p50/p99 ms",
        "ITL p50 ms",
        "run/wait",
        "KV use",
        "KV moved",
        "xfer p50/p99 ms",
        "prefix hits",
    ):
        t.add_column(col, no_wrap=True)
    for i in snap.instances:
        tr = i.transfers
        t.add_row(
            i.name,
            i.role,
            f"[{_HEALTH.get(i.health, 'white')}]{i.health}[/]",
            _num(i.request_rate, "{:.2f}"),
            f"{_ms(i.ttft.p50)}/{_ms(i.ttft.p99)}",
            _ms(i.itl.p50),
            f"{_num(i.running, '{:.0f}')}/{_num(i.waiting, '{:.0f}')}",
            "-" if i.kv_usage is None else f"{i.kv_usage:.0%}",
            _bytes(tr.bytes_total),
            f"{_ms(tr.xfer_time.p50)}/{_ms(tr.xfer_time.p99)}",
            ("-" if i.prefix_hit_rate is None else f"{i.prefix_hit_rate:.0%}")
            + (f" {i.kv_index}" if i.kv_index else ""),
        )
    parts: list[RenderableType] = [t]
    if snap.pairs:
        parts.append(_pair_table(snap))
    s = snap.summary
    lines = [
        Text.from_markup(
            f"requests/s {s.request_rate:.2f} · TTFT p99 {_ms(s.ttft_p99_s)} ms · "
            f"KV moved {_bytes(s.kv_bytes_moved)} · transfer "
            f"{s.transfer_bps / 1e9:.3f} GB/s · up {s.instances_up}/{s.instances}"
        )
    ]
    for a in snap.alerts:
        style = "bold red" if a.severity == "critical" else "yellow"
        lines.append(Text.from_markup(f"[{style}]{a.code} {a.subject}[/]: ") + Text(a.message))
    whys: dict[str, list[str]] = {}  # every blank figure, under why it is blank
    for panel in panels_of(snap):
        for figure, why in panel.missing.items():
            whys.setdefault(why, []).append(f"{panel.name}.{figure}")
    for why, figures in whys.items():
        lines.append(Text(f"no data for {', '.join(figures)}: {why}", style="yellow"))
    return Group(*parts, *lines)


def _pair_table(snap: Snapshot) -> RenderableType:
    """Per P->D pair: its requests, the KV they pushed and what the digest check said
    (their flights, over the window), the router's canary results (since it started)."""
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="P -> D pairs", title_justify="left")
    for col in (
        "pair",
        "requests ok/err",
        "TTFT p50 ms",
        "pushed",
        "verify ok/bad/skip (flights)",
        "canary match/diff/tie/err (router)",
    ):
        t.add_column(col, no_wrap=True)
    for p in snap.pairs:
        v, c = p.kv_verify, p.canary
        verify = "/".join(str(v.get(k, 0)) for k in ("ok", "mismatch", "unsampled")) if v else "-"
        canary = "/".join(f"{c.get(k, 0):.0f}" for k in ("match", "diverged", "tied", "error"))
        bad = (v.get("mismatch", 0) if v else 0) or c.get("diverged", 0)
        t.add_row(
            f"{p.prefill} -> {p.decode}",
            f"{p.ok}/{p.errors}",
            _num(p.ttft_p50_ms, "{:.0f}"),
            str(p.transfers) if v else "-",
            verify,
            canary if c else "off",
            style="red" if bad else None,
        )
    return t
