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

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from pdctl.sdk.errors import RouterError
from pdctl.sdk.keys import KeySourceError
from pdctl.sdk.router.client import (
    AsyncRouterClient,
    Op,
    drain_op,
    notify_op,
    requests_op,
    set_mode_op,
    set_policy_op,
    state_op,
    wait_drained_op,
)
from pdctl.sdk.router.results import RoutedInstance, RouterState

if TYPE_CHECKING:
    from pdctl.sdk.spec import ApiKeySpec

__all__ = [
    "ApiKeyError",
    "RoutedInstance",
    "RouterControl",
    "RouterControlError",
    "RouterState",
    "read_api_key",
]

T = TypeVar("T")


ApiKeyError = KeySourceError
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


RouterControlError = RouterError
"""The router could not be reached or refused the request (the SDK's one router error)."""


class RouterControl:
    """The router's control endpoints for operator tools (async, one short connection per
    call, so one object serves any event loop). The calls are
    :class:`~pdctl.sdk.router.client.AsyncRouterClient`'s; failures are
    :class:`RouterControlError`."""

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
        self._api_key = api_key
        self._transport = transport

    async def _run(self, op: Op[T]) -> T:
        async with AsyncRouterClient(
            self.url,
            api_key=self._api_key,
            control_timeout_s=self.timeout_s,
            transport=self._transport,
        ) as client:
            return await client.run(op)

    async def state(self) -> RouterState:
        return await self._run(state_op())

    async def drain(self, instance: str, drain: bool = True) -> RouterState:
        """Stop (``drain=True``) or resume routing new requests to ``instance``."""
        return await self._run(drain_op(instance, drain))

    async def notify(self, instance: str, event: str) -> RouterState:
        """Tell the router an instance is ``"up"`` (ready again) or ``"down"`` (stopped,
        failed or restarting), so it stops waiting for its next health check."""
        return await self._run(notify_op(instance, event))

    async def set_mode(self, mode: str) -> RouterState:
        return await self._run(set_mode_op(mode))

    async def set_policy(self, policy: str) -> RouterState:
        """Switch the selection policy (cache_aware only on a router started with it)."""
        return await self._run(set_policy_op(policy))

    async def requests(
        self, limit: int = 200, *, instance: str | None = None, outcome: str | None = None
    ) -> list[dict[str, Any]]:
        """The flight recorder: recent finished requests, newest first, each with its
        timeline as the router sent it (``*_ms`` fields are milliseconds since the router
        received it; :meth:`AsyncRouterClient.requests` gives them typed)."""
        return [t.raw for t in await self._run(requests_op(limit, instance, outcome))]

    async def wait_drained(
        self, instance: str, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> RoutedInstance:
        """Wait until ``instance`` is drained and has no leg in flight."""
        return await self._run(wait_drained_op(instance, timeout_s, poll_s))
