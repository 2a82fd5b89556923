"""The views, in key order (1 … 8)."""

from __future__ import annotations

from pdctl.tui.views.base import View
from pdctl.tui.views.events import EventsView
from pdctl.tui.views.fleet import FleetView
from pdctl.tui.views.latency import LatencyView
from pdctl.tui.views.planner import PlannerView
from pdctl.tui.views.preflight import PreflightView
from pdctl.tui.views.rendezvous import RendezvousView
from pdctl.tui.views.requests import RequestsView
from pdctl.tui.views.transfers import TransfersView

VIEWS: tuple[type[View], ...] = (
    FleetView,
    RendezvousView,
    TransfersView,
    LatencyView,
    RequestsView,
    PreflightView,
    PlannerView,
    EventsView,
)


def view_named(text: str) -> type[View] | None:
    """The view called ``text`` or one of its aliases, else the only one it prefixes."""
    t = text.strip().lower().lstrip(":")
    for v in VIEWS:
        if t == v.NAME or t in v.ALIASES or t == v.KEY:
            return v
    hits = [v for v in VIEWS if v.NAME.startswith(t)] if t else []
    return hits[0] if len(hits) == 1 else None
