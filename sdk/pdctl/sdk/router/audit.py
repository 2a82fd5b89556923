"""The router's audit log: one JSON line per control action and per refused
authentication, saying who (the key's name, never the key), what, when, from where and
with what result. Written to a file rotated by size (``router.audit.max_bytes``, keeping
``backups`` old files) or to standard error, and kept in memory for
``GET /v1/pdctl/audit``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

RECENT = 1000


class AuditLog:
    """Append-only JSON lines; ``path`` None keeps entries in memory only, ``"-"`` writes
    them to standard error. A write that fails is counted, never raised: the audit log
    must not take the router down (the entry stays in memory)."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        max_bytes: int = 10 << 20,
        backups: int = 5,
        forward: Callable[[dict[str, Any]], None] | None = None,
    ):
        """``forward``: hand each entry there instead of writing it (a router worker's
        entries go to its parent, the one writer of the file: :meth:`append`)."""
        self.forward = forward
        self.path = None if path is None or path == "-" else Path(path)
        self._stderr = path == "-"
        self.max_bytes, self.backups = max_bytes, backups
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.write_errors = 0
        self._lock = threading.Lock()
        self._fh: TextIO | None = None

    def record(
        self,
        *,
        who: str,
        action: str,
        peer: str,
        result: int,
        detail: dict[str, Any] | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "who": who,
            "tenant": tenant,
            "action": action,
            "from": peer,
            "result": result,
        }
        if detail:
            entry["detail"] = detail
        if self.forward is not None:
            self.forward(entry)
            return entry
        return self.append(entry)

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Keep and write an entry made elsewhere (by :meth:`record`, here or in a worker)."""
        self.recent.append(entry)
        line = json.dumps(entry, sort_keys=True) + "\n"
        if self._stderr:
            sys.stderr.write(line)
        elif self.path is not None:
            self._write(line)
        return entry

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                fh = self._open()
                if fh.tell() + len(line) > self.max_bytes and fh.tell() > 0:
                    self._rotate()
                    fh = self._open()
                fh.write(line)
                fh.flush()
            except OSError:
                self.write_errors += 1

    def _open(self) -> TextIO:
        if self._fh is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._fh = os.fdopen(fd, "a", encoding="utf-8")
        return self._fh

    def _rotate(self) -> None:
        assert self.path is not None
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for i in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            newer = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if newer.exists():
                if i == self.backups:
                    older.unlink(missing_ok=True)
                newer.replace(older)
        if self.backups == 0:
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
