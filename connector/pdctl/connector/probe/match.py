"""Push rendezvous as pure state machines: events in, actions out (no NIXL, no clock).

:class:`Matcher` is the initiator's side: a target's registration and the initiator's
finished source blocks for the same request may arrive in either order; whichever comes
second triggers a :class:`Write`. Ids match exactly first, then by base id (the random
``-xxxxxxxx`` suffix stripped). A second registration or finished entry for a parked id
replaces the first (a retry carries the current blocks); one for an id already written
within ``remember_s`` is a :class:`Duplicate` and ignored (writing twice could land in
blocks the target has reused). Unmatched entries older than ``expire_after_s`` expire.

:class:`NotifCounter` is the target's side: a request is received once one completion
notification per initiator rank has arrived; malformed, unexpected, repeated or missing
notifications become :class:`Problem` / :class:`Missing`, never a wait without end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeVar

from pdctl.connector.probe.protocol import (
    ProtocolError,
    Registration,
    base_request_id,
    parse_completion,
)

Kind = Literal["registration", "finished"]


@dataclass(frozen=True)
class Finished:
    """The initiator's source blocks for a request are ready to send."""

    request_id: str
    block_ids: tuple[int, ...]


_E = TypeVar("_E", Registration, Finished)


@dataclass(frozen=True)
class Write:
    registration: Registration
    finished: Finished
    first: Kind
    """Which side arrived first."""
    waited_s: float
    """How long the first one was parked."""


@dataclass(frozen=True)
class Parked:
    kind: Kind
    request_id: str


@dataclass(frozen=True)
class Replaced:
    """A retry replaced a parked entry with the same (base) id."""

    kind: Kind
    request_id: str
    replaced_id: str


@dataclass(frozen=True)
class Duplicate:
    """An entry for a request that was already written; ignored."""

    kind: Kind
    request_id: str


@dataclass(frozen=True)
class Expired:
    kind: Kind
    request_id: str
    age_s: float


Action = Write | Parked | Replaced | Duplicate | Expired


@dataclass
class Matcher:
    expire_after_s: float = 30.0
    remember_s: float = 60.0
    registrations: dict[str, tuple[Registration, float]] = field(default_factory=dict)
    finished: dict[str, tuple[Finished, float]] = field(default_factory=dict)
    _written: dict[str, float] = field(default_factory=dict)
    """Base ids written → when."""

    def on_registration(self, reg: Registration, now: float) -> list[Action]:
        rid = reg.request_id
        if self._was_written(rid, now):
            return [Duplicate("registration", rid)]
        hit = _pop(self.finished, rid)
        if hit is not None:
            fin, since = hit
            return [self._write(reg, fin, "finished", now - since, now)]
        return self._park(self.registrations, "registration", rid, reg, now)

    def on_finished(self, fin: Finished, now: float) -> list[Action]:
        rid = fin.request_id
        if self._was_written(rid, now):
            return [Duplicate("finished", rid)]
        hit = _pop(self.registrations, rid)
        if hit is not None:
            reg, since = hit
            return [self._write(reg, fin, "registration", now - since, now)]
        return self._park(self.finished, "finished", rid, fin, now)

    def expire(self, now: float) -> list[Action]:
        out: list[Action] = []
        out += _expire(self.registrations, "registration", now, self.expire_after_s)
        out += _expire(self.finished, "finished", now, self.expire_after_s)
        for base, when in list(self._written.items()):
            if now - when > self.remember_s:
                del self._written[base]
        return out

    def _was_written(self, rid: str, now: float) -> bool:
        when = self._written.get(base_request_id(rid))
        return when is not None and now - when <= self.remember_s

    def _write(
        self, reg: Registration, fin: Finished, first: Kind, waited: float, now: float
    ) -> Write:
        self._written[base_request_id(reg.request_id)] = now
        self._written[base_request_id(fin.request_id)] = now
        return Write(reg, fin, first, waited)

    def _park(
        self, table: dict[str, tuple[_E, float]], kind: Kind, rid: str, entry: _E, now: float
    ) -> list[Action]:
        old = _pop(table, rid)
        table[rid] = (entry, now)
        if old is None:
            return [Parked(kind, rid)]
        old_id = old[0].request_id
        return [Replaced(kind, rid, old_id)]


def _pop(table: dict[str, tuple[_E, float]], rid: str) -> tuple[_E, float] | None:
    """Exact id first, then the oldest entry with the same base id."""
    if rid in table:
        return table.pop(rid)
    base = base_request_id(rid)
    for key in table:
        if base_request_id(key) == base:
            return table.pop(key)
    return None


def _expire(
    table: dict[str, tuple[_E, float]], kind: Kind, now: float, after: float
) -> list[Action]:
    out: list[Action] = []
    for rid, (_, since) in list(table.items()):
        if now - since > after:
            del table[rid]
            out.append(Expired(kind, rid, now - since))
    return out


# ------------------------------------------------------------------------ target side


@dataclass(frozen=True)
class Received:
    request_id: str
    elapsed_s: float
    """From :meth:`NotifCounter.expect` to the last notification."""


@dataclass(frozen=True)
class Problem:
    kind: Literal["malformed", "unexpected", "repeated", "tp_mismatch"]
    request_id: str | None
    detail: str


@dataclass(frozen=True)
class Missing:
    request_id: str
    got: int
    expected: int
    age_s: float


@dataclass
class _Waiting:
    expected: int
    since: float
    senders: set[str] = field(default_factory=set)


@dataclass
class NotifCounter:
    timeout_s: float = 30.0
    remember_s: float = 60.0
    waiting: dict[str, _Waiting] = field(default_factory=dict)
    _closed: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Request id → ("received" | "expired", when): explains late notifications."""

    def expect(self, request_id: str, count: int, now: float) -> None:
        if count < 1:
            raise ValueError("a request needs at least one notification")
        self.waiting[request_id] = _Waiting(count, now)
        self._closed.pop(request_id, None)

    def on_notif(self, sender: str, msg: bytes, now: float) -> Received | Problem | None:
        try:
            rid, tp = parse_completion(msg)
        except ProtocolError as e:
            return Problem("malformed", None, f"from {sender}: {e}")
        w = self.waiting.get(rid)
        if w is None:
            closed = self._closed.get(rid)
            why = f"after it was {closed[0]}" if closed else "for a request never registered"
            return Problem("unexpected", rid, f"notification from {sender} {why}")
        if tp != w.expected:
            return Problem(
                "tp_mismatch",
                rid,
                f"{sender} says the initiator has {tp} rank(s); {w.expected} notification(s) "
                "are expected — both ends must agree on --tp",
            )
        if sender in w.senders:
            return Problem("repeated", rid, f"second notification from {sender}; not counted")
        w.senders.add(sender)
        if len(w.senders) < w.expected:
            return None
        del self.waiting[rid]
        self._closed[rid] = ("received", now)
        return Received(rid, now - w.since)

    def expire(self, now: float) -> list[Missing]:
        out: list[Missing] = []
        for rid, w in list(self.waiting.items()):
            if now - w.since > self.timeout_s:
                del self.waiting[rid]
                self._closed[rid] = ("expired", now)
                out.append(Missing(rid, len(w.senders), w.expected, now - w.since))
        for rid, (_, when) in list(self._closed.items()):
            if now - when > self.remember_s:
                del self._closed[rid]
        return out
