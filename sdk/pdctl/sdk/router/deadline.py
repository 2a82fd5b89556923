"""A request's first-byte deadline: when it passes with no byte of the answer sent, the
request is settled as a 504, its handler cancelled — which cancels both legs: their
connections are closed, so each vLLM aborts its request and frees its KV, and the
ledger asks the prefill to free KV it pushed — and the client answered 504 at once, not
at ``router.request_timeout_s``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from types import TracebackType

from pdctl.sdk.router.replies import StreamReply
from pdctl.sdk.router.running import current_task

_closing: set[asyncio.Task[None]] = set()
"""Streams being closed in the background (a reference keeps each task alive)."""


class Deadline:
    """Armed at construction for ``delay_s`` from now; :meth:`disarm` once the first
    byte is out. ``expire`` runs first (settle the request), then the task is cancelled."""

    def __init__(
        self, delay_s: float, task: asyncio.Task[object], expire: Callable[[], None]
    ) -> None:
        self.passed = False
        self._task, self._expire = task, expire
        loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = loop.call_later(max(0.0, delay_s), self._fire)

    def _fire(self) -> None:
        self._handle = None
        self.passed = True
        self._expire()
        self._task.cancel()

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class Within:
    """``async with Within(delay_s):`` — :func:`asyncio.timeout` for a leg (None: no
    limit): the task cancelled when ``delay_s`` passes inside the block, and
    :class:`TimeoutError` raised from the block in place of that cancellation (one
    cancelled by anyone else is left as it is). What asyncio's does, on one timer made
    once and no states to step through: two of them per request were some 4% of the
    router's CPU."""

    __slots__ = ("_cancelling", "_delay", "_fired", "_handle", "_task")

    def __init__(self, delay_s: float | None) -> None:
        self._delay = delay_s
        self._fired = False
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0
        self._task: asyncio.Task[object] | None = None

    async def __aenter__(self) -> Within:
        task = current_task()
        if task is None:
            raise RuntimeError("Within must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._delay is not None:
            self._handle = task.get_loop().call_later(max(0.0, self._delay), self._fire)
        return self

    def _fire(self) -> None:
        self._handle = None
        self._fired = True
        assert self._task is not None
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fired:
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc


async def first_chunk(reply: StreamReply) -> StreamReply:
    """``reply`` with its first chunk already read (so a deadline covers it), the same
    chunks from there on; closing it closes ``reply``."""
    chunks = reply.chunks
    try:
        head = await anext(chunks)
    except StopAsyncIteration:
        head = b""

    started = False

    async def again() -> AsyncGenerator[bytes, None]:
        nonlocal started
        started = True
        try:
            if head:
                yield head
            async for c in chunks:
                yield c
        finally:
            await chunks.aclose()

    def release() -> None:
        if not started:  # closed before it was read: close the stream under it too
            task = asyncio.get_running_loop().create_task(chunks.aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)
        if reply.release is not None:
            reply.release()

    return StreamReply(reply.status, again(), reply.headers, release)
