"""Reading event streams in tests the way pdctl does: the SDK's parser, which ends lines
only at CR, LF and CRLF (httpx's ``iter_lines`` also ends them at U+2028, U+0085, …, and
would cut an event of a real model's text in two: see :mod:`pdctl.sdk.sse`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx

from pdctl.sdk.sse import EventParser


async def adata(r: httpx.Response) -> AsyncIterator[str]:
    """Each event's ``data`` of a streamed response (``[DONE]`` included)."""
    parser = EventParser()
    async for chunk in r.aiter_bytes():
        for event in parser.feed(chunk):
            yield event.data


def data(r: httpx.Response) -> Iterator[str]:
    parser = EventParser()
    for chunk in r.iter_bytes():
        for event in parser.feed(chunk):
            yield event.data
