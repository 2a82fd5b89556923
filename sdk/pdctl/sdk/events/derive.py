"""Events a watcher derives from what it polls: alerts raised and cleared, health
changes, the router's rotation, breakers, drains and mode, and per-request retries,
migrations, KV releases and failures from the router's flight recorder.

Pure: :func:`changes` compares two :class:`Observation` s; :func:`from_requests` reads
``/v1/pdctl/requests`` entries. Every derived event carries a ``key``, so two watchers of
one fleet (or one watcher restarted) journal it once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.client import RouterState
from pdctl.sdk.events import kinds as K
from pdctl.sdk.events.model import Event
from pdctl.sdk.metrics.snapshot import Snapshot

RELEASE_NOTE = "to free the request's KV"
"""The router's timeline note when it asks a prefill to free KV (router/base.py)."""


@dataclass(frozen=True)
class Routed:
    healthy: bool
    breaker: str
    drained: bool


@dataclass(frozen=True)
class Observation:
    """What one poll saw, reduced to what events are made of."""

    at: float
    alerts: Mapping[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    """(code, subject) → (message, since)."""
    health: Mapping[str, str] = field(default_factory=dict)
    routed: Mapping[str, Routed] = field(default_factory=dict)
    mode: str | None = None

    @classmethod
    def of(cls, at: float, snapshot: Snapshot | None, router: RouterState | None) -> Observation:
        alerts: dict[tuple[str, str], tuple[str, float]] = {}
        health: dict[str, str] = {}
        if snapshot is not None:
            alerts = {(a.code, a.subject): (a.message, a.since) for a in snapshot.alerts}
            health = {i.name: i.health for i in snapshot.instances}
        routed = (
            {i.name: Routed(i.healthy, i.breaker, i.drained) for i in router.instances}
            if router
            else {}
        )
        return cls(at, alerts, health, routed, router.mode if router else None)


def _key(*parts: object) -> str:
    return ":".join(str(p) for p in parts)


def changes(prev: Observation | None, cur: Observation) -> list[Event]:
    """What changed from ``prev`` to ``cur`` (``prev`` None: the alerts already firing,
    stamped when they started, and nothing else: a first look is no change)."""
    out: list[Event] = []
    for (code, subject), (message, since) in cur.alerts.items():
        if prev is None or (code, subject) not in prev.alerts:
            out.append(
                Event(K.ALERT_RAISED, subject, f"{code} {message}", at=since,
                      key=_key("alert", code, subject, round(since)), data={"code": code})
            )  # fmt: skip
    if prev is None:
        return out
    for (code, subject), (message, since) in prev.alerts.items():
        if (code, subject) not in cur.alerts:
            out.append(
                Event(K.ALERT_CLEARED, subject, f"{code} cleared: {message}", at=cur.at,
                      key=_key("cleared", code, subject, round(since)), data={"code": code})
            )  # fmt: skip
    for name, h in cur.health.items():
        was = prev.health.get(name)
        if was is not None and was != h:
            out.append(Event(K.HEALTH, name, f"{was} → {h}", at=cur.at))
    for name, r in cur.routed.items():
        was_r = prev.routed.get(name)
        if was_r is None:
            continue
        if was_r.healthy != r.healthy:
            word = "back in rotation" if r.healthy else "out of rotation (down)"
            out.append(Event(K.ROUTED, name, word, at=cur.at))
        if was_r.breaker != r.breaker:
            out.append(Event(K.BREAKER, name, f"breaker {was_r.breaker} → {r.breaker}", at=cur.at))
        if was_r.drained != r.drained:
            out.append(Event(K.DRAIN, name, "drained" if r.drained else "resumed", at=cur.at))
    if prev.mode is not None and cur.mode is not None and prev.mode != cur.mode:
        out.append(Event(K.MODE, "router", f"mode {prev.mode} → {cur.mode}", at=cur.at))
    return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def from_requests(requests: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Retries, migrations, KV releases, canary divergences and failures of finished
    requests, each stamped when the router received the request plus where in it the
    event happened."""
    out: list[Event] = []
    for r in requests:
        rid = r.get("id")
        t0 = _num(r.get("received"))
        if not isinstance(rid, str) or t0 is None or r.get("outcome") == "running":
            continue
        done = t0 + (_num(r.get("done_ms")) or 0.0) / 1000
        who = f"{r.get('prefill') or '-'} → {r.get('decode') or '-'}"
        retries = r.get("retries")
        if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0:
            out.append(
                Event(K.RETRY, rid, f"{who}: {retries} leg(s) re-sent", at=t0,
                      key=_key("retry", rid), data={"retries": retries})
            )  # fmt: skip
        for n, m in enumerate(r.get("migrations") or ()):
            if not isinstance(m, Mapping):
                continue
            at = t0 + (_num(m.get("at_ms")) or 0.0) / 1000
            text = f"decode {m.get('from')} → {m.get('to')}: {m.get('why') or 'no reason given'}"
            out.append(Event(K.MIGRATION, rid, text, at=at, key=_key("migration", rid, n)))
        for note in r.get("notes") or ():
            if isinstance(note, str) and RELEASE_NOTE in note:
                reason = r.get("error") or r.get("outcome")
                out.append(
                    Event(K.KV_RELEASE, rid, f"{note.split(': ', 1)[-1]} ({reason})", at=done,
                          key=_key("release", rid), data={"reason": reason})
                )  # fmt: skip
        canary = r.get("canary")
        if isinstance(canary, Mapping) and canary.get("result") == "diverged":
            out.append(
                Event(K.CANARY_DIVERGED, rid, f"{who}: {canary.get('detail') or 'diverged'}",
                      at=done, key=_key("canary", rid), data={"on": canary.get("on")})
            )  # fmt: skip
        if r.get("outcome") == "error":
            out.append(
                Event(K.REQUEST_FAILED, rid, f"{who}: {r.get('error') or 'error'}", at=done,
                      key=_key("failed", rid), data={"status": r.get("status")})
            )  # fmt: skip
    return out
