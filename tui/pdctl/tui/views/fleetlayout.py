"""How the fleet table lays out a fleet of hundreds: grouped by role, group or host into
aggregate rows that expand, sorted by any column, with the outliers first. Pure: the
instances' rows in, the table's rows out (no widget, no clock).

Aggregate rows sum what adds up (run/wait, req/s, in flight, KV moved, the req/s trend)
and take the worst of what does not (the largest KV usage and TTFT p99, the median of the
members' TTFT and ITL p50); the docs and the view's status line say so.
"""

from __future__ import annotations

import heapq
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from rich.text import Text

from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.tui import fmt
from pdctl.tui.widgets import Cell, Cells

GROUPINGS = ("none", "role", "group", "host")
AUTO_GROUP_AT = 64
"""Instances from which the table opens grouped by role (below it: one row each)."""
OUTLIERS_PER_KIND = 2
"""Instances surfaced per kind of outlier (errors, TTFT p99, queue, KV usage)."""
ROLE_ORDER = {"router": 0, "render": 1, "prefill": 2, "colocated": 2, "decode": 3}
GROUP_PREFIX = "+"
OUTLIER_PREFIX = "!"


@dataclass(frozen=True)
class Row:
    """One instance: its figures, what the router says of it, and how to draw its cells
    (one per column of the fleet table, in :data:`pdctl.tui.views.fleet.COLUMNS` order;
    drawn only when the row is shown: a closed group of 500 costs no formatting)."""

    metrics: InstanceMetrics
    draw: Callable[[], tuple[Cell, ...]]
    in_flight: float | None = None
    running_process: bool | None = None
    """The launcher's process state is running (None: no launcher here)."""

    @cached_property
    def cells(self) -> tuple[Cell, ...]:
        return self.draw()

    def drawn(self) -> tuple[Cell, ...]:
        """:attr:`cells`, as a function: the table calls it for the rows near the
        screen only (one row per instance: 500 rows, one page shown)."""
        return self.cells

    @cached_property
    def order(self) -> tuple[object, ...]:
        """Role order, then the name in natural order (decode-2 before decode-10)."""
        return (ROLE_ORDER.get(self.role, 3), _natural(self.name))

    @property
    def name(self) -> str:
        return self.metrics.name

    @property
    def role(self) -> str:
        return self.metrics.role

    @property
    def group(self) -> str:
        return group_of(self.metrics.name)

    @property
    def host(self) -> str:
        return host_of(self.metrics.url)


@dataclass(frozen=True)
class Arrangement:
    """What the operator chose: grouping (``auto``: by role from :data:`AUTO_GROUP_AT`
    instances), the sort column and direction, and the groups opened."""

    grouping: str = "auto"
    sort: str | None = None
    """A column key; None: role order, then name (natural: decode-2 before decode-10)."""
    descending: bool = True
    expanded: frozenset[str] = field(default_factory=frozenset)

    def resolved(self, instances: int) -> str:
        if self.grouping != "auto":
            return self.grouping
        return "role" if instances >= AUTO_GROUP_AT else "none"

    def next_grouping(self, instances: int) -> Arrangement:
        at = GROUPINGS.index(self.resolved(instances))
        return replace(self, grouping=GROUPINGS[(at + 1) % len(GROUPINGS)], expanded=frozenset())

    def next_sort(self, columns: Sequence[str]) -> Arrangement:
        """The next column to sort by (after the last one: back to role order)."""
        order: list[str | None] = [None, *columns]
        at = order.index(self.sort) if self.sort in order else 0
        return replace(self, sort=order[(at + 1) % len(order)])

    def toggled(self, group: str) -> Arrangement:
        return replace(self, expanded=self.expanded ^ {group})

    def describe(self, instances: int) -> str:
        g = self.resolved(instances)
        grouped = "one row per instance" if g == "none" else f"grouped by {g}"
        order = (
            "role order" if self.sort is None else f"{self.sort} {'↓' if self.descending else '↑'}"
        )
        return f"{grouped} · sorted by {order}"


def group_of(name: str) -> str:
    """The spec group an instance belongs to: its name without the index pdctl appends
    (``decode-b-3`` → ``decode-b``); a name without one is its own group."""
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


def host_of(url: str) -> str:
    rest = url.split("://", 1)[-1]
    host = rest.split("/", 1)[0]
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0]


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


SORT_VALUES: dict[str, Callable[[Row], float | str | None]] = {
    "name": lambda r: r.name,
    "role": lambda r: r.role,
    "endpoint": lambda r: r.metrics.url,
    "health": lambda r: r.metrics.health,
    "state": lambda r: None if r.running_process is None else float(r.running_process),
    "load": lambda r: r.metrics.waiting,
    "kv": lambda r: r.metrics.kv_usage,
    "ttft": lambda r: r.metrics.ttft.p99,
    "itl": lambda r: r.metrics.itl.p50,
    "rate": lambda r: r.metrics.request_rate,
    "inflight": lambda r: r.in_flight,
    "moved": lambda r: r.metrics.transfers.bytes_total,
    "trend": lambda r: r.metrics.request_rate,
    "cache": lambda r: r.metrics.prefix_hit_rate,
}
"""Column key → what sorting by it compares (``load``: the waiting queue; ``ttft``: p99)."""


def sort_rows(rows: Sequence[Row], arrangement: Arrangement) -> list[Row]:
    """``rows`` in the arrangement's order; instances without the figure go last either way."""
    out = sorted(rows, key=lambda r: r.order)
    if arrangement.sort is None or arrangement.sort not in SORT_VALUES:
        return out
    value = SORT_VALUES[arrangement.sort]
    known = [r for r in out if value(r) is not None]
    unknown = [r for r in out if value(r) is None]
    known.sort(key=lambda r: value(r), reverse=arrangement.descending)  # type: ignore[arg-type,return-value]
    return known + unknown


OUTLIER_KINDS: tuple[tuple[str, Callable[[Row], float | None]], ...] = (
    ("down", lambda r: None if r.metrics.health == "UP" and not r.metrics.error else 1.0),
    ("TTFT p99", lambda r: r.metrics.ttft.p99),
    ("queue", lambda r: r.metrics.waiting),
    ("KV", lambda r: r.metrics.kv_usage),
)


def outliers(rows: Sequence[Row], per_kind: int = OUTLIERS_PER_KIND) -> list[tuple[Row, str]]:
    """The engines to look at first: every one that is not UP (up to ``per_kind``), then
    the highest TTFT p99, waiting queue and KV usage (only when above zero, and only when
    the kind's figures differ across the fleet: a uniform fleet has no outlier), each
    with the kinds it stands out in."""
    engines = [r for r in rows if r.role != "router"]
    why: dict[str, list[str]] = {}
    picked: list[Row] = []
    for kind, value in OUTLIER_KINDS:
        known = [(v, r) for r in engines if (v := value(r)) is not None]
        if kind != "down" and len({v for v, _ in known}) < 2:
            continue  # the same everywhere: nobody stands out
        vals = [(v, r) for v, r in known if v > 0]
        # the largest first; among equals, the first in name order (rows come sorted)
        for _, r in heapq.nlargest(per_kind, vals, key=lambda vr: vr[0]):
            if r.name not in why:
                picked.append(r)
                why[r.name] = []
            why[r.name].append(kind)
    return [(r, ", ".join(why[r.name])) for r in picked]


def _sum(xs: Sequence[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return sum(known) if known else None


def _max(xs: Sequence[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return max(known) if known else None


def _median(xs: Sequence[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return statistics.median(known) if known else None


def aggregate(
    label: str, members: Sequence[Row], open_: bool, trend: Sequence[float] = ()
) -> tuple[Cell, ...]:
    """The cells of a group's row (column order of the fleet table); ``trend``: the
    group's summed request rate over time (kept by the history, see :func:`subjects`)."""
    ms = [r.metrics for r in members]
    up = sum(m.health == "UP" for m in ms)
    roles = {r.role for r in members}
    hosts = {r.host for r in members}
    procs = [r.running_process for r in members if r.running_process is not None]
    n = len(members)
    return (
        Text(f"{'▾' if open_ else '▸'} {label} ({n})", style="bold"),
        Text(roles.pop() if len(roles) == 1 else "mixed"),
        next(iter(hosts)) if len(hosts) == 1 else f"{len(hosts)} hosts",
        Text(f"{up}/{n} UP", style="green" if up == n else "bold red"),
        f"{sum(procs)}/{len(procs)} run" if procs else fmt.DASH,
        f"{fmt.count(_sum([m.running for m in ms]))}/{fmt.count(_sum([m.waiting for m in ms]))}",
        fmt.pct(_max([m.kv_usage for m in ms])),
        fmt.ms_pair(_median([m.ttft.p50 for m in ms]), _max([m.ttft.p99 for m in ms])),
        fmt.ms(_median([m.itl.p50 for m in ms])),
        fmt.num(_sum([m.request_rate for m in ms]), 2),
        fmt.count(_sum([r.in_flight for r in members])),
        fmt.size(_sum([m.transfers.bytes_total for m in ms])),
        fmt.spark(trend, 12),
        fmt.DASH,
    )


def _group_key(r: Row, grouping: str) -> str:
    return {"role": r.role, "group": r.group, "host": r.host}[grouping]


def subjects(i: InstanceMetrics) -> tuple[str, ...]:
    """The history subjects of an instance's groups (``role:decode``, ``group:decode-b``,
    ``host:10.0.0.7``): the history sums their request rate for the groups' trends."""
    return (f"role:{i.role}", f"group:{group_of(i.name)}", f"host:{host_of(i.url)}")


@dataclass(frozen=True)
class Plan:
    """The table's rows: (key, cells); group rows' keys start with :data:`GROUP_PREFIX`,
    outliers' with :data:`OUTLIER_PREFIX` (then the instance's name)."""

    rows: list[tuple[str, Cells]]
    grouping: str
    outliers: int
    fallback: dict[str, str]
    """Instance row key → its group row's key (where the cursor goes when it closes)."""


def plan(
    rows: Sequence[Row],
    arrangement: Arrangement,
    trend: Callable[[str], Sequence[float]] = lambda subject: (),
) -> Plan:
    """The table for ``rows`` (already filtered) under ``arrangement``; ``trend`` gives a
    group subject's summed request rate over time (see :func:`subjects`)."""
    grouping = arrangement.resolved(len(rows))
    ordered = sort_rows(rows, arrangement)
    if grouping == "none":
        return Plan([(r.name, r.drawn) for r in ordered], grouping, 0, {})
    out: list[tuple[str, Cells]] = []
    flagged = outliers(ordered)
    for r, why in flagged:
        name = Text(f"! {r.name} ", style="bold yellow")
        name.append(why, style="yellow")
        out.append((OUTLIER_PREFIX + r.name, (name, *r.cells[1:])))
    groups: dict[str, list[Row]] = {}
    for r in ordered:
        if r.role == "router":
            out.append((r.name, r.cells))
            continue
        groups.setdefault(_group_key(r, grouping), []).append(r)
    keys: Mapping[str, Callable[[str], tuple[object, ...]]] = {
        "role": lambda g: (ROLE_ORDER.get(g, 3), g),
        "group": lambda g: (ROLE_ORDER.get(groups[g][0].role, 3), _natural(g)),
        "host": _natural,
    }
    fallback: dict[str, str] = {}
    for g in sorted(groups, key=keys[grouping]):
        gkey = GROUP_PREFIX + g
        is_open = g in arrangement.expanded
        drawn = aggregate(g, groups[g], is_open, trend(f"{grouping}:{g}"))
        out.append((gkey, drawn))
        for r in groups[g]:
            fallback[r.name] = gkey
            if is_open:
                out.append((r.name, r.drawn))
    return Plan(out, grouping, len(flagged), fallback)


def instance_of(key: str | None) -> str | None:
    """The instance a row stands for (None for a group's row)."""
    if key is None or key.startswith(GROUP_PREFIX):
        return None
    return key.removeprefix(OUTLIER_PREFIX)


def group_of_key(key: str | None) -> str | None:
    return key[len(GROUP_PREFIX) :] if key and key.startswith(GROUP_PREFIX) else None
