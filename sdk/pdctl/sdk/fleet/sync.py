"""A thin synchronous facade over :class:`AsyncFleet` for scripts.

The async fleet lives on an event loop in a background thread, so it keeps supervising
(exit detection, control socket) between calls; every method runs the async one there.

    with Fleet.demo() as fleet:
        print(fleet.router.complete("the prefill engine").text)
        print(fleet.snapshot().summary.kv_bytes_moved)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pdctl.sdk.client import RouterClient
from pdctl.sdk.fleet.events import InstanceStatus
from pdctl.sdk.fleet.launcher import AsyncFleet
from pdctl.sdk.fleet.supervisor import router_api_key
from pdctl.sdk.metrics.snapshot import Snapshot
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import SpecLike

T = TypeVar("T")


class Fleet:
    """A local fleet for scripts: ``with Fleet.from_file("pdctl.toml") as fleet:`` brings
    it up (waiting until every instance is ready) and always takes it down on the way
    out. ``kw`` are :class:`AsyncFleet`'s options (``ready_timeout``, ``grace``, …)."""

    def __init__(self, spec: SpecLike, **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="pdctl-fleet"
        )
        self._thread.start()
        self.fleet = AsyncFleet(spec, **kw)
        self._router: RouterClient | None = None

    @classmethod
    def from_file(
        cls, path: str | Path | None = None, overrides: Sequence[str] = (), **kw: Any
    ) -> Fleet:
        """The fleet of a spec file (default ``./pdctl.toml``) with ``PDCTL_`` environment
        variables and ``overrides`` (``KEY=VALUE``) on top."""
        from pdctl.sdk.specload import load_spec

        loaded = load_spec(path, overrides)
        return cls(loaded.spec, source=loaded.source, **kw)

    @classmethod
    def demo(
        cls, overrides: Sequence[str] = (), *, model: str | Path | None = None, **kw: Any
    ) -> Fleet:
        """The embedded CPU demo fleet (one prefill, one decode, the router); builds the
        tiny model first when ``model`` is not given and it is missing."""
        from pdctl.sdk.demo import load_demo_spec

        loaded = load_demo_spec(model, overrides)
        return cls(loaded.spec, source=loaded.source, **kw)

    @property
    def spec(self) -> FleetSpec:
        return self.fleet.spec

    @property
    def router_url(self) -> str:
        """Where this fleet's router listens (``http://HOST:PORT``)."""
        return self.fleet.router_url

    @property
    def router(self) -> RouterClient:
        """A client for this fleet's router (closed with the fleet)."""
        if self._router is None:
            key = router_api_key(self.spec)
            self._router = RouterClient(self.router_url, api_key=key)
        return self._router

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def up(self, wait: bool = True) -> None:
        self._run(self.fleet.up(wait=wait))

    def wait_ready(self, limit_s: float | None = None) -> None:
        self._run(self.fleet.wait_ready(limit_s))

    def status(self) -> list[InstanceStatus]:
        return self._run(self.fleet.status())

    def snapshot(self) -> Snapshot:
        """One typed metrics round: ``fleet.snapshot().summary.kv_bytes_moved``."""
        return self._run(self.fleet.snapshot())

    def restart(self, name: str) -> None:
        """Stop one instance, start it again and wait until it is ready."""
        self._run(self.fleet.restart(name))

    def stop(self, name: str) -> None:
        """Stop one instance and leave it stopped (:meth:`restart` starts it again)."""
        self._run(self.fleet.stop(name))

    def instance_names(self) -> list[str]:
        return self.fleet.instance_names()

    def down(self) -> None:
        self._run(self.fleet.down())

    def close(self) -> None:
        """Take the fleet down (if up) and stop the background loop."""
        try:
            if self._router is not None:
                self._router.close()
            self.down()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> Fleet:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
