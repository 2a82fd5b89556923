"""The fleet's events for readers: the journal in time order, filtered, followed, and fed
with what a watcher derives from its polls (:mod:`.derive`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.sdk.client import RouterState
from pdctl.sdk.events import kinds as K
from pdctl.sdk.events.actor import actor
from pdctl.sdk.events.audittrail import audit_trail
from pdctl.sdk.events.derive import Observation, changes, from_requests
from pdctl.sdk.events.journal import Journal, ordered
from pdctl.sdk.events.model import Event
from pdctl.sdk.metrics.snapshot import Snapshot


@dataclass(frozen=True)
class EventFilter:
    """Every given criterion must hold; an empty tuple or None does not filter."""

    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    """Instance names (or request ids, alert codes' subjects): exact matches."""
    since: float | None = None
    min_severity: str | None = None

    def matches(self, ev: Event) -> bool:
        if self.kinds and ev.kind not in self.kinds:
            return False
        if self.sources and ev.source not in self.sources:
            return False
        if self.subjects and ev.subject not in self.subjects:
            return False
        if self.since is not None and ev.at < self.since:
            return False
        if self.min_severity is not None:
            order = K.SEVERITIES
            floor = order.index(self.min_severity) if self.min_severity in order else 0
            if order.index(ev.info.severity) < floor:
                return False
        return True

    def check(self) -> None:
        """Raise ValueError naming an unknown kind, source or severity."""
        known_sources = sorted({k.source for k in K.KINDS.values()})
        for k in self.kinds:
            if k not in K.KINDS:
                raise ValueError(f"unknown event kind {k!r}; kinds: {', '.join(sorted(K.KINDS))}")
        for s in self.sources:
            if s not in known_sources:
                raise ValueError(f"unknown source {s!r}; sources: {', '.join(known_sources)}")
        if self.min_severity is not None and self.min_severity not in K.SEVERITIES:
            raise ValueError(
                f"unknown severity {self.min_severity!r}; one of {', '.join(K.SEVERITIES)}"
            )


class EventSource:
    """One fleet's events (its state directory's journal, and the router's audit log read
    beside it: :mod:`.audittrail`). ``writable=False`` (a read-only watcher) derives
    events for its own reading but never writes them down; without a directory (a
    replayed fleet) nothing is kept beyond this object."""

    def __init__(self, fleet_dir: Path | None, *, writable: bool = True) -> None:
        self.journal = Journal.of(fleet_dir) if fleet_dir is not None else None
        self.audit = audit_trail(fleet_dir) if fleet_dir is not None else None
        self.writable = writable and fleet_dir is not None
        self._seen: set[str] | None = None
        self._last: Observation | None = None
        self._pending: list[Event] = []

    def history(self, flt: EventFilter | None = None) -> list[Event]:
        """Everything kept, in time order (the follow position moves to the end)."""
        events = self.journal.read() if self.journal is not None else []
        if self.audit is not None:
            events = ordered(events + self.audit.read())
        self._seen = {e.key for e in events if e.key is not None}
        return [e for e in events if flt is None or flt.matches(e)]

    def new(self, flt: EventFilter | None = None) -> list[Event]:
        """Events since the last :meth:`history` or :meth:`new`: written by anyone, and
        derived here without being written (read-only)."""
        pending, self._pending = self._pending, []
        if self._seen is None:
            self._seen = set()
        out = list(pending)  # derived here, deduplicated when recorded
        appended = self.journal.new() if self.journal is not None else []
        appended += self.audit.new() if self.audit is not None else []
        for e in appended:
            if e.key is not None:
                if e.key in self._seen:
                    continue
                self._seen.add(e.key)
            out.append(e)
        out.sort(key=lambda e: e.at)
        return [e for e in out if flt is None or flt.matches(e)]

    def record(self, events: Iterable[Event]) -> list[Event]:
        """Journal the events whose key was not seen yet; returns those (a read-only
        source keeps them for :meth:`new` instead)."""
        if self._seen is None:
            self.history()
        assert self._seen is not None
        fresh = []
        for e in events:
            if e.key is not None and e.key in self._seen:
                continue
            fresh.append(e)
        if not fresh:
            return []
        if self.writable and self.journal is not None:
            self.journal.append(fresh)
        else:
            for e in fresh:
                if e.key is not None:
                    self._seen.add(e.key)
            self._pending += fresh
        return fresh

    def observe(
        self,
        snapshot: Snapshot | None,
        router: RouterState | None,
        requests: Iterable[Mapping[str, Any]] = (),
        at: float | None = None,
    ) -> list[Event]:
        """Derive events from one poll (against the previous one) and record them."""
        cur = Observation.of(time.time() if at is None else at, snapshot, router)
        derived = changes(self._last, cur) + from_requests(requests)
        self._last = cur
        return self.record(derived)

    def control(
        self,
        what: str,
        subject: str | None,
        *,
        by: str | None = None,
        at: float | None = None,
        via: str | None = None,
    ) -> None:
        """Journal a control action (``restart``, ``drain``, ``mode push``…) and who
        asked for it."""
        when = time.time() if at is None else at
        self.record([Event(K.CONTROL, subject, what, at=when, actor=by or actor(via))])

    async def follow(
        self, flt: EventFilter | None = None, *, interval_s: float = 0.5
    ) -> AsyncIterator[Event]:
        """New events as they are journaled, forever (cancel to stop)."""
        if self._seen is None:
            self.history()
        while True:
            for e in self.new(flt):
                yield e
            await asyncio.sleep(interval_s)
