"""Every operation of the router client as pure code: the HTTP calls it needs, the waits
between them, and its typed result.

An operation is a generator: it yields a :class:`Call` (the reply's decoded JSON is sent
back into it) or a :class:`Wait`, and returns its result. It does no I/O itself, so
:class:`~pdctl.sdk.client.RouterClient` (blocking) and
:class:`~pdctl.sdk.client.AsyncRouterClient` (asyncio) run the very same operations and
differ only in how they send a call and how they wait; tests may drive one by hand.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pdctl.sdk.client.results import Completion, RequestTimeline, RoutedInstance, RouterState
from pdctl.sdk.errors import RouterError

T = TypeVar("T")

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Call:
    """One HTTP request an operation needs; the reply's JSON is sent back into it."""

    method: str
    endpoint: str
    """The URL path on the router (``/v1/completions``)."""
    body: Any = None
    params: dict[str, Any] | None = None
    control: bool = True
    """A short control call (the client's ``control_timeout_s``), not a completion."""


@dataclass(frozen=True)
class Wait:
    """Pause this many seconds before the next call."""

    seconds: float


Op = Generator[Call | Wait, Any, T]

InstanceEvent = Literal["up", "down"]
"""What :meth:`~pdctl.sdk.client.RouterClient.notify` tells the router about an instance."""


def completion_body(
    key: str, value: Any, max_tokens: int, temperature: float, params: dict[str, Any]
) -> dict[str, Any]:
    return {key: value, "max_tokens": max_tokens, "temperature": temperature, **params}


def complete_op(body: dict[str, Any]) -> Op[Completion]:
    return Completion.from_json((yield Call("POST", COMPLETIONS, body, control=False)))


def chat_op(body: dict[str, Any]) -> Op[Completion]:
    return Completion.from_json((yield Call("POST", CHAT, body, control=False)))


def state_op() -> Op[RouterState]:
    return RouterState.from_json((yield Call("GET", "/v1/pdctl/state")))


def get_mode_op() -> Op[str]:
    return (yield from state_op()).mode


def set_mode_op(mode: str) -> Op[RouterState]:
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/mode", {"mode": mode})))


def set_policy_op(policy: str) -> Op[RouterState]:
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/policy", {"policy": policy})))


def set_admission_op(settings: dict[str, Any]) -> Op[RouterState]:
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/admission", settings)))


def drain_op(instance: str, drain: bool) -> Op[RouterState]:
    body = {"instance": instance, "drain": drain}
    return RouterState.from_json((yield Call("POST", "/v1/pdctl/drain", body)))


def notify_op(instance: str, event: InstanceEvent) -> Op[RouterState]:
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
    """The request of a streamed completion (``prompt``) or chat answer (``messages``)."""
    if (prompt is None) == (messages is None):
        raise ValueError("stream() takes a prompt or messages=[...] (exactly one of them)")
    if prompt is not None:
        body = completion_body("prompt", prompt, max_tokens, temperature, params)
        return Call("POST", COMPLETIONS, {**body, "stream": True}, control=False)
    body = completion_body("messages", messages, max_tokens, temperature, params)
    return Call("POST", CHAT, {**body, "stream": True}, control=False)
