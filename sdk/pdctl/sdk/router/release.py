"""Releases: the router tells a prefill to free KV that no decode will read.

In push mode the prefill keeps a finished request's KV under a lease until decode's
registration arrives (then WRITEs it) or the lease ends. pdctl's connector adds release
messages on the P<->D side channel, but when that channel is what failed (unreachable,
a decode that died before registering) nothing reaches the prefill and its KV stays held
for the whole lease. The router reaches every prefill over HTTP and knows how each request
ended, so when a disaggregated request ends without decode having read its KV, it sends
that prefill a *release request* (:func:`pdctl.sdk.pd.release_body`). Releases for one
prefill are batched over a few milliseconds into one request.

A release of KV that is already gone (written, expired, never held) is a no-op on the
prefill; one that cannot be delivered (the prefill is down: its KV went with it) is
counted and dropped.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable

from pdctl.sdk.pd import release_body
from pdctl.sdk.router.httpclient import UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.promreg import Registry

BATCH_S = 0.02
"""How long releases for one prefill gather before they are sent together."""
TIMEOUT_S = 10.0
"""A release request's deadline (it queues behind the prefill's running requests)."""
PATH = "/v1/completions"


class KvReleases:
    """Batches and sends release requests to prefills."""

    def __init__(
        self,
        served_name: str,
        registry: Registry,
        *,
        prefills: Iterable[str] = (),
        batch_s: float = BATCH_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.served_name = served_name
        self.batch_s = batch_s
        self.timeout_s = timeout_s
        self._pending: dict[str, tuple[Upstream, list[str]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.counter = registry.counter(
            "pdctl_router_kv_releases_total",
            "Requests whose KV the router asked a prefill to free because decode did not "
            "read it, by prefill and outcome (sent: the prefill took the release request; "
            "failed: it could not be delivered).",
            ("instance", "outcome"),
        )
        self.counter.prime(tuple(prefills), ("sent", "failed"))

    def ask(self, prefill: Upstream, request_ids: Iterable[str]) -> None:
        """Ask ``prefill`` to free the KV of ``request_ids`` (soon, batched)."""
        ids = [r for r in request_ids if r]
        if not ids:
            return
        entry = self._pending.get(prefill.name)
        if entry is not None:
            entry[1].extend(ids)
            return
        self._pending[prefill.name] = (prefill, ids)
        task = asyncio.get_running_loop().create_task(self._flush(prefill.name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, name: str) -> None:
        await asyncio.sleep(self.batch_s)
        prefill, ids = self._pending.pop(name)
        ids = list(dict.fromkeys(ids))
        body = json.dumps(release_body(self.served_name, ids)).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("X-Request-Id", f"pdctl-release-{uuid.uuid4().hex}"),
        ]
        outcome = "failed"
        try:
            async with asyncio.timeout(self.timeout_s):
                r = await prefill.pool.request("POST", PATH, body, headers)
                await r.read()
            if r.status == 200:
                outcome = "sent"
        except (UpstreamError, TimeoutError, OSError):
            pass
        self.counter.inc(name, outcome, by=float(len(ids)))

    async def close(self) -> None:
        """Send what is pending now (best effort, bounded), then stop."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.batch_s + self.timeout_s)
        for t in list(self._tasks):
            t.cancel()
