"""The fleet's event journal: ``events.jsonl`` in its state directory, one JSON event a
line, appended by the supervisor (lifecycle, control actions) and by whoever watches the
fleet (alerts, router events), read by ``pdctl events`` and the timeline view.

Each event is one ``write`` of one line on a file opened ``O_APPEND``, so writers in
several processes do not interleave inside a line. Past :data:`MAX_BYTES` the file moves
to ``events.1.jsonl`` (the previous one is dropped) and a new one starts; readers read
both. A line that is not an event (a torn write, a hand edit) is skipped and counted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdctl.sdk.events.model import Event

log = logging.getLogger("pdctl.events")

FILE = "events.jsonl"
OLD = "events.1.jsonl"
MAX_BYTES = 4 * 1024 * 1024


def journal_path(fleet_dir: Path) -> Path:
    return fleet_dir / FILE


@dataclass
class Journal:
    path: Path
    max_bytes: int = MAX_BYTES
    skipped: int = 0
    """Lines read that were not events."""
    old_name: str = OLD
    """The previous file, kept after a rotation."""
    convert: Callable[[Any], Event | None] = Event.from_dict
    """One line's JSON object → an event (None: skip it). Another writer's JSON lines
    (the router's audit log) are read as events this way."""
    _offset: int = field(default=0, repr=False)
    _inode: int | None = field(default=None, repr=False)

    @classmethod
    def of(cls, fleet_dir: Path) -> Journal:
        return cls(journal_path(fleet_dir))

    @property
    def old(self) -> Path:
        return self.path.with_name(self.old_name)

    def append(self, events: Iterable[Event]) -> int:
        """Write ``events``; returns how many were written. Never raises: a journal that
        cannot be written is logged and supervision goes on."""
        n = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if self.path.stat().st_size > self.max_bytes:
                    os.replace(self.path, self.old)
            except FileNotFoundError:
                pass
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                for ev in events:
                    os.write(fd, (ev.line() + "\n").encode())
                    n += 1
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("could not write the event journal %s: %s", self.path, e)
        return n

    def _parse(self, text: str) -> list[Event]:
        out = []
        for line in text.split("\n"):
            if not line.strip():
                continue
            try:
                ev = self.convert(json.loads(line))
            except ValueError:
                ev = None
            if ev is None:
                self.skipped += 1
            else:
                out.append(ev)
        return out

    def read(self) -> list[Event]:
        """Every event kept (the previous file's too), in time order, one per key; also
        sets the follow position to the end."""
        events: list[Event] = []
        for p in (self.old, self.path):
            try:
                events += self._parse(p.read_text(encoding="utf-8", errors="replace"))
            except FileNotFoundError:
                continue
        try:
            st = self.path.stat()
            self._offset, self._inode = st.st_size, st.st_ino
        except FileNotFoundError:
            self._offset, self._inode = 0, None
        return ordered(events)

    def new(self) -> list[Event]:
        """Events appended since the last :meth:`read` or :meth:`new` (a rotated file is
        read from its start). Only whole lines: a line being written waits for the next."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if st.st_ino != self._inode or st.st_size < self._offset:
            self._offset, self._inode = 0, st.st_ino
        if st.st_size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        return self._parse(chunk[:end].decode("utf-8", errors="replace"))


def ordered(events: Iterable[Event]) -> list[Event]:
    """Time order (stable), the first event of each key only."""
    seen: set[str] = set()
    out = []
    for ev in sorted(events, key=lambda e: e.at):
        if ev.key is not None:
            if ev.key in seen:
                continue
            seen.add(ev.key)
        out.append(ev)
    return out
