"""Run a fleet in the foreground: live display, signals, and teardown on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pdctl.cli.fleetview import FleetView

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from pdctl.sdk.fleet import AsyncFleet, FleetEvent

Body = Callable[["AsyncFleet"], Awaitable[None]]


def view_for(fleet: AsyncFleet) -> FleetView:
    rows = [(i.name, i.role, i.url) for i in fleet.plan.instances]
    if fleet.with_router and fleet.spec.router is not None:
        rows.append(("router", "router", fleet.router_url))
    return FleetView.from_plan(rows)


def _plain(ev: FleetEvent) -> str:
    who = ev.instance or "fleet"
    code = f" (code {ev.code})" if ev.code is not None else ""
    line = f"{who}: {ev.kind}{code}" + (f" — {ev.message}" if ev.message else "")
    if ev.kind == "exited" and ev.log_tail:
        line += "\n" + "\n".join("    " + ln for ln in ev.log_tail)
    return line


async def supervise(
    fleet: AsyncFleet,
    out: Console,
    *,
    title: str,
    json_events: bool = False,
    body: Body | None = None,
    extra: Callable[[], RenderableType | None] | None = None,
    ready_hint: str = "",
) -> int:
    """Bring the fleet up, keep it supervised until Ctrl-C/SIGTERM, a remote ``pdctl down``
    or the end of ``body``; always take it down. Returns the exit code."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from pdctl.sdk.errors import PdctlError

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    view = view_for(fleet)
    interactive = out.is_terminal and not json_events
    messages: list[str] = []
    errors: list[str] = []

    def render() -> RenderableType:
        parts: list[Any] = [view.table(title)]
        more = extra() if extra else None
        if more is not None:
            parts.append(more)
        parts.extend(Text.from_markup(m) for m in messages[-3:])
        return Group(*parts)

    def note(msg: str) -> None:
        if interactive:
            messages.append(msg)
        elif not json_events:
            out.print(msg)

    async def consume() -> None:
        async for ev in fleet.events():
            view.apply(ev)
            if json_events:
                sys.stdout.write(json.dumps(ev.as_dict()) + "\n")
                sys.stdout.flush()
            elif not interactive:
                out.print(_plain(ev), markup=False)

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0)  # subscribe before anything happens
    up_task = asyncio.create_task(fleet.up())
    stop_task = asyncio.create_task(stop.wait())
    rc = 0
    live = (
        Live(render(), console=out, refresh_per_second=2, transient=False)
        if interactive
        else contextlib.nullcontext()
    )
    with live:
        ticker = asyncio.create_task(_tick(live, render)) if interactive else None
        done, _ = await asyncio.wait({up_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if up_task not in done:
            note("[yellow]interrupted during start-up: stopping every instance[/]")
            up_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, PdctlError):
                await up_task
            rc = 130
        elif up_task.exception() is not None:
            err = up_task.exception()
            if not isinstance(err, PdctlError):
                raise err  # type: ignore[misc]
            errors.append(str(err))
            rc = err.exit_code
        else:
            note(f"[green]fleet ready[/] {ready_hint}")
            waiters: set[asyncio.Task[Any]] = {stop_task, asyncio.create_task(fleet.stopped.wait())}
            body_task: asyncio.Task[None] | None = (
                asyncio.create_task(_run_body(body, fleet)) if body else None
            )
            if body_task is not None:
                waiters.add(body_task)
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if body_task is not None:
                if body_task in done and body_task.exception() is not None:
                    err = body_task.exception()
                    errors.append(f"{type(err).__name__}: {err}")
                    rc = 2
                body_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await body_task
            for w in waiters:
                w.cancel()
            if not fleet.stopped.is_set():
                note("stopping the fleet…")
        await fleet.down()
        stop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(consumer, 5)  # every stop event applied to the view
        if ticker is not None:
            ticker.cancel()
            live.update(render())  # type: ignore[union-attr]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    if not json_events:
        out.print(f"fleet stopped; logs kept in {fleet.dir / 'logs'}")
    if errors:
        from rich.console import Console
        from rich.markup import escape

        err_out = Console(stderr=True, highlight=False)
        for e in errors:
            err_out.print(f"[bold red]error[/]: {escape(e)}")
    return rc


async def _run_body(body: Body, fleet: AsyncFleet) -> None:
    await body(fleet)


async def _tick(live: Any, render: Callable[[], RenderableType]) -> None:
    while True:
        await asyncio.sleep(0.5)
        live.update(render())
