"""What the blocking and the asyncio client share: the router's URL, key and timeouts,
building an httpx request from a :class:`~pdctl.sdk.client.ops.Call`, and reading the
reply into JSON or a :class:`~pdctl.sdk.errors.RouterError`. No I/O happens here."""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from pdctl.sdk.client.ops import Call
from pdctl.sdk.client.results import Chunk, chunk_of
from pdctl.sdk.errors import RouterError
from pdctl.sdk.sse import EventParser

DEFAULT_TIMEOUT_S = 600.0
"""A completion's limit (the router's own ``request_timeout_s`` default)."""
CONTROL_TIMEOUT_S = 10.0
"""The limit of a control call (state, drain, mode, policy, notify, requests)."""

Verify = bool | str | ssl.SSLContext
"""How an ``https://`` router's certificate is checked: True (the default) against the
system's CAs, a path to a PEM CA bundle (the CA that signed ``router.tls.cert_file``),
an :class:`ssl.SSLContext` (a client certificate for mTLS, say); False turns the check
off (never for a router beyond this machine)."""


def tls_context(verify: Verify) -> ssl.SSLContext | bool:
    """``verify`` as httpx takes it (a bundle's path becomes a context: httpx's string
    form is deprecated); a missing bundle is a ValueError naming it."""
    if isinstance(verify, str):
        try:
            return ssl.create_default_context(cafile=verify)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"cannot load the CA bundle {verify!r}: {e}") from None
    return verify


class BaseClient:
    """The part of :class:`~pdctl.sdk.client.RouterClient` and
    :class:`~pdctl.sdk.client.AsyncRouterClient` that does not depend on how they send."""

    def __init__(
        self, url: str, api_key: str | None, timeout_s: float, control_timeout_s: float
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"router URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.control_timeout_s = control_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _request_args(self, call: Call) -> dict[str, Any]:
        """``call`` as keyword arguments of httpx's ``request()``/``stream()``."""
        return {
            "method": call.method,
            "url": self.url + call.endpoint,
            "json": call.body,
            "params": {k: v for k, v in (call.params or {}).items() if v is not None},
            "headers": self._headers,
            "timeout": self.control_timeout_s if call.control else self.timeout_s,
        }

    def _unreachable(self, e: httpx.HTTPError) -> RouterError:
        why = str(e) or type(e).__name__
        return RouterError(
            f"cannot reach the router at {self.url}: {why}; is the fleet up (`pdctl status`)?",
            message=why,
        )

    def _checked(self, call: Call, r: httpx.Response) -> Any:
        """The reply's JSON, or the router's refusal as a :class:`RouterError` (a read
        response only: a stream's body must have been read first)."""
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code == 200:
            return data
        err = data.get("error") if isinstance(data, dict) else None
        msg = err.get("message") if isinstance(err, dict) else None
        msg = str(msg) if msg else (r.text[:200] or f"HTTP {r.status_code}")
        raise RouterError(
            f"the router answered {r.status_code} to {call.method} {call.endpoint}: {msg}",
            status=r.status_code,
            message=msg,
        )


def chunks_in(parser: EventParser, data: bytes) -> list[Chunk]:
    """The chunks of a stream's next bytes (the OpenAI events among its events)."""
    return [c for c in (chunk_of(e.data) for e in parser.feed(data)) if c is not None]
