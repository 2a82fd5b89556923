"""The blocking router client (httpx's ``Client`` underneath); :mod:`.aio` is its twin."""

from __future__ import annotations

import time
from collections.abc import Iterator
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


class ChunkStream:
    """A streamed answer, one :class:`Chunk` per server event. The request goes out at
    the first ``next()``; the connection closes when the iteration ends, on
    :meth:`close`, or when a ``with`` block around it exits (breaking out early)."""

    def __init__(self, chunks: Iterator[Chunk]) -> None:
        self._chunks = chunks

    def __iter__(self) -> ChunkStream:
        return self

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ChunkStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RouterClient(BaseClient):
    """A pdctl router, from a script (blocking calls): completions, streams, the flight
    recorder and operator control. ``api_key`` is the router's key when it has one
    (``router.api_key`` in the spec); ``verify`` how an ``https://`` router's certificate
    is checked (a CA bundle's path, :data:`~.base.Verify`). :class:`AsyncRouterClient` has
    the same methods,
    awaited. Failures are :class:`~pdctl.sdk.errors.RouterError`."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        verify: Verify = True,
    ) -> None:
        super().__init__(url, api_key, timeout_s, control_timeout_s)
        self._http = httpx.Client(transport=transport, verify=tls_context(verify))

    def run(self, op: Op[T]) -> T:
        """Carry out one operation (:mod:`pdctl.sdk.client.ops`)."""
        reply: Any = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(step, Wait):
                time.sleep(step.seconds)
                reply = None
                continue
            try:
                r = self._http.request(**self._request_args(step))
            except httpx.HTTPError as e:
                raise self._unreachable(e) from None
            reply = self._checked(step, r)

    def complete(
        self, prompt: str, *, max_tokens: int = 16, temperature: float = 0.0, **params: Any
    ) -> Completion:
        """``POST /v1/completions``; ``params`` are further OpenAI fields (``stop``, …)."""
        body = ops.completion_body("prompt", prompt, max_tokens, temperature, params)
        return self.run(ops.complete_op(body))

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> Completion:
        """``POST /v1/chat/completions`` (the model needs a chat template)."""
        body = ops.completion_body("messages", messages, max_tokens, temperature, params)
        return self.run(ops.chat_op(body))

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> ChunkStream:
        """The answer as it is generated (a prompt, or chat ``messages``)::

        with router.stream("the decode engine") as chunks:
            for chunk in chunks:
                print(chunk.text, end="")
        """
        call = ops.stream_call(prompt, messages, max_tokens, temperature, params)
        return ChunkStream(self._chunks(call))

    def _chunks(self, call: Call) -> Iterator[Chunk]:
        try:
            with self._http.stream(**self._request_args(call)) as r:
                if r.status_code != 200:
                    r.read()
                    self._checked(call, r)
                parser = EventParser()
                for data in r.iter_bytes():
                    yield from chunks_in(parser, data)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    def requests(
        self, limit: int = 100, *, instance: str | None = None, outcome: str | None = None
    ) -> list[RequestTimeline]:
        """The router's recent finished requests, newest first, each with its timeline
        (``outcome``: ok | error | cancelled)."""
        return self.run(ops.requests_op(limit, instance, outcome))

    def state(self) -> RouterState:
        """Dispatch mode, and per instance: health, drained flag, legs in flight."""
        return self.run(ops.state_op())

    def get_mode(self) -> str:
        """The dispatch mode (``push``, ``push-sequential``, …)."""
        return self.run(ops.get_mode_op())

    def set_mode(self, mode: str) -> RouterState:
        """Switch the dispatch mode (one of ``state().modes``)."""
        return self.run(ops.set_mode_op(mode))

    def set_policy(self, policy: str) -> RouterState:
        """Switch the selection policy (``cache_aware`` only on a router started with it)."""
        return self.run(ops.set_policy_op(policy))

    def set_admission(self, **settings: int | float) -> RouterState:
        """Change admission limits and thresholds on every router worker
        (``max_queued=64``, ``max_kv_usage=0.9``: docs/router.md, "Overload")."""
        return self.run(ops.set_admission_op(dict(settings)))

    def drain(self, instance: str) -> RouterState:
        """Route no new requests to ``instance``; the ones in flight finish there."""
        return self.run(ops.drain_op(instance, True))

    def resume(self, instance: str) -> RouterState:
        """Route new requests to a drained ``instance`` again."""
        return self.run(ops.drain_op(instance, False))

    def notify(self, instance: str, event: InstanceEvent) -> RouterState:
        """Tell the router ``instance`` is ``"up"`` (ready again) or ``"down"`` (stopped,
        failed or restarting), so it need not wait for its next health check."""
        return self.run(ops.notify_op(instance, event))

    def wait_drained(
        self, instance: str, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> RoutedInstance:
        """Wait until the drained ``instance`` has no request in flight."""
        return self.run(ops.wait_drained_op(instance, timeout_s, poll_s))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
