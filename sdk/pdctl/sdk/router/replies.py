"""What the router answers: OpenAI-style errors and replies, the dispatch modes, and what an
instance's answer says of the instance (:func:`server_failed`)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Literal

from pdctl.sdk.spec import FleetSpec

RouterMode = Literal["push", "push-sequential", "pull", "colocated"]
ROUTER_MODES: tuple[RouterMode, ...] = ("push", "push-sequential", "pull", "colocated")
JSON_HEADERS = [("Content-Type", "application/json")]


class RouteError(Exception):
    """Becomes an OpenAI-style error response."""

    def __init__(self, status: int, message: str, kind: str = "upstream_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    ).encode()


def mode_of(spec: FleetSpec) -> RouterMode:
    mode = spec.fleet.mode
    if mode == "push":
        concurrent = spec.router.concurrent if spec.router is not None else True
        return "push" if concurrent else "push-sequential"
    return mode


@dataclass
class Reply:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=lambda: list(JSON_HEADERS))


@dataclass
class StreamReply:
    status: int
    chunks: AsyncGenerator[bytes, None]
    headers: list[tuple[str, str]]
    release: Callable[[], None] | None = None
    """Gives back the upstream slot the stream started on (a lease's ``release``)."""

    async def aclose(self) -> None:
        """The client's side is done (answered, gone, or never read): close the stream
        and give back its slot, even when the stream never started."""
        try:
            await self.chunks.aclose()
        finally:
            if self.release is not None:
                self.release()


def server_failed(status: int) -> bool:
    """Whether an instance's answer says the instance failed, not the request: any 5xx.

    What vLLM answers when its EngineCore died, both in the installed vLLM 0.32 and in
    0.33 (``vllm/entrypoints/serve/exception_handling/handlers/vllm_error.py``,
    ``engine_error_handler``, over ``error_response.py``'s ``create_error_response``):
    ``500`` with ``{"error": {"type": "InternalServerError", "code": 500, ...}}``, the
    message ``EngineCore encountered an issue...`` (0.32) or ``The server had an error
    while processing your request.`` (0.33: ``EngineDeadError.CLIENT_MESSAGE``); its
    ``/health`` answers 503 (``vllm/entrypoints/serve/instrumentator/health.py``). A
    stream already under way gets the same error object as an SSE event, then
    ``[DONE]`` (``vllm/entrypoints/openai/completion/serving.py``, the stream
    generator's ``except``). The other 5xx vLLM answers are worth another instance too:
    ``GenerationError`` (500, a request whose generation failed, e.g. its KV could not
    be loaded) and ``QueueOverflowError``/``MaxQueuedTokensError`` (503, "try again ...
    on a different instance", ``vllm/exceptions.py``). The message is not relied on: it
    changed between the two releases."""
    return status >= 500
