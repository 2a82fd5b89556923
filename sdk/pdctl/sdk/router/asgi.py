"""The router's ASGI plumbing: message types, answers (whole, streamed, OpenAI-style
errors), a request header, and the watch that cancels a handler whose client went away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pdctl.sdk.router.hardening import WholeAnswer
from pdctl.sdk.router.replies import StreamReply, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Flag:
    """A one-way switch (set once, read often)."""

    __slots__ = ("is_set",)

    def __init__(self) -> None:
        self.is_set = False

    def set(self) -> None:
        self.is_set = True


async def cancel_on_disconnect(
    receive: Receive, handler: asyncio.Task[Any], answered: Flag, gone: Flag
) -> None:
    """Cancel the request handler (and so both legs) when the client goes away before
    its answer is complete, and say so in ``gone``. (Servers also report "disconnect"
    once the answer is sent.)"""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            if not answered.is_set:
                gone.set()
                handler.cancel()
            return


_JSON = [(b"content-type", b"application/json")]


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (the first one), or None."""
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v).decode("latin-1")
    return None


def hdrs(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Reply headers as ASGI wants them (lower-case bytes)."""
    return [(k.lower().encode(), v.encode()) for k, v in headers]


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    whole: WholeAnswer | None = None,
) -> None:
    """A whole answer (JSON unless ``headers`` say otherwise), in one step where the server
    offers ``whole`` (:class:`~pdctl.sdk.router.hardening.WholeAnswer`); a client already
    gone is not an error."""
    hs = headers or _JSON
    with contextlib.suppress(OSError):
        if whole is not None and whole.answer(status, hs, body):
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*hs, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    send: Send,
    status: int,
    message: str,
    kind: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An OpenAI-style error answer."""
    hs = [(b"content-type", b"application/json"), *(headers or [])]
    await send_body(send, status, error_body(status, message, kind), hs)


async def stream_reply(send: Send, reply: StreamReply, answered: Flag) -> None:
    """Send a streamed reply as it comes; ``answered`` once all of it is sent."""
    try:
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": hdrs(reply.headers),
            }
        )
        async for chunk in reply.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        answered.set()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await reply.aclose()
