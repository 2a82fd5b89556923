"""Short histories of derived figures, for sparklines (pure; fed one snapshot at a time).

A series is keyed by (subject, figure): subject is an instance name or ``"fleet"``.
Missing figures are skipped, so a series holds only real observations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from pdctl.sdk.metrics import Trends
from pdctl.sdk.metrics.monitor import InstanceMetrics, Snapshot

FLEET = "fleet"

Figure = Callable[[InstanceMetrics], float | None]
Grouper = Callable[[InstanceMetrics], Iterable[str]]
"""The group subjects an instance adds its request rate to (e.g. ``role:decode``)."""

INSTANCE_FIGURES: dict[str, Figure] = {
    "req_rate": lambda i: i.request_rate,
    "ttft_p50": lambda i: i.ttft.p50,
    "ttft_p99": lambda i: i.ttft.p99,
    "itl_p50": lambda i: i.itl.p50,
    "itl_p99": lambda i: i.itl.p99,
    "tpot_p50": lambda i: i.tpot.p50,
    "tpot_p99": lambda i: i.tpot.p99,
    "e2e_p50": lambda i: i.e2e.p50,
    "e2e_p99": lambda i: i.e2e.p99,
    "kv_usage": lambda i: i.kv_usage,
    "waiting": lambda i: i.waiting,
    "kv_rate": lambda i: i.transfers.throughput_bps,
    "xfer_p99": lambda i: i.transfers.xfer_time.p99,
    "reg_waiting": lambda i: i.rendezvous.registrations_waiting if i.rendezvous else None,
    "pre_waiting": lambda i: i.rendezvous.prefills_waiting if i.rendezvous else None,
    "writes": lambda i: i.rendezvous.writes_in_flight if i.rendezvous else None,
    "match_p99": lambda i: i.rendezvous.match_wait.p99 if i.rendezvous else None,
    "awaiting": lambda i: i.rendezvous.awaiting_notifications if i.rendezvous else None,
}


class History:
    def __init__(self, points: int = 120, groups: Grouper | None = None) -> None:
        self.points = points
        self.groups = groups
        """Groups whose summed request rate is kept too (one series per group, so a
        group's trend costs one lookup however many members it has)."""
        self._series: dict[tuple[str, str], deque[float]] = {}
        self.updates = 0

    def add(self, subject: str, figure: str, value: float | None) -> None:
        if value is None:
            return
        s = self._series.get((subject, figure))
        if s is None:
            s = self._series[(subject, figure)] = deque(maxlen=self.points)
        s.append(float(value))

    def series(self, subject: str, figure: str) -> list[float]:
        """A fresh list (widgets repaint only when given a new object)."""
        return list(self._series.get((subject, figure), ()))

    def backfill(self, trends: Trends, snap: Snapshot) -> None:
        """Start the series with what came before (Prometheus' range query): each
        instance's request rate and TTFT p50, the groups' and the fleet's summed request
        rates (summed over the members of ``snap`` that have a point at that time).
        Series that already hold points are left as they are."""
        by_name = {i.name: i for i in snap.instances if i.role != "router"}
        sums: dict[str, dict[float, float]] = {}
        for figure, per in trends.items():
            if figure not in INSTANCE_FIGURES:
                continue
            for name, points in per.items():
                inst = by_name.get(name)
                if inst is None or (name, figure) in self._series:
                    continue
                for _, v in points[-self.points :]:
                    self.add(name, figure, v)
                if figure != "req_rate":
                    continue
                subjects = list(self.groups(inst)) if self.groups is not None else []
                if inst.role in ("decode", "colocated"):  # the fleet's rate: the front's
                    subjects.append(FLEET)
                for g in subjects:
                    acc = sums.setdefault(g, {})
                    for t, v in points:
                        acc[t] = acc.get(t, 0.0) + v
        for g, acc in sums.items():
            if (g, "req_rate") not in self._series:
                for t in sorted(acc)[-self.points :]:
                    self.add(g, "req_rate", acc[t])

    def record(self, snap: Snapshot) -> None:
        self.updates += 1
        sums: dict[str, float] = {}
        series, figures = self._series, tuple(INSTANCE_FIGURES.items())
        for inst in snap.instances:
            if inst.health != "UP" or inst.role == "router":
                continue
            name = inst.name
            for figure, get in figures:  # add(), inline: 18 figures of every instance
                value = get(inst)
                if value is None:
                    continue
                kept = series.get((name, figure))
                if kept is None:
                    kept = series[(name, figure)] = deque(maxlen=self.points)
                kept.append(float(value))
            if self.groups is not None and inst.request_rate is not None:
                for g in self.groups(inst):
                    sums[g] = sums.get(g, 0.0) + inst.request_rate
        for g, total in sums.items():
            self.add(g, "req_rate", total)
        s = snap.summary
        self.add(FLEET, "req_rate", s.request_rate)
        self.add(FLEET, "kv_rate", s.transfer_bps)
        self.add(FLEET, "ttft_p99", s.ttft_p99_s)
