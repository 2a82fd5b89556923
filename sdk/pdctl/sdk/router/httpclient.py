"""A lean pooled HTTP/1.1 client for the router's hot path.

The router sends two upstream requests per client request; general-purpose clients
(httpx) cost several hundred microseconds of CPU each and their pool serialises under
concurrency. This client does only what the router needs — keep-alive connections per
upstream, a request with a JSON body, a response read whole or streamed chunk by chunk —
on asyncio protocols with httptools' C parser (which also decodes chunked bodies).

Cancelling a request closes its connection: vLLM sees the disconnect and aborts the
request, which is how the router cancels a leg.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools


class UpstreamError(Exception):
    """Connection-level failure talking to an upstream."""

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
        """True when nothing was sent (the connection could not be made): safe to retry."""


class _Body:
    """A response's body as it arrives, for its one reader: the parts not taken yet,
    whether it ended, and the reader's wake-up. A reader that falls behind takes every
    part that came meanwhile at once (a relayed stream's events then go to its client in
    one write), and no queue or future is made per part."""

    __slots__ = ("_loop", "_waiter", "ended", "parts")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.parts: list[bytes] = []
        self.ended = False
        self._waiter: asyncio.Future[None] | None = None

    def add(self, part: bytes) -> None:
        self.parts.append(part)
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def take(self) -> bytes | None:
        """Every part that came since the last take, as one; None once the body ended."""
        while not self.parts:
            if self.ended:
                return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        parts = self.parts
        if len(parts) == 1:
            out = parts[0]
            parts.clear()
            return out
        self.parts = []
        return b"".join(parts)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fresh = True
        """The parser is new or ended its last response cleanly (it parses the next one
        as it is: a kept connection's parser is made once)."""
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.reusable = False
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: _Body | None = None
        self._head: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"malformed response from upstream: {e}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(UpstreamError(f"upstream closed the connection{': ' + str(exc) if exc else ''}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._status = self.parser.get_status_code()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._chunks is not None:
            self._chunks.add(body)

    def on_message_complete(self) -> None:
        self.reusable = self.fresh = self.parser.should_keep_alive()
        if self._chunks is not None:
            self._chunks.end()

    # helpers
    def _fail(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
        if self._head is not None and not self._head.done():
            self._head.set_exception(err)
        if self._chunks is not None:
            self._chunks.end()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def start(self, payload: bytes) -> None:
        assert self.transport is not None
        if not self.fresh:
            self.parser = httptools.HttpResponseParser(self)
        self.fresh = False
        self.reusable = False
        self._status = 0
        self._headers = []
        self._chunks = _Body(self.loop)
        self._head = self.loop.create_future()
        self._error = None
        self.transport.write(payload)


class Response:
    """A response whose head is in; its body is read whole or chunk by chunk, once."""

    __slots__ = ("_conn", "_done", "_pool", "_released", "headers", "status")

    def __init__(
        self, status: int, headers: list[tuple[bytes, bytes]], conn: _Conn, pool: Pool
    ) -> None:
        self.status, self.headers = status, headers
        self._conn, self._pool = conn, pool
        self._done = False
        self._released = False

    def header(self, name: bytes) -> bytes | None:
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (what came while the caller was busy, as one chunk); the
        connection goes back to the pool at the end."""
        body = self._conn._chunks
        assert body is not None
        try:
            while (chunk := await body.take()) is not None:
                yield chunk
            self._ended()
            self._done = True
        finally:
            self.release()

    async def read(self) -> bytes:
        """The whole body (what :meth:`iter_chunks` gives, joined; most bodies come in
        one part)."""
        body = self._conn._chunks
        assert body is not None
        parts: list[bytes] = []
        try:
            while (chunk := await body.take()) is not None:
                parts.append(chunk)
            self._ended()
            self._done = True
        finally:
            self.release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _ended(self) -> None:
        """At the body's end: :class:`UpstreamError` where it ended by the connection's
        error (a plain check after the loop, not a coroutine awaited per part)."""
        if self._conn._error is not None and not self._conn.reusable:
            raise UpstreamError(str(self._conn._error))

    def release(self) -> None:
        """Return the connection to the pool when the response was read to the end; close
        it otherwise (which also tells the upstream to abort the request). Idempotent."""
        if not self._released:
            self._released = True
            self._pool._release(self._conn, ok=self._done)


class Pool:
    """Keep-alive connections to one upstream ``http://host:port``."""

    def __init__(self, base_url: str, *, max_idle: int = 4096) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"upstream URL must be http://host:port, got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or 80
        self.hostport = f"{self.host}:{self.port}".encode()
        self._idle: deque[_Conn] = deque()
        self.max_idle = max_idle

    async def _connect(self, timeout_s: float) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_Conn, self.host, self.port), timeout_s
            )
        except (OSError, TimeoutError) as e:
            raise UpstreamError(
                f"cannot connect to {self.host}:{self.port}: {e or type(e).__name__}",
                connect=True,
            ) from None
        return proto

    def _release(self, conn: _Conn, ok: bool) -> None:
        if ok and conn.reusable and not conn.closed and len(self._idle) < self.max_idle:
            conn._chunks = None
            self._idle.append(conn)
        else:
            conn.close()

    async def request(
        self,
        method: str,
        endpoint: str,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
        *,
        connect_timeout_s: float = 5.0,
    ) -> Response:
        """Send a request and wait for the response head. The caller must consume the
        body (``read``/``iter_chunks``) or call ``release``; cancelling closes the
        connection."""
        conn = await self._connect(connect_timeout_s)
        head = [f"{method} {endpoint} HTTP/1.1\r\n".encode(), b"Host: ", self.hostport, b"\r\n"]
        for k, v in headers or ():
            head.append(f"{k}: {v}\r\n".encode())
        if body or method in ("POST", "PUT"):
            head.append(b"Content-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        try:
            conn.start(b"".join(head) + body)
            assert conn._head is not None
            await conn._head
        except BaseException:
            conn.close()
            raise
        return Response(conn._status, conn._headers, conn, self)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


class Pools:
    """One pool per upstream base URL."""

    def __init__(self) -> None:
        self._pools: dict[str, Pool] = {}

    def get(self, base_url: str) -> Pool:
        p = self._pools.get(base_url)
        if p is None:
            p = self._pools[base_url] = Pool(base_url)
        return p

    def close(self) -> None:
        for p in self._pools.values():
            with contextlib.suppress(Exception):
                p.close()
