"""Stage saturation from the instances' own gauges, read from each one's ``/metrics``.

The gauges are vLLM's, as its Prometheus logger names them (``vllm/v1/metrics/loggers.py``
in vLLM 0.32 and 0.33, ``PrometheusStatLogger``): ``vllm:num_requests_waiting``,
``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` (0-1). An instance is
saturated when its waiting queue or its KV usage reaches its threshold; a stage (prefill
or decode) is saturated when every eligible instance of it is (one with room can take the
request). A reading older than ``stale_after_s``, or none at all, is *unknown*, and an
unknown instance is never taken for saturated (llm-d-router #2165: stale metrics mistaken
for overload shed a healthy fleet)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdctl.sdk.metrics.promtext import parse_text, total
from pdctl.sdk.router.httpclient import Pools, UpstreamError
from pdctl.sdk.router.instances import Upstream

Clock = Callable[[], float]

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
GAUGES = (WAITING, RUNNING, KV_USAGE)


@dataclass(frozen=True)
class Reading:
    """One instance's gauges at ``at`` (monotonic seconds); None where it exports none."""

    waiting: float | None
    running: float | None
    kv_usage: float | None
    at: float


@dataclass
class Thresholds:
    """Changeable at run time (``POST /v1/pdctl/admission``); 0 turns one off."""

    max_waiting: int
    max_kv_usage: float
    stale_after_s: float


def reading_of(text: str, at: float) -> Reading:
    """The gauges in a ``/metrics`` payload (summed over an instance's engines)."""
    samples, _ = parse_text(text, GAUGES)
    kv = [s.value for s in samples if s.name == KV_USAGE]
    return Reading(total(samples, WAITING), total(samples, RUNNING), max(kv) if kv else None, at)


class Saturation:
    """The latest reading of every instance, and the stage verdicts over them."""

    def __init__(
        self,
        thresholds: Thresholds,
        interval_s: float,
        timeout_s: float = 2.0,
        clock: Clock = time.monotonic,
        busy: Callable[[], bool] = lambda: True,
    ) -> None:
        self.thresholds = thresholds
        self.interval_s, self.timeout_s, self.clock = interval_s, timeout_s, clock
        self.busy = busy
        """Whether the router has requests in flight or queued: an idle router reads
        nothing (its instances' readings go stale, which is unknown, never overload),
        so an idle fleet is not woken every second to render its metrics."""
        self.readings: dict[str, Reading] = {}
        self.pools = Pools()
        """Connections of its own: a scrape never holds a connection a leg could use."""
        self._task: asyncio.Task[None] | None = None

    def saturated(self, u: Upstream) -> bool:
        """Whether ``u``'s fresh reading is at a threshold (unknown: False)."""
        r = self.readings.get(u.name)
        th = self.thresholds
        if r is None or self.clock() - r.at > th.stale_after_s:
            return False
        if th.max_waiting and r.waiting is not None and r.waiting >= th.max_waiting:
            return True
        return bool(th.max_kv_usage and r.kv_usage is not None and r.kv_usage >= th.max_kv_usage)

    def stage_saturated(self, pool: Sequence[Upstream]) -> bool:
        """Every eligible instance of the stage saturated (no eligible one: False, that
        is the instance set's 503, not overload)."""
        live = [u for u in pool if u.eligible() and not u.drained]
        return bool(live) and all(self.saturated(u) for u in live)

    def known(self, u: Upstream) -> bool:
        r = self.readings.get(u.name)
        return r is not None and self.clock() - r.at <= self.thresholds.stale_after_s

    # ------------------------------------------------------------------ scraping

    def start(self, upstreams: Sequence[Upstream]) -> None:
        if self._task is None and self.interval_s > 0:
            self._task = asyncio.create_task(self._loop(list(upstreams)))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.pools.close()

    async def _loop(self, ups: list[Upstream]) -> None:
        while True:
            if self.busy():
                await asyncio.gather(*(self.scrape(u) for u in ups))
            await asyncio.sleep(self.interval_s)

    async def scrape(self, u: Upstream) -> None:
        """Read ``u``'s gauges; a failed or garbled read leaves the last one to go stale."""
        try:
            async with asyncio.timeout(self.timeout_s):
                r = await self.pools.get(u.url).request("GET", "/metrics")
                raw = await r.read()
        except (UpstreamError, TimeoutError, OSError):
            return
        if r.status != 200:
            return
        reading = reading_of(raw.decode("utf-8", "replace"), self.clock())
        if reading.waiting is None and reading.kv_usage is None:
            return  # not a vLLM (a mock, a proxy): nothing known
        self.readings[u.name] = reading
