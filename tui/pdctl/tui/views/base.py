"""What every view shares: the frame it draws, the ``/`` filter, the base class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from textual.containers import Vertical

from pdctl.sdk.events import Event
from pdctl.tui.history import History
from pdctl.tui.source import PreflightResult, Update


@dataclass(frozen=True)
class Filter:
    """``/`` text: space-separated terms, all of which must match a row. ``key:value``
    matches one field exactly (``outcome:error``, ``role:decode``, ``instance:decode-0``,
    ``health:DOWN``); a bare word matches any field as a substring."""

    text: str = ""

    def matches(self, fields: Mapping[str, str | None]) -> bool:
        for term in self.text.lower().split():
            key, sep, want = term.partition(":")
            if sep and key in fields:
                got = (fields[key] or "").lower()
                if key == "instance":
                    if want not in got.split():
                        return False
                elif got != want:
                    return False
            elif not any(term in (v or "").lower() for v in fields.values()):
                return False
        return True


@dataclass(frozen=True)
class Frame:
    update: Update
    history: History
    filter: Filter
    expected_bps: float | None = None
    preflight: PreflightResult | None = None
    events: Sequence[Event] | None = None
    """The fleet's events so far, oldest first; None: the source keeps none."""


class View(Vertical):
    """One screenful about one concern. Subclasses draw a :class:`Frame` and name the
    instance under the cursor (for drill-down and actions)."""

    NAME: ClassVar[str] = ""
    KEY: ClassVar[str] = ""
    ALIASES: ClassVar[tuple[str, ...]] = ()
    HINT: ClassVar[str] = ""

    def show(self, frame: Frame) -> None:
        raise NotImplementedError

    def selected_instance(self) -> str | None:
        return None

    def selected_request(self) -> dict[str, Any] | None:
        """The router request under the cursor (the requests view only)."""
        return None
