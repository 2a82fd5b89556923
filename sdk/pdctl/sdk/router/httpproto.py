"""The hardened HTTP protocol itself: uvicorn's httptools protocol with the limits of
:mod:`pdctl.sdk.router.hardening` (which says what each one does). Imports uvicorn, so only
the server loads it (:func:`hardened_protocol`)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
)

from pdctl.sdk.router.hardening import GONE, WHOLE, Gone, Limits

__all__ = ["HardenedHttpTools", "hardened_protocol"]

LINGER_S = 1.0
"""How long a refused connection's late bytes are read and dropped before it is closed."""

_STATUS = {
    408: b"408 Request Timeout",
    431: b"431 Request Header Fields Too Large",
    503: b"503 Service Unavailable",
}


class HardenedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol under :attr:`limits` (module doc: what each one does)."""

    limits: ClassVar[Limits] = Limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._pd_head_bytes = 0
        self._pd_headers = 0
        self._pd_fields = 0
        """Bytes of the header fields parsed so far (as :meth:`on_header` counts them)."""
        self._pd_in_head = True
        self._pd_refused = False
        self._pd_timer: asyncio.TimerHandle | None = None
        self._pd_timer_at = 0.0
        self._pd_due: float | None = None
        self._pd_why: tuple[int, str] = (408, "")
        self._pd_born = time.monotonic()
        cert = transport.get_extra_info("peercert")
        self._pd_cert_subject = _subject(cert) if cert else None
        idle = _idle(self.server_state)
        if len(self.connections) > self.limits.max_connections:
            if idle:
                _, oldest = idle.popitem(last=False)
                oldest.transport.close()
            else:
                self._pd_refuse(503, "too many connections")
                return
        idle[id(self)] = self
        self._pd_arm(self.limits.header_timeout_s, 408, "nothing received")

    # -- timers and refusals
    # A request moves its connection's deadline (head, then body, then none) without
    # touching the loop's timers: one timer per connection stays armed at the earliest
    # deadline it may have to enforce and, when it fires, looks at the deadline in force
    # (past: refuse; later: wait for it; none: stop). Arming and cancelling a timer for
    # each of a request's stages cost two timers per request.
    def _pd_arm(self, after: float, status: int, why: str) -> None:
        due = self.loop.time() + after
        self._pd_due, self._pd_why = due, (status, why)
        if self._pd_timer is not None:
            if self._pd_timer_at <= due:
                return  # it fires first and waits on for this deadline
            self._pd_timer.cancel()
        self._pd_timer_at = due
        self._pd_timer = self.loop.call_at(due, self._pd_tick)

    def _pd_disarm(self) -> None:
        self._pd_due = None  # the timer, if armed, finds nothing to enforce

    def _pd_tick(self) -> None:
        self._pd_timer = None
        due = self._pd_due
        if due is None:
            return
        if self.loop.time() < due:  # the deadline moved on since the timer was set
            self._pd_timer_at = due
            self._pd_timer = self.loop.call_at(due, self._pd_tick)
            return
        self._pd_refuse(*self._pd_why)

    def _pd_stop(self) -> None:
        self._pd_due = None
        if self._pd_timer is not None:
            self._pd_timer.cancel()
            self._pd_timer = None

    def _pd_refuse(self, status: int, why: str) -> None:
        if self._pd_refused:  # the parser may call back again within the same bytes
            return
        self._pd_refused = True
        self._pd_stop()
        if self.transport.is_closing():
            return
        cycle = self.cycle  # on a kept connection, the last request's until a new head ends
        if cycle is None or cycle.response_complete:  # no request in flight: nothing writes
            self._pd_answer(status, why)
            self._pd_linger()
            return
        if not cycle.response_started:
            self._pd_answer(status, why)
        self.transport.close()

    def _pd_answer(self, status: int, why: str) -> None:
        body = why.encode()
        self.transport.write(
            b"HTTP/1.1 " + _STATUS[status] + b"\r\ncontent-type: text/plain\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )

    def _pd_linger(self) -> None:
        # Closing a socket whose receive buffer holds unread bytes (a slowloris' next byte,
        # the rest of a refused head) sends a reset, and the client's stack may then drop
        # the refusal before its application reads it. So the write side is shut first and
        # what still arrives is read and dropped for at most LINGER_S (RFC 9112 9.6).
        transport = self.transport
        if not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        transport.write_eof()
        self._pd_timer = self.loop.call_later(LINGER_S, transport.close)

    # -- protocol events
    def data_received(self, data: bytes) -> None:
        if self._pd_refused:
            return
        if self._pd_in_head:
            # the parser calls back per complete header only: bound what it buffers
            room = self.limits.max_header_bytes + 1024 - self._pd_head_bytes
            if len(data) > room:
                self._pd_head_bytes += room
                super().data_received(data[:room])
                if self._pd_refused or self.transport.is_closing():
                    return
                if self._pd_in_head:
                    self._pd_refuse(431, "request head too large")
                    return
                data = data[room:]  # the head ended in there: the rest is body
            else:
                self._pd_head_bytes += len(data)
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        _idle(self.server_state).pop(id(self), None)
        self._pd_in_head = True
        self._pd_headers = 0
        self._pd_fields = 0
        self._pd_arm(self.limits.header_timeout_s, 408, "request head too slow")

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > self.limits.max_header_bytes:
            self._pd_refuse(431, "request line too long")
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._pd_headers += 1
        size = self._pd_fields + len(self.url)
        if self._pd_headers > self.limits.max_headers:
            self._pd_refuse(431, f"more than {self.limits.max_headers} header fields")
            return
        if size + len(name) + len(value) > self.limits.max_header_bytes:
            self._pd_refuse(431, f"request head over {self.limits.max_header_bytes} bytes")
            return
        super().on_header(name, value)
        k, v = self.headers[-1]  # as uvicorn keeps it (its value's trailing blanks cut)
        self._pd_fields += len(k) + len(v) + 4

    def on_headers_complete(self) -> None:
        if self._pd_refused:
            return
        self._pd_in_head = False
        self._pd_head_bytes = 0
        self._pd_arm(self.limits.body_timeout_s, 408, "request body too slow")
        super().on_headers_complete()
        cycle: Any = self.cycle
        if cycle is None:
            return
        cycle.transport = out = _HeadWithBody(self.transport, cycle, self.loop)
        ext: dict[str, Any] = cycle.scope.setdefault("extensions", {})
        ext[GONE] = Gone()
        ext[WHOLE] = out
        if self._pd_cert_subject is not None:
            ext["tls"] = {"client_cert_subject": self._pd_cert_subject}

    def on_body(self, body: bytes) -> None:
        if not self._pd_refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._pd_disarm()
        if not self._pd_refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            _idle(self.server_state)[id(self)] = self

    def connection_lost(self, exc: Exception | None) -> None:
        self._pd_stop()
        _idle(self.server_state).pop(id(self), None)
        cycle: Any = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            gone: Gone | None = cycle.scope.get("extensions", {}).get(GONE)
            if gone is not None:
                gone.fire()


class _HeadWithBody:
    """A response's transport until its head has gone out with the first body bytes: one
    write (one TCP segment) for an answer sent whole, where uvicorn writes the head and the
    body apart. The head waits at most until the loop's next turn (a stream whose first
    event is not ready yet still gets its head at once); after that write, the cycle
    writes to the real transport again."""

    __slots__ = ("_cycle", "_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any, loop: Any) -> None:
        self._transport, self._cycle, self._loop = transport, cycle, loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is None:
            self._head = data
            self._loop.call_soon(self._flush)
            return
        self._transport.writelines((self._head, data))
        self._done()

    def _flush(self) -> None:
        if self._head is not None and not self._transport.is_closing():
            self._transport.write(self._head)
        self._done()

    def _done(self) -> None:
        # let the cycle go: the scope holds this object (WHOLE), it must not hold the cycle
        self._head = None
        cycle, self._cycle = self._cycle, None
        if cycle is not None and cycle.transport is self:
            cycle.transport = self._transport

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """:class:`~pdctl.sdk.router.hardening.WholeAnswer`: what uvicorn's cycle does for
        an ``http.response.start`` with a ``content-length`` and one final
        ``http.response.body`` (its checks of the app's headers, its default headers, its
        ``connection: close`` when the connection is not kept, the cycle finished), as one
        write; False where the ASGI way has more to do."""
        cycle = self._cycle
        if (
            cycle is None
            or cycle.response_started
            or cycle.disconnected
            or cycle.flow.write_paused
            or cycle.access_log
            or cycle.scope["method"] == "HEAD"
            or self._head is not None
        ):
            return False
        content = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            content += (name, b": ", value, b"\r\n")
        for name, value in headers:
            lname = name.lower()
            if lname in _LEFT_TO_ASGI or HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
                return False  # the ASGI way decides (or refuses) these
            content += (lname, b": ", value, b"\r\n")
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        content += (b"content-length: ", b"%d" % len(body), b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        cycle.transport, self._cycle = self._transport, None
        self._transport.write(b"".join(content))
        cycle.expected_content_length = 0
        cycle.chunked_encoding = False
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._transport.close()
        cycle.on_response()
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


_LEFT_TO_ASGI = frozenset((b"content-length", b"transfer-encoding", b"connection"))
"""Headers whose meaning uvicorn's cycle acts on: an answer with one goes the ASGI way."""


def _idle(state: Any) -> OrderedDict[int, Any]:
    """The server's idle connections, oldest first (kept on its ServerState)."""
    idle: OrderedDict[int, Any] | None = getattr(state, "_pdctl_idle", None)
    if idle is None:
        idle = OrderedDict()
        state._pdctl_idle = idle
    return idle


def _subject(cert: dict[str, Any]) -> str:
    """``CN=x,O=y`` of a certificate as :meth:`ssl.SSLSocket.getpeercert` gives it."""
    parts = [f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn]
    return ",".join(parts)


def hardened_protocol(limits: Limits) -> type[asyncio.Protocol]:
    """uvicorn's ``httptools`` protocol with ``limits`` (pass it as ``Config(http=...)``)."""
    return type("HardenedHttpTools", (HardenedHttpTools,), {"limits": limits})
