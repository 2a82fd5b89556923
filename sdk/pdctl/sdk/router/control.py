"""Operator control of a running pdctl router: state, drain, dispatch mode, flight recorder.

The router answers ``GET /v1/pdctl/state``, ``POST /v1/pdctl/drain`` and
``POST /v1/pdctl/mode`` (see :mod:`pdctl.sdk.router.app`). Draining an instance stops
new requests from being routed to it; the legs already in flight finish normally, and
:meth:`RouterControl.wait_drained` waits until none is left.

    ctl = RouterControl("http://127.0.0.1:8000")
    await ctl.drain("prefill-0")
    await ctl.wait_drained("prefill-0")
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from pdctl.sdk.errors import PdctlError

if TYPE_CHECKING:
    from pdctl.sdk.spec import ApiKeySpec


class ApiKeyError(ValueError):
    """The router's API key source is configured but unusable."""


def read_api_key(src: ApiKeySpec | None) -> bytes | None:
    """The router's API key, from the spec's env var or file (the spec never holds it);
    None when none is configured. Raises :class:`ApiKeyError` naming the field."""
    if src is None:
        return None
    if src.env:
        val = os.environ.get(src.env, "")
        if not val:
            raise ApiKeyError(f"router.api_key.env names {src.env}, which is not set")
        return val.encode()
    if src.file:
        try:
            lines = Path(os.path.expanduser(src.file)).read_text().splitlines()
        except OSError as e:
            raise ApiKeyError(f"cannot read router.api_key.file {src.file}: {e}") from None
        if not lines or not lines[0].strip():
            raise ApiKeyError(f"router.api_key.file {src.file} is empty")
        return lines[0].strip().encode()
    return None


class RouterControlError(PdctlError):
    """The router could not be reached or refused the request."""


@dataclass(frozen=True)
class RoutedInstance:
    name: str
    role: str
    url: str
    healthy: bool
    drained: bool
    in_flight: int
    """Legs the router has sent to this instance that have not finished."""
    breaker: str
    kv_index: str | None = None
    """cache_aware: EXACT (from the instance's KV events), DEGRADED (events lagging or
    lost) or FALLBACK (the router's routing history); None with other policies."""
    prefix_hit_rate: float | None = None
    """cache_aware: share of routed prompt blocks the index believed the instance held."""


@dataclass(frozen=True)
class RouterState:
    mode: str
    modes: tuple[str, ...]
    """The modes this fleet supports (``push`` and ``push-sequential`` for push fleets)."""
    instances: tuple[RoutedInstance, ...]

    def instance(self, name: str) -> RoutedInstance:
        for i in self.instances:
            if i.name == name:
                return i
        raise KeyError(name)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RouterState:
        index = (data.get("kv_index") or {}).get("instances") or {}
        return cls(
            mode=str(data.get("mode")),
            modes=tuple(str(m) for m in data.get("modes", ())),
            instances=tuple(
                RoutedInstance(
                    name=str(i["name"]),
                    role=str(i["role"]),
                    url=str(i["url"]),
                    healthy=bool(i["healthy"]),
                    drained=bool(i["drained"]),
                    in_flight=int(i["in_flight"]),
                    breaker=str(i["breaker"]),
                    kv_index=index.get(i["name"], {}).get("state"),
                    prefix_hit_rate=index.get(i["name"], {}).get("predicted_hit_rate"),
                )
                for i in data.get("instances", ())
            ),
        )


class RouterControl:
    """Client for the router's control endpoints (async; one short request per call)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport = transport

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        try:
            async with httpx.AsyncClient(transport=self._transport) as c:
                r = await c.request(
                    method,
                    self.url + path,
                    json=body,
                    params=query,
                    headers=self._headers,
                    timeout=self.timeout_s,
                )
        except httpx.HTTPError as e:
            raise RouterControlError(
                f"cannot reach the router at {self.url}: {e or type(e).__name__}; is the "
                "fleet up (`pdctl status`)?"
            ) from None
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code != 200:
            msg = data.get("error", {}).get("message") if isinstance(data, dict) else None
            raise RouterControlError(
                f"the router refused {method} {path}: {msg or f'HTTP {r.status_code}'}"
            )
        return data

    async def state(self) -> RouterState:
        return RouterState.from_json(await self._call("GET", "/v1/pdctl/state"))

    async def drain(self, instance: str, drain: bool = True) -> RouterState:
        """Stop (``drain=True``) or resume routing new requests to ``instance``."""
        data = await self._call("POST", "/v1/pdctl/drain", {"instance": instance, "drain": drain})
        return RouterState.from_json(data)

    async def notify(self, instance: str, event: str) -> RouterState:
        """Tell the router an instance is ``"up"`` (ready again) or ``"down"`` (stopped,
        failed or restarting), so it stops waiting for its next health check."""
        data = await self._call(
            "POST", "/v1/pdctl/instance", {"instance": instance, "event": event}
        )
        return RouterState.from_json(data)

    async def set_mode(self, mode: str) -> RouterState:
        return RouterState.from_json(await self._call("POST", "/v1/pdctl/mode", {"mode": mode}))

    async def set_policy(self, policy: str) -> RouterState:
        """Switch the selection policy (cache_aware only on a router started with it)."""
        return RouterState.from_json(
            await self._call("POST", "/v1/pdctl/policy", {"policy": policy})
        )

    async def requests(
        self, limit: int = 200, *, instance: str | None = None, outcome: str | None = None
    ) -> list[dict[str, Any]]:
        """The flight recorder: recent finished requests, newest first, each with its
        timeline (``*_ms`` fields are milliseconds since the router received it)."""
        data = await self._call(
            "GET", "/v1/pdctl/requests", limit=limit, instance=instance, outcome=outcome
        )
        return list(data.get("requests", [])) if isinstance(data, dict) else []

    async def wait_drained(
        self, instance: str, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> RoutedInstance:
        """Wait until ``instance`` is drained and has no leg in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            inst = (await self.state()).instance(instance)
            if not inst.drained:
                raise RouterControlError(f"{instance} is not drained (someone resumed it)")
            if inst.in_flight == 0:
                return inst
            if time.monotonic() >= deadline:
                raise RouterControlError(
                    f"{instance} still has {inst.in_flight} request(s) in flight after "
                    f"{timeout_s:g} s"
                )
            await asyncio.sleep(poll_s)
