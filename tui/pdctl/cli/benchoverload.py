"""``pdctl bench --preset overload``: goodput at a multiple of the fleet's capacity
through a router with admission control and one without, alternating, in one run
(:mod:`pdctl.sdk.bench.overload`). Starts the fleet and the two routers (one worker each,
on free ports) and writes ``overload.json`` into ``--out``."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from pdctl.cli.args import emit
from pdctl.cli.common import console


def plan_of(args: argparse.Namespace) -> Any:
    from pdctl.sdk.bench.overload import OverloadPlan

    kw: dict[str, Any] = {}
    for arg, field in (
        ("load", "load"),
        ("duration", "duration_s"),
        ("rounds", "rounds"),
        ("seed", "seed"),
        ("output_len", "max_tokens"),
    ):
        if getattr(args, arg, None) is not None:
            kw[field] = getattr(args, arg)
    return OverloadPlan(**kw)


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm and round: the figures the table shows."""
    out = []
    for arm, rounds in record["rounds"].items():
        for i, r in enumerate(rounds, 1):
            out.append(
                {
                    "arm": arm,
                    "round": i,
                    "offered": r["offered"],
                    "goodput_rps": round(r["goodput_rps"], 2),
                    "shed": r["shed"],
                    "shed_within_50ms": r["shed_within_50ms"],
                    "router_shed": _router_shed(r.get("router_shed")),
                    "router_loop_lag": _lag(r.get("router_loop_lag")),
                    "clients": _clients(r.get("client_loop_lag")),
                    "router_cpu_share": r.get("router_cpu_share"),
                    "tcp_drops": r.get("tcp_drops"),
                    "interactive_ttft_p99_ms": r["interactive_ttft_p99_ms"],
                    "prediction_error_p50": r["ttft_prediction"]["error_p50"],
                    "lost": r["lost"],
                    "kv_idle_after_s": _slowest(r.get("kv_idle_after_s")),
                }
            )
    return out


def run(args: argparse.Namespace, spec: Any, source: str) -> int:
    from pdctl.sdk.bench.overload import WITH, WITHOUT, run_overload, start_router
    from pdctl.sdk.bench.overloadside import renice
    from pdctl.sdk.fleet import Fleet
    from pdctl.sdk.freeports import free_ports

    plan = plan_of(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    err = console(stderr=True)
    folder = Path(tempfile.mkdtemp(prefix="pdctl-overload-"))
    with Fleet(spec, ready_timeout=400, grace=5) as fleet:
        if plan.engine_nice:  # a measurement setup choice (docs/bench.md)
            renice([s.pid for s in fleet.status()], plan.engine_nice)
        instances = [p.url for p in fleet.fleet.plan.instances]
        p_on, p_off = free_ports(2)
        on_url, on = start_router(spec, plan.admission(), folder, p_on)
        off_url, off = start_router(spec, {"enabled": False}, folder, p_off)
        try:
            asyncio.run(_ready(on_url, off_url))
            record = asyncio.run(
                run_overload(
                    {WITH: on_url, WITHOUT: off_url},
                    plan,
                    instances=instances,
                    router_pids={WITH: on.pid, WITHOUT: off.pid},
                    say=lambda s: err.print(f"[dim]{s}[/]"),
                )
            )
        finally:
            for p in (on, off):
                p.terminate()
                p.wait(15)
    record["spec"] = source
    (out_dir / "overload.json").write_text(json.dumps(record, indent=1) + "\n")
    if emit(args, record):
        return 0
    out = console()
    for r in rows(record):
        out.print("  ".join(f"{k} {v}" for k, v in r.items()))
    for arm, rounds in record["rounds"].items():
        for r in rounds:
            for key, v in r["shed_by"].items():
                out.print(f"  {arm}: shed {key}: {int(v['n'])} (slowest {v['max_ms']} ms)")
            for cause, v in r.get("late_by_cause", {}).items():
                if v["n"]:
                    n, slow = int(v["n"]), v["max_ms"]
                    sent = ", ".join(v.get("sent", []))
                    out.print(
                        f"  {arm}: later than 50 ms, {cause}: {n} (slowest {slow} ms; "
                        f"class@s sent: {sent})"
                    )
    ratio = record["goodput_ratio"]
    out.print(
        f"goodput with/without admission: [bold]{'-' if ratio is None else f'{ratio:.2f}'}[/]"
        f"  (wrote {out_dir}/overload.json)"
    )
    return 0


async def _ready(*urls: str) -> None:
    import httpx

    from pdctl.sdk import chaos

    async with httpx.AsyncClient() as c:
        for url in urls:
            if await chaos.time_to_service(c, url) is None:
                raise SystemExit(f"pdctl bench: the router at {url} never answered a request")


def _router_shed(rs: dict[str, Any] | None) -> str:
    """The router's own timing of its shed answers, per when they were shed."""
    if not rs:
        return "-"
    return ", ".join(
        f"{when} {v['n']} ({v['within_50ms']} <=50ms, p99 <={v['p99_under_ms']} ms)"
        for when, v in rs.items()
        if v["n"]
    )


def _lag(lag: dict[str, Any] | None) -> str:
    """The router's event-loop lag over the arm (bucket bounds)."""
    if not lag or not lag["n"]:
        return "-"
    return f"p99 <={lag['p99_under_ms']} ms, max <={lag['max_under_ms']} ms"


def _clients(lag: dict[str, Any] | None) -> str:
    """Per load-client process: its CPU share and its event loop's largest lag."""
    procs = (lag or {}).get("processes") or []
    return ", ".join(f"cpu {p.get('cpu_share')} lag max {p.get('max_ms')} ms" for p in procs)


def _slowest(back: dict[str, float | None] | None) -> float | str | None:
    """The slowest instance's seconds until its KV was back at idle ('never' if one was
    not within the wait)."""
    if not back:
        return None
    if any(v is None for v in back.values()):
        return "never"
    return round(max(v for v in back.values() if v is not None), 2)
