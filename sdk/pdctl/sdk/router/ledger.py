"""The ledger: how every request ended — the recent history, the finished-request
metrics and spans, and the KV release a request that ended without decode reading its KV
owes its prefill."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from pdctl.sdk.router import tracing
from pdctl.sdk.router.predictor import Predictor
from pdctl.sdk.router.release import KvReleases
from pdctl.sdk.router.replies import RouterMode
from pdctl.sdk.router.timeline import RouterMetrics, Timeline


class HasMode(Protocol):
    """What the ledger reads of the instance set: the mode requests end in."""

    mode: RouterMode


class Ledger:
    """Settles timelines; keeps the last ``history`` of them."""

    def __init__(
        self,
        metrics: RouterMetrics,
        instances: HasMode,
        releases: KvReleases | None = None,
        history: int = 1000,
        predictor: Predictor | None = None,
    ) -> None:
        """``predictor``: learns each pair's TTFT from the requests that end well."""
        self.metrics, self.instances, self.releases = metrics, instances, releases
        self.predictor = predictor
        self.history: deque[Timeline] = deque(maxlen=history)

    def finish(self, tl: Timeline, outcome: str, status: int, error: str | None = None) -> None:
        """Settle ``tl`` (once: later calls are no-ops)."""
        if tl.done is not None:
            return
        tl.done = tl.mark()
        tl.outcome = outcome
        tl.status = status
        if error:
            tl.error = error
        self.metrics.finished(tl, self.instances.mode, outcome)
        if self.predictor is not None:
            self.predictor.observe(tl)
        tracing.finished(tl)
        self.history.append(tl)
        if outcome != "ok":
            # decode did not read the KV a prefill may hold for this request: free it now
            self.release_kv(tl)

    def release_kv(self, tl: Timeline) -> None:
        """Ask the prefill that may hold KV for ``tl`` (pushed to a decode that did not
        read it: failed, or left by a migration) to free it; a no-op on KV already
        written. The request holds none from then on."""
        if tl.kv_on is not None and self.releases is not None:
            prefill, rid = tl.kv_on
            self.releases.ask(prefill, (rid,))
            tl.note(f"asked prefill {prefill.name} to free the request's KV")
        tl.kv_on = None

    def recent(
        self, limit: int = 100, match: Callable[[Timeline], bool] | None = None
    ) -> list[dict[str, Any]]:
        items = [t for t in reversed(self.history) if match is None or match(t)]
        return [t.as_dict() for t in items[:limit]]

    async def close(self) -> None:
        if self.releases is not None:
            await self.releases.close()
