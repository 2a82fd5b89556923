"""The asyncio router client (httpx's ``AsyncClient`` underneath); :mod:`.sync` is its twin,
method for method."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx

from pdctl.sdk.client import ops
from pdctl.sdk.client.base import (
    CONTROL_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    BaseClient,
    Verify,
    chunks_in,
    tls_context,
)
from pdctl.sdk.client.ops import Call, InstanceEvent, Op, Wait
from pdctl.sdk.client.results import Chunk, Completion, RequestTimeline, RoutedInstance, RouterState
from pdctl.sdk.sse import EventParser

T = TypeVar("T")


class AsyncChunkStream:
    """A streamed answer, one :class:`Chunk` per server event. The request goes out at
    the first ``anext()``; the connection closes when the iteration ends, on
    :meth:`aclose`, or when an ``async with`` block around it exits (breaking out early)."""

    def __init__(self, chunks: AsyncIterator[Chunk]) -> None:
        self._chunks = chunks

    def __aiter__(self) -> AsyncChunkStream:
        return self

    async def __anext__(self) -> Chunk:
        return await anext(self._chunks)

    async def aclose(self) -> None:
        aclose = getattr(self._chunks, "aclose", None)
        if aclose is not None:
            await aclose()

    async def __aenter__(self) -> AsyncChunkStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncRouterClient(BaseClient):
    """:class:`~pdctl.sdk.client.RouterClient` for asyncio: the same methods, awaited
    (``close`` is :meth:`aclose`, ``with`` is ``async with``)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: Verify = True,
        pool: bool = True,
    ) -> None:
        """``pool=False``: a fresh connection for each call instead of a pool bound to
        the first event loop that used it, so one client serves several loops (a
        thread with its own loop, ``asyncio.run`` per call). ``verify``: how an
        ``https://`` router's certificate is checked (:data:`~.base.Verify`)."""
        super().__init__(url, api_key, timeout_s, control_timeout_s)
        self._transport = transport
        self._verify = tls_context(verify)
        self._http = httpx.AsyncClient(transport=transport, verify=self._verify) if pool else None

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._http is not None:
            yield self._http
            return
        async with httpx.AsyncClient(transport=self._transport, verify=self._verify) as http:
            yield http

    async def run(self, op: Op[T]) -> T:
        """Carry out one operation (:mod:`pdctl.sdk.client.ops`)."""
        reply: Any = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(step, Wait):
                await asyncio.sleep(step.seconds)
                reply = None
                continue
            try:
                async with self._connection() as http:
                    r = await http.request(**self._request_args(step))
            except httpx.HTTPError as e:
                raise self._unreachable(e) from None
            reply = self._checked(step, r)

    async def complete(
        self, prompt: str, *, max_tokens: int = 16, temperature: float = 0.0, **params: Any
    ) -> Completion:
        """``POST /v1/completions``; ``params`` are further OpenAI fields (``stop``, …)."""
        body = ops.completion_body("prompt", prompt, max_tokens, temperature, params)
        return await self.run(ops.complete_op(body))

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> Completion:
        """``POST /v1/chat/completions`` (the model needs a chat template)."""
        body = ops.completion_body("messages", messages, max_tokens, temperature, params)
        return await self.run(ops.chat_op(body))

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> AsyncChunkStream:
        """The answer as it is generated (a prompt, or chat ``messages``)::

        async with router.stream("the decode engine") as chunks:
            async for chunk in chunks:
                print(chunk.text, end="")
        """
        call = ops.stream_call(prompt, messages, max_tokens, temperature, params)
        return AsyncChunkStream(self._chunks(call))

    async def _chunks(self, call: Call) -> AsyncIterator[Chunk]:
        try:
            async with (
                self._connection() as http,
                http.stream(**self._request_args(call)) as r,
            ):
                if r.status_code != 200:
                    await r.aread()
                    self._checked(call, r)
                parser = EventParser()
                async for data in r.aiter_bytes():
                    for chunk in chunks_in(parser, data):
                        yield chunk
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    async def requests(
        self, limit: int = 100, *, instance: str | None = None, outcome: str | None = None
    ) -> list[RequestTimeline]:
        """The router's recent finished requests, newest first, each with its timeline
        (``outcome``: ok | error | cancelled)."""
        return await self.run(ops.requests_op(limit, instance, outcome))

    async def state(self) -> RouterState:
        """Dispatch mode, and per instance: health, drained flag, legs in flight."""
        return await self.run(ops.state_op())

    async def get_mode(self) -> str:
        """The dispatch mode (``push``, ``push-sequential``, …)."""
        return await self.run(ops.get_mode_op())

    async def set_mode(self, mode: str) -> RouterState:
        """Switch the dispatch mode (one of ``state().modes``)."""
        return await self.run(ops.set_mode_op(mode))

    async def set_policy(self, policy: str) -> RouterState:
        """Switch the selection policy (``cache_aware`` only on a router started with it)."""
        return await self.run(ops.set_policy_op(policy))

    async def set_admission(self, **settings: int | float) -> RouterState:
        """Change admission limits and thresholds on every router worker
        (``max_queued=64``, ``max_kv_usage=0.9``: docs/router.md, "Overload")."""
        return await self.run(ops.set_admission_op(dict(settings)))

    async def drain(self, instance: str) -> RouterState:
        """Route no new requests to ``instance``; the ones in flight finish there."""
        return await self.run(ops.drain_op(instance, True))

    async def resume(self, instance: str) -> RouterState:
        """Route new requests to a drained ``instance`` again."""
        return await self.run(ops.drain_op(instance, False))

    async def notify(self, instance: str, event: InstanceEvent) -> RouterState:
        """Tell the router ``instance`` is ``"up"`` (ready again) or ``"down"`` (stopped,
        failed or restarting), so it need not wait for its next health check."""
        return await self.run(ops.notify_op(instance, event))

    async def wait_drained(
        self, instance: str, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> RoutedInstance:
        """Wait until the drained ``instance`` has no request in flight."""
        return await self.run(ops.wait_drained_op(instance, timeout_s, poll_s))

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncRouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
