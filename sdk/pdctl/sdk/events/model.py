"""One fleet event, as plain data and as one JSON line of the fleet's journal."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.events.kinds import Kind, kind_of


@dataclass(frozen=True)
class Event:
    kind: str
    subject: str | None
    """The instance (or alert code, request id…) it is about; None: the whole fleet."""
    message: str = ""
    at: float = field(default_factory=time.time)
    """Wall-clock seconds (``time.time()``)."""
    actor: str | None = None
    """Who made it happen, for control actions (``user@host via pdctl restart``)."""
    key: str | None = None
    """Identity for events several watchers may derive (two UIs on one fleet): the
    journal keeps the first of each key."""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def info(self) -> Kind:
        return kind_of(self.kind)

    @property
    def source(self) -> str:
        return self.info.source

    @property
    def severity(self) -> str:
        return self.info.severity

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "source": self.source,
            "severity": self.severity,
            "subject": self.subject,
            "message": self.message,
            "actor": self.actor,
            "key": self.key,
            "data": self.data,
        }

    def line(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"), default=str)

    @classmethod
    def from_dict(cls, d: Any) -> Event | None:
        """A journal line's object; None when it is not an event (garbage never raises)."""
        if not isinstance(d, dict):
            return None
        k, at = d.get("kind"), d.get("at")
        if not isinstance(k, str) or not isinstance(at, int | float) or isinstance(at, bool):
            return None

        def opt(name: str) -> str | None:
            v = d.get(name)
            return v if isinstance(v, str) else None

        data = d.get("data")
        return cls(
            kind=k,
            subject=opt("subject"),
            message=opt("message") or "",
            at=float(at),
            actor=opt("actor"),
            key=opt("key"),
            data=data if isinstance(data, dict) else {},
        )
