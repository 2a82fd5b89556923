"""A thin synchronous facade over :class:`AsyncFleet` for scripts.

The async fleet lives on an event loop in a background thread, so it keeps supervising
(exit detection, control socket) between calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pdctl.sdk.fleet.events import InstanceStatus
from pdctl.sdk.fleet.launcher import AsyncFleet
from pdctl.sdk.spec import FleetSpec

T = TypeVar("T")


class Fleet:
    def __init__(self, spec: FleetSpec, **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="pdctl-fleet"
        )
        self._thread.start()
        self.fleet = AsyncFleet(spec, **kw)

    @classmethod
    def from_file(
        cls, path: str | Path | None = None, overrides: tuple[str, ...] = (), **kw: Any
    ) -> Fleet:
        from pdctl.sdk.specload import load_spec

        loaded = load_spec(path, overrides)
        return cls(loaded.spec, source=loaded.source, **kw)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def up(self, wait: bool = True) -> None:
        self._run(self.fleet.up(wait=wait))

    def wait_ready(self, limit_s: float | None = None) -> None:
        self._run(self.fleet.wait_ready(limit_s))

    def status(self) -> list[InstanceStatus]:
        return self._run(self.fleet.status())

    def restart(self, name: str) -> None:
        self._run(self.fleet.restart(name))

    def down(self) -> None:
        self._run(self.fleet.down())

    def close(self) -> None:
        """Take the fleet down (if up) and stop the background loop."""
        try:
            self.down()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> Fleet:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
