"""Probing a listener the way an outsider would: no key, no client certificate, nothing
that changes the fleet (routes that act are asked with the wrong method; see
:mod:`.vllmroutes`). Every probe has a short timeout; a listener that hangs or answers
garbage gives a closed answer with a note, never an exception."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat

import httpx

from pdctl.sdk.audit.model import Answer, Listener
from pdctl.sdk.audit.vllmroutes import PUBLIC, ROUTES, Route, infer_body

TIMEOUT_S = 3.0

ROUTER_ROUTES: tuple[tuple[str, str, bool], ...] = (
    # (method, path, public by design)
    ("GET", "/health", True),
    ("GET", "/metrics", True),
    ("GET", "/v1/models", False),
    ("POST", "/v1/completions", False),
    ("GET", "/v1/pdctl/state", False),
    ("GET", "/v1/pdctl/requests", False),
    ("GET", "/v1/pdctl/audit", False),
    # control: GET answers 405 once past the key check, 401/403 before it
    ("GET", "/v1/pdctl/drain", False),
    ("GET", "/v1/pdctl/mode", False),
    ("GET", "/v1/pdctl/instance", False),
    ("GET", "/v1/pdctl/policy", False),
)


def target(listener: Listener) -> str:
    """Where to connect: a wildcard bind is reached on loopback, anything else as bound."""
    host = listener.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]" if ":" in host else host


def base_url(listener: Listener, tls: bool = False) -> str:
    return f"{'https' if tls else 'http'}://{target(listener)}:{listener.port}"


def _opened(status: int, how: str) -> tuple[bool, str]:
    if status in (401, 403):
        return False, "refused without credentials"
    if status == 404:
        return False, "not registered"
    if status == 405:
        return (how == "method"), "route there, nothing in front of it"
    return True, ""


async def _ask(
    c: httpx.AsyncClient, method: str, url: str, body: dict[str, object] | None
) -> tuple[int | None, str]:
    try:
        r = await c.request(method, url, json=body)
    except httpx.HTTPError as e:
        return None, f"no answer ({type(e).__name__})"
    return r.status_code, ""


async def probe_vllm(
    listener: Listener,
    model: str,
    *,
    routes: tuple[Route, ...] = ROUTES,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[Answer, ...]:
    """Every route of :data:`~.vllmroutes.ROUTES` on one vLLM server."""
    url = base_url(listener)
    out: list[Answer] = []
    async with httpx.AsyncClient(timeout=TIMEOUT_S, transport=transport, verify=False) as c:
        for r in routes:
            method = "POST" if r.how == "infer" else "GET"
            body = infer_body(r.path, model) if r.how == "infer" else None
            status, err = await _ask(c, method, url + r.path, body)
            if status is None:
                out.append(Answer(f"{method} {r.path}", None, False, note=err))
                if err.startswith("no answer (Connect"):
                    break  # nothing listens: one answer says so
                continue
            opened, note = _opened(status, r.how)
            out.append(Answer(f"{method} {r.path}", status, opened, r.path in PUBLIC, note))
    return tuple(out)


async def probe_router(
    listener: Listener, *, tls: bool = False, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[Answer, ...]:
    """The router's inference, state and control routes, without a key (over TLS without
    the CA when the router serves TLS: an outsider does not have it either)."""
    url = base_url(listener, tls)
    out: list[Answer] = []
    body = {"prompt": "audit", "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(timeout=TIMEOUT_S, transport=transport, verify=False) as c:
        for method, path, public in ROUTER_ROUTES:
            how = "method" if method == "GET" and path.rsplit("/", 1)[-1] in _CONTROL else "get"
            status, err = await _ask(c, method, url + path, body if method == "POST" else None)
            if status is None:
                out.append(Answer(f"{method} {path}", None, False, note=err))
                continue
            opened, note = _opened(status, how)
            out.append(Answer(f"{method} {path}", status, opened, public, note))
    return tuple(out)


_CONTROL = frozenset({"drain", "mode", "instance", "policy"})


async def probe_tcp(listener: Listener) -> tuple[Answer, ...]:
    """Does it accept a TCP connection (the side channel's and ZMQ's protocols have no
    authentication: a connection accepted is a connection served)."""
    try:
        _, w = await asyncio.wait_for(
            asyncio.open_connection(target(listener).strip("[]"), listener.port), TIMEOUT_S
        )
    except (OSError, TimeoutError) as e:
        return (Answer("TCP connect", None, False, note=f"refused ({type(e).__name__})"),)
    w.close()
    with contextlib.suppress(OSError):
        await w.wait_closed()
    return (Answer("TCP connect", None, True, note="accepted; the protocol has no authentication"),)


def socket_mode(path: str) -> int | None:
    """A unix socket's permission bits (None when it is gone or not a socket)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISSOCK(st.st_mode) else None
