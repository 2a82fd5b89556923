"""A client for a pdctl router: OpenAI completions and operator control, sync and async.

    router = RouterClient("http://127.0.0.1:8000")
    print(router.complete("the prefill engine", max_tokens=8).text)
    router.mode = "push-sequential"
    for r in router.requests(limit=5):
        print(r.id, r.prefill, r.decode, r.ttft_ms)

:class:`RouterClient` and :class:`AsyncRouterClient` share one implementation: each
operation is a generator that yields the HTTP calls it needs (and the waits between
them) and returns the typed result; the two classes only differ in how they send a call
(httpx's ``Client`` or ``AsyncClient``) and how they wait. Errors are
:class:`~pdctl.sdk.errors.RouterError` with the HTTP status and the router's message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from pdctl.sdk.errors import RouterError
from pdctl.sdk.router.results import (
    Chunk,
    Completion,
    RequestTimeline,
    RoutedInstance,
    RouterState,
    parse_sse_line,
)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 600.0
"""A completion's limit (the router's own ``request_timeout_s`` default)."""
CONTROL_TIMEOUT_S = 10.0
"""The limit of a control call (state, drain, mode, requests)."""


@dataclass(frozen=True)
class Call:
    """One HTTP request an operation needs; the reply's JSON is sent back into it."""

    method: str
    path: str
    body: Any = None
    params: dict[str, Any] | None = None
    control: bool = True
    """A short control call (the client's ``control_timeout_s``), not a completion."""


@dataclass(frozen=True)
class Wait:
    """Pause this many seconds before the next call."""

    seconds: float


Op = Generator[Call | Wait, Any, T]


# ---------------------------------------------------------------------- operations


def _completion_body(
    key: str, value: Any, max_tokens: int, temperature: float, params: dict[str, Any]
) -> dict[str, Any]:
    return {key: value, "max_tokens": max_tokens, "temperature": temperature, **params}


def complete_op(body: dict[str, Any]) -> Op[Completion]:
    return Completion.from_json((yield Call("POST", "/v1/completions", body, control=False)))


def chat_op(body: dict[str, Any]) -> Op[Completion]:
    data = yield Call("POST", "/v1/chat/completions", body, control=False)
    return Completion.from_json(data)


def state_op() -> Op[RouterState]:
    return RouterState.from_json((yield Call("GET", "/v1/pdctl/state")))


def set_mode_op(mode: str) -> Op[RouterState]:
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/mode", {"mode": mode})))


def set_policy_op(policy: str) -> Op[RouterState]:
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/policy", {"policy": policy})))


def drain_op(instance: str, drain: bool) -> Op[RouterState]:
    body = {"instance": instance, "drain": drain}
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/drain", body)))


def notify_op(instance: str, event: str) -> Op[RouterState]:
    body = {"instance": instance, "event": event}
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/instance", body)))


def requests_op(limit: int, instance: str | None, outcome: str | None) -> Op[list[RequestTimeline]]:
    params = {"limit": limit, "instance": instance, "outcome": outcome}
    data = yield Call("GET", "/v1/pdctl/requests", params=params)
    items = data.get("requests", []) if isinstance(data, dict) else []
    return [RequestTimeline.from_json(d) for d in items if isinstance(d, dict)]


def wait_drained_op(instance: str, timeout_s: float, poll_s: float) -> Op[RoutedInstance]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            inst = (yield from state_op()).instance(instance)
        except KeyError:
            raise RouterError(f"the router has no instance named {instance!r}") from None
        if not inst.drained:
            raise RouterError(f"{instance} is not drained (drain it first, or someone resumed it)")
        if inst.in_flight == 0:
            return inst
        if time.monotonic() >= deadline:
            raise RouterError(
                f"{instance} still has {inst.in_flight} request(s) in flight after {timeout_s:g} s"
            )
        yield Wait(poll_s)


def stream_call(
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    max_tokens: int,
    temperature: float,
    params: dict[str, Any],
) -> Call:
    if (prompt is None) == (messages is None):
        raise ValueError("stream() takes a prompt or messages=[...] (exactly one of them)")
    body = (
        _completion_body("prompt", prompt, max_tokens, temperature, params)
        if prompt is not None
        else _completion_body("messages", messages, max_tokens, temperature, params)
    )
    path = "/v1/completions" if prompt is not None else "/v1/chat/completions"
    return Call("POST", path, {**body, "stream": True}, control=False)


# ---------------------------------------------------------------------- transport


@dataclass(frozen=True)
class _Done(Generic[T]):
    value: T


def _advance(op: Op[T], reply: Any) -> Call | Wait | _Done[T]:
    """Send ``reply`` into ``op``: its next step, or its result."""
    try:
        return op.send(reply)
    except StopIteration as done:
        return _Done(done.value)


class _Base:
    def __init__(
        self, url: str, api_key: str | None, timeout_s: float, control_timeout_s: float
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"router URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.control_timeout_s = control_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _args(self, call: Call) -> dict[str, Any]:
        return {
            "method": call.method,
            "url": self.url + call.path,
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
            f"the router answered {r.status_code} to {call.method} {call.path}: {msg}",
            status=r.status_code,
            message=msg,
        )


class RouterClient(_Base):
    """A pdctl router, from a script (blocking calls). ``api_key`` is the router's key
    when it has one (``router.api_key`` in the spec)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, api_key, timeout_s, control_timeout_s)
        self._http = httpx.Client(transport=transport)

    def run(self, op: Op[T]) -> T:
        """Carry out one operation (the ``*_op`` functions of this module)."""
        step = _advance(op, None)
        while not isinstance(step, _Done):
            if isinstance(step, Wait):
                time.sleep(step.seconds)
                step = _advance(op, None)
                continue
            try:
                r = self._http.request(**self._args(step))
            except httpx.HTTPError as e:
                raise self._unreachable(e) from None
            step = _advance(op, self._checked(step, r))
        return step.value

    def complete(
        self, prompt: str, *, max_tokens: int = 16, temperature: float = 0.0, **params: Any
    ) -> Completion:
        """``POST /v1/completions``; ``params`` are further OpenAI fields (``stop``, …)."""
        return self.run(
            complete_op(_completion_body("prompt", prompt, max_tokens, temperature, params))
        )

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> Completion:
        """``POST /v1/chat/completions`` (the model needs a chat template)."""
        return self.run(
            chat_op(_completion_body("messages", messages, max_tokens, temperature, params))
        )

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> Iterator[Chunk]:
        """The answer as it is generated, one :class:`Chunk` per server event."""
        call = stream_call(prompt, messages, max_tokens, temperature, params)
        try:
            with self._http.stream(**self._args(call)) as r:
                if r.status_code != 200:
                    r.read()
                    self._checked(call, r)
                for line in r.iter_lines():
                    chunk = parse_sse_line(line)
                    if chunk is not None:
                        yield chunk
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    def requests(
        self, limit: int = 100, *, instance: str | None = None, outcome: str | None = None
    ) -> list[RequestTimeline]:
        """The router's recent finished requests, newest first, each with its timeline."""
        return self.run(requests_op(limit, instance, outcome))

    def state(self) -> RouterState:
        """Dispatch mode, and per instance: health, drained flag, legs in flight."""
        return self.run(state_op())

    @property
    def mode(self) -> str:
        """The dispatch mode (``push``, ``push-sequential``, …); assign to switch it."""
        return self.state().mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self.set_mode(mode)

    def set_mode(self, mode: str) -> RouterState:
        return self.run(set_mode_op(mode))

    def drain(self, instance: str) -> RouterState:
        """Route no new requests to ``instance``; the ones in flight finish there."""
        return self.run(drain_op(instance, True))

    def resume(self, instance: str) -> RouterState:
        """Route new requests to a drained ``instance`` again."""
        return self.run(drain_op(instance, False))

    def wait_drained(
        self, instance: str, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> RoutedInstance:
        """Wait until the drained ``instance`` has no request in flight."""
        return self.run(wait_drained_op(instance, timeout_s, poll_s))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRouterClient(_Base):
    """:class:`RouterClient` for asyncio: the same operations, awaited. The mode is
    read with :meth:`get_mode` and switched with :meth:`set_mode`."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, api_key, timeout_s, control_timeout_s)
        self._http = httpx.AsyncClient(transport=transport)

    async def run(self, op: Op[T]) -> T:
        """Carry out one operation (the ``*_op`` functions of this module)."""
        step = _advance(op, None)
        while not isinstance(step, _Done):
            if isinstance(step, Wait):
                await asyncio.sleep(step.seconds)
                step = _advance(op, None)
                continue
            try:
                r = await self._http.request(**self._args(step))
            except httpx.HTTPError as e:
                raise self._unreachable(e) from None
            step = _advance(op, self._checked(step, r))
        return step.value

    async def complete(
        self, prompt: str, *, max_tokens: int = 16, temperature: float = 0.0, **params: Any
    ) -> Completion:
        return await self.run(
            complete_op(_completion_body("prompt", prompt, max_tokens, temperature, params))
        )

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> Completion:
        return await self.run(
            chat_op(_completion_body("messages", messages, max_tokens, temperature, params))
        )

    async def stream(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict[str, Any]] | None = None,
        max_tokens: int = 16,
        temperature: float = 0.0,
        **params: Any,
    ) -> AsyncIterator[Chunk]:
        call = stream_call(prompt, messages, max_tokens, temperature, params)
        try:
            async with self._http.stream(**self._args(call)) as r:
                if r.status_code != 200:
                    await r.aread()
                    self._checked(call, r)
                async for line in r.aiter_lines():
                    chunk = parse_sse_line(line)
                    if chunk is not None:
                        yield chunk
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    async def requests(
        self, limit: int = 100, *, instance: str | None = None, outcome: str | None = None
    ) -> list[RequestTimeline]:
        return await self.run(requests_op(limit, instance, outcome))

    async def state(self) -> RouterState:
        return await self.run(state_op())

    async def get_mode(self) -> str:
        return (await self.state()).mode

    async def set_mode(self, mode: str) -> RouterState:
        return await self.run(set_mode_op(mode))

    async def drain(self, instance: str) -> RouterState:
        return await self.run(drain_op(instance, True))

    async def resume(self, instance: str) -> RouterState:
        return await self.run(drain_op(instance, False))

    async def wait_drained(
        self, instance: str, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> RoutedInstance:
        return await self.run(wait_drained_op(instance, timeout_s, poll_s))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
