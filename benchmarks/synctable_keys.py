"""A table key's cost at 512 rows: SyncTable's in-place reorder against a full rebuild.

When a key changes which rows the fleet table shows (a group opened or closed, a new
sort), ``SyncTable`` adds and drops only the rows that came or went and sets the order
in one pass. The baseline, in the same run and the same app, is how it did that before:
``clear()`` and ``add_row`` for every row (each new row's cells measured on the next
idle). Timed, the two tables taking turns: ``sync`` to the app idle again (handler,
dimensions, paint), for a sort reversed (every row moves), a group of half the rows
opened in the middle and closed again; medians of ``--rounds``, the ratio in place /
rebuild.

    python benchmarks/synctable_keys.py [--rows 512] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for part in ("sdk", "tui", "connector"):
    sys.path.insert(0, str(ROOT / part))

from rich.text import Text  # noqa: E402
from textual.app import App, ComposeResult  # noqa: E402
from textual.widgets.data_table import RowDoesNotExist  # noqa: E402

from pdctl.tui.views.fleet import COLUMNS  # noqa: E402
from pdctl.tui.widgets import Cell, SyncTable  # noqa: E402


class RebuildTable(SyncTable):
    """The baseline: every change of keys clears the table and adds every row again."""

    def _rebuild(
        self, rows: Sequence[tuple[str, Sequence[Cell]]], index: list[int], selected: str | None
    ) -> None:
        self.clear()
        self._rows = {}
        for key, cells in rows:
            new = tuple(cells[i] for i in index)
            self.add_row(*new, key=key)
            self._rows[key] = new
        self._order = [k for k, _ in rows]
        if selected is not None and selected in self._rows:
            with contextlib.suppress(RowDoesNotExist):
                self.move_cursor(row=self.get_row_index(selected), animate=False)


class Tables(App[None]):
    def compose(self) -> ComposeResult:
        yield SyncTable(COLUMNS, id="new")
        yield RebuildTable(COLUMNS, id="rebuild")


def row(n: int) -> tuple[str, tuple[Cell, ...]]:
    name = f"decode-{n}"
    return name, (
        Text("├ " + name),
        Text("decode", style="magenta"),
        f"10.0.{n // 250}.{n % 250}:8200",
        Text("UP", style="green"),
        "running",
        f"{n % 7}/{n % 3}",
        f"{n % 100}%",
        f"{40 + n % 9}/{90 + n % 13}",
        f"{5 + n % 4}",
        f"{n % 5}.{n % 10}",
        str(n % 4),
        f"{n}.0 MiB",
        "▁▂▃▄▅▆▇█▇▆▅▄",
        "-",
    )


async def measure(rows: int, rounds: int) -> dict[str, dict[str, float]]:
    base = [row(n) for n in range(rows)]
    half = rows // 2
    group = ("group:extra", (Text("▸ extra"), *("-",) * (len(COLUMNS) - 1)))
    closed = [*base[:half], group, *base[half + half // 2 :]]  # a group closed
    opened = [*base[:half], group, *base[half:]]  # ... and open: its rows follow it
    steps = {
        "reverse sort": (base, base[::-1]),
        "open a group": (closed, opened),
        "close a group": (opened, closed),
    }
    times: dict[str, dict[str, list[float]]] = {n: {"new": [], "rebuild": []} for n in steps}
    app = Tables()
    async with app.run_test(size=(200, 60)) as pilot:
        for _ in range(rounds):  # the two tables alternate: the machine's load hits both
            for name, (before, after) in steps.items():
                for table_id in ("new", "rebuild"):
                    t = app.query_one(f"#{table_id}", SyncTable)
                    t.sync(before)
                    await pilot.pause()
                    t.move_cursor(row=half - 1, animate=False)
                    t0 = time.perf_counter()
                    t.sync(after)
                    await pilot.pause()
                    times[name][table_id].append((time.perf_counter() - t0) * 1000)
    out = {n: {k: statistics.median(v) for k, v in by.items()} for n, by in times.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    res = asyncio.run(measure(args.rows, args.rounds))
    print(f"{args.rows} rows, medians of {args.rounds} rounds, sync to idle (ms); load {load:.1f}")
    print(f"{'key':<14} {'in place':>9} {'rebuild':>9} {'ratio':>7}")
    for name, v in res.items():
        print(f"{name:<14} {v['new']:>9.1f} {v['rebuild']:>9.1f} {v['new'] / v['rebuild']:>7.3f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "ms": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
