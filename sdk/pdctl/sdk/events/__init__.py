"""Fleet events in time order: a registry of kinds (:mod:`.kinds`), the journal in the
fleet's state directory (:mod:`.journal`), what watchers derive (:mod:`.derive`) and the
reader (:class:`EventSource`)."""

from __future__ import annotations

from pdctl.sdk.events.actor import actor
from pdctl.sdk.events.journal import Journal, journal_path
from pdctl.sdk.events.kinds import KINDS, Kind, kind, kind_of
from pdctl.sdk.events.model import Event
from pdctl.sdk.events.source import EventFilter, EventSource

__all__ = [
    "KINDS",
    "Event",
    "EventFilter",
    "EventSource",
    "Journal",
    "Kind",
    "actor",
    "journal_path",
    "kind",
    "kind_of",
]
