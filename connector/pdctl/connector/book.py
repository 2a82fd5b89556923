"""Rendezvous bookkeeping for the push protocol: events in, gauges and observations out.

Pure Python (no vLLM, no NIXL): the connector adapter (:mod:`pdctl.connector.push`)
reports what vLLM's push worker decided — a registration or a finished prefill arrived
and was matched or parked, WRITEs completed, the lease released a request — and this
book keeps the live queues and turns every change into metric events for the stats
path. It does not match anything itself, so it can never disagree with vLLM about
which entries paired up; it only remembers when each entry arrived.

Events are ``(kind, name, label, value)`` lists: ``"c"`` adds ``value`` to counter
``name{label}``, ``"h"`` observes ``value`` in histogram ``name``, ``"g"`` sets gauge
``name``. Lists of lists survive vLLM's msgpack hop between processes and aggregate by
concatenation, as vLLM's own NIXL stats do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pdctl.sdk.metrics import rendezvous as rv

Event = list[object]


@dataclass
class _Entry:
    arrived: float


@dataclass
class RendezvousBook:
    expire_after_s: float = 120.0
    """Unmatched registrations, unfinished WRITEs and unanswered decode registrations
    older than this are dropped and counted as expired (vLLM's lease handles finished
    prefills itself and reports them through :meth:`finished_sending`)."""

    registrations: dict[str, _Entry] = field(default_factory=dict)
    prefills: dict[str, _Entry] = field(default_factory=dict)
    in_flight: dict[str, _Entry] = field(default_factory=dict)
    """Prefill request id → time of the match."""
    awaiting: dict[str, _Entry] = field(default_factory=dict)
    """Decode request id → time its registration was sent."""
    released_early: dict[str, _Entry] = field(default_factory=dict)
    """Prefill request id → when vLLM released it before the book heard it finish."""
    released: dict[str, _Entry] = field(default_factory=dict)
    """Prefill request id → when the connector let go of its KV before the lease ended
    (so that vLLM's report of the release is not counted as an expiry)."""
    _events: list[Event] = field(default_factory=list)
    _last_gauges: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ prefill side

    def registration(self, reg_id: str, now: float, matched_prefill: str | None) -> None:
        """A decode registration arrived; vLLM matched it with ``matched_prefill``'s
        finished blocks, or parked it (None)."""
        if matched_prefill is None:
            self._park(self.registrations, reg_id, now)
            return
        self._match(
            matched_prefill, self.prefills.pop(matched_prefill, None), now, rv.PREFILL_FIRST
        )

    def prefill(self, fin_id: str, now: float, matched_registration: str | None) -> None:
        """A prefill finished; vLLM matched it with ``matched_registration`` or parked it."""
        early = self.released_early.pop(fin_id, None)
        if matched_registration is None and early is not None:
            return  # its blocks were already released (its decode let go first)
        if matched_registration is None:
            self._park(self.prefills, fin_id, now)
            return
        first = self.registrations.pop(matched_registration, None)
        self._match(fin_id, first, now, rv.REGISTRATION_FIRST)

    def registration_dropped(self, reg_id: str) -> None:
        """A parked registration was let go (its decode aborted, or the prefill it waits
        for was dropped): no longer waiting, and not an expiry either."""
        self.registrations.pop(reg_id, None)

    def pushed_bytes(self, n: float) -> None:
        if n > 0:
            self._events.append(["c", rv.BYTES_PUSHED, "", float(n)])

    def released_by_connector(self, fin_id: str, reason: str, now: float) -> None:
        """The connector let go of a finished prefill's KV before its lease ended
        (``reason``: its decode aborted, its WRITE or handshake failed): counted as a
        release, never as an expiry."""
        self._events.append(["c", rv.RELEASED, reason, 1.0])
        self.released[fin_id] = _Entry(now)
        if self.prefills.pop(fin_id, None) is None and self.in_flight.pop(fin_id, None) is None:
            self.released_early[fin_id] = _Entry(now)  # the writer has not reported it yet

    def finished_sending(self, fin_id: str, now: float) -> None:
        """vLLM released a prefill's blocks: its WRITEs completed, or its lease ran out."""
        if self.released.pop(fin_id, None) is not None:
            return  # counted by released_by_connector
        started = self.in_flight.pop(fin_id, None)
        if started is not None:
            self._events.append(["h", rv.MATCH_TO_DONE, "", max(0.0, now - started.arrived)])
        elif self.prefills.pop(fin_id, None) is not None:
            self._events.append(["c", rv.EXPIRED, rv.SIDE_PREFILL, 1.0])
        else:
            # released before the writer thread saw the prefill finish (an early release
            # races the writer): remember it so that late report does not park it
            self.released_early[fin_id] = _Entry(now)

    # ------------------------------------------------------------------ decode side

    def registration_sent(self, req_id: str, now: float) -> None:
        self._events.append(["c", rv.REGISTRATIONS_SENT, "", 1.0])
        if req_id in self.awaiting:
            self._events.append(["c", rv.DUPLICATES, "", 1.0])
        self.awaiting[req_id] = _Entry(now)

    def received(self, req_id: str, now: float) -> None:
        """All expected WRITE notifications for a registered request arrived."""
        sent = self.awaiting.pop(req_id, None)
        if sent is not None:
            self._events.append(
                ["h", rv.REGISTRATION_TO_NOTIFIED, "", max(0.0, now - sent.arrived)]
            )

    def kv_verified(self, result: str) -> None:
        self._events.append(["c", rv.KV_VERIFY, result, 1.0])

    def receive_failed(self, req_id: str) -> None:
        if self.awaiting.pop(req_id, None) is not None:
            self._events.append(["c", rv.RECEIVE_FAILURES, "", 1.0])

    # ------------------------------------------------------------------ both

    def expire(self, now: float) -> None:
        """Drop entries older than ``expire_after_s`` (counted, never silently)."""
        limit = now - self.expire_after_s
        for table, counter, label in (
            (self.registrations, rv.EXPIRED, rv.SIDE_REGISTRATION),
            (self.in_flight, rv.EXPIRED, rv.SIDE_WRITE),
            (self.awaiting, rv.RECEIVE_FAILURES, ""),
        ):
            for key in [k for k, e in table.items() if e.arrived < limit]:
                del table[key]
                self._events.append(["c", counter, label, 1.0])
        for table in (self.released_early, self.released):
            for key in [k for k, e in table.items() if e.arrived < limit]:
                del table[key]

    def gauges(self) -> dict[str, float]:
        return {
            rv.REGISTRATIONS_WAITING: float(len(self.registrations)),
            rv.PREFILLS_WAITING: float(len(self.prefills)),
            rv.WRITES_IN_FLIGHT: float(len(self.in_flight)),
            rv.AWAITING_NOTIFICATIONS: float(len(self.awaiting)),
        }

    def drain(self, now: float) -> list[Event]:
        """Events since the last drain, plus a gauge event for every gauge that changed
        (so the exported gauges settle on the final value when traffic stops)."""
        self.expire(now)
        out, self._events = self._events, []
        for name, value in self.gauges().items():
            if self._last_gauges.get(name) != value:
                out.append(["g", name, "", value])
                self._last_gauges[name] = value
        return out

    # ------------------------------------------------------------------ internals

    def _park(self, table: dict[str, _Entry], key: str, now: float) -> None:
        if key in table:
            # a retried or duplicated id: vLLM keeps the newest, so do we
            self._events.append(["c", rv.DUPLICATES, "", 1.0])
        table[key] = _Entry(now)

    def _match(self, fin_id: str, first: _Entry | None, now: float, order: str) -> None:
        wait = max(0.0, now - first.arrived) if first is not None else 0.0
        self._events.append(["c", rv.MATCHES, order, 1.0])
        self._events.append(["h", rv.MATCH_WAIT, "", wait])
        self.in_flight[fin_id] = _Entry(now)


def fold(events: list[Event]) -> Iterator[tuple[str, str, str, float]]:
    """Validated ``(kind, name, label, value)`` tuples; malformed events are skipped."""
    known = {m.name for m in rv.METRICS}
    for ev in events:
        if not isinstance(ev, (list, tuple)) or len(ev) != 4:
            continue
        kind, name, label, value = ev
        if kind not in ("c", "h", "g") or name not in known or not isinstance(label, str):
            continue
        if not isinstance(value, (int, float)):
            continue
        yield str(kind), str(name), label, float(value)
