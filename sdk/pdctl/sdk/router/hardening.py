"""The router's defences against hostile clients, below the ASGI app: the limits
(:class:`Limits`, applied by :func:`pdctl.sdk.router.httpproto.hardened_protocol` to
uvicorn's httptools protocol, which has none of them of its own) and the JSON depth check:

* request head (request line and headers) at most ``max_header_bytes`` and
  ``max_headers`` fields (431), received within ``header_timeout_s`` of its first byte
  (408: a slowloris trickling headers);
* a connection that sends nothing is closed after ``header_timeout_s``; between requests
  uvicorn's keep-alive timeout (``idle_timeout_s``) closes idle ones;
* a request body must arrive within ``body_timeout_s`` of its headers (408; the app
  sees a disconnect and cancels the request);
* at most ``max_connections`` connections: a new one past the cap closes the connection
  that has been idle longest (so a flood of idle sockets cannot lock out a health check),
  or, when every connection is busy, is answered 503;
* JSON bodies at most ``max_json_depth`` deep (:func:`json_too_deep`).

With TLS, the verified client certificate (if any) is put in the request's scope as
``scope["extensions"]["tls"]["client_cert_subject"]``, for mTLS on the control endpoints.
Every request's scope also carries ``scope["extensions"][GONE]``, a :class:`Gone` through
which the server tells the app at once that the client went away mid-request, and
``scope["extensions"][WHOLE]``, a :class:`WholeAnswer` that sends an answer known whole
in one step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["GONE", "WHOLE", "Gone", "Limits", "WholeAnswer", "json_too_deep", "open_files_for"]

FDS_PER_CONNECTION = 3
"""File descriptors one client connection may hold in the router: its own socket, the
decode leg's and, in push mode, the prefill leg's while both are in flight."""
FDS_SPARE = 256
"""Descriptors kept for everything else: the listening socket, the health checks, the
metrics scrapes, KV-event subscriptions, log and audit files."""


GONE = "pdctl.gone"
"""The ASGI scope extension (``scope["extensions"][GONE]``) holding a request's
:class:`Gone`."""


class Gone:
    """The server's word that a request's client went away before its answer was
    complete: the app sets :attr:`callback`, the server calls it once when the connection
    is lost with the answer unfinished. (Without it, an app learns of a disconnect only by
    keeping a task waiting on ``receive()`` for ``http.disconnect``: a task, a future and
    their wake-ups per request.)"""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


WHOLE = "pdctl.whole"
"""The ASGI scope extension (``scope["extensions"][WHOLE]``) holding a request's
:class:`WholeAnswer`."""


class WholeAnswer(Protocol):
    """The server's short way to send an answer the app has whole (status, headers, body):
    the head and body written at once and the request finished, where the ASGI way is two
    messages, two awaits and the head's headers checked one by one."""

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Send it (a ``content-length`` is added); False, having sent nothing, when it
        cannot (the answer started, the client gone, writes paused, a header it leaves to
        the ASGI way): the caller then sends the ASGI messages."""
        ...


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: int = 30
    max_connections: int = 4096
    max_json_depth: int = 64


def json_too_deep(obj: Any, limit: int) -> bool:
    """True when ``obj`` nests lists/objects more than ``limit`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict | list):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


def open_files_for(max_connections: int) -> str | None:
    """Raise this process's soft limit on open files to its hard limit (what the router
    may hold at ``max_connections``: :data:`FDS_PER_CONNECTION` each, plus
    :data:`FDS_SPARE`); a warning naming the fix when even the hard limit is lower, else
    None. Past the limit, accepting a connection or opening a leg fails with ``EMFILE``:
    requests fail instead of being refused with a 503 at ``max_connections``."""
    import resource

    need = max_connections * FDS_PER_CONNECTION + FDS_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        soft = hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    return (
        f"router.http.max_connections = {max_connections} needs up to {need} open files, "
        f"but this process may open {soft} (ulimit -n; its hard limit is {hard}): raise the "
        f"limit (ulimit -Hn, a container's nofile ulimit, systemd LimitNOFILE) or lower "
        f"router.http.max_connections to {max(1, (soft - FDS_SPARE) // FDS_PER_CONNECTION)}"
    )
