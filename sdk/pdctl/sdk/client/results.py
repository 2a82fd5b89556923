"""What a pdctl router answers, as typed values: completions, stream chunks, the flight
recorder's request timelines (``GET /v1/pdctl/requests``) and its control state
(``GET /v1/pdctl/state``).

Each type keeps the decoded JSON it came from in ``raw`` for fields it does not name.
Plain data: the router (which writes these shapes) and the client (which reads them) may
both import this module; it imports nothing of either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.sse import DONE


def _first_choice(data: Any) -> dict[str, Any]:
    choices = data.get("choices") if isinstance(data, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else {}


def _text_of(choice: dict[str, Any]) -> str:
    """A completion's ``text``, or a chat answer's ``message``/``delta`` content."""
    if isinstance(choice.get("text"), str):
        return str(choice["text"])
    part = choice.get("message") or choice.get("delta") or {}
    content = part.get("content") if isinstance(part, dict) else None
    return content if isinstance(content, str) else ""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Completion:
    """One answer of ``/v1/completions`` or ``/v1/chat/completions`` (first choice)."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    id: str
    model: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Completion:
        choice = _first_choice(data)
        raw: dict[str, Any] = data if isinstance(data, dict) else {}
        usage = raw.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return cls(
            text=_text_of(choice),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            id=str(raw.get("id", "")),
            model=str(raw.get("model", "")),
            raw=raw,
        )


@dataclass(frozen=True)
class Chunk:
    """One event of a streamed answer: the new text (may be empty) and, on the last,
    why it finished."""

    text: str
    finish_reason: str | None
    raw: dict[str, Any] = field(repr=False)


def chunk_of(data: str) -> Chunk | None:
    """The data of one event of an OpenAI stream as a :class:`Chunk`; None for the closing
    ``[DONE]`` and for data that is not a JSON object."""
    if data == DONE:
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    choice = _first_choice(obj)
    return Chunk(_text_of(choice), choice.get("finish_reason"), obj)


@dataclass(frozen=True)
class Segment:
    """One piece of a request's time to first token, in milliseconds since the router
    received it; ``source`` says which clock measured it (router, prefill, decode)."""

    name: str
    start_ms: float
    end_ms: float
    source: str

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms


def _ms(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class RequestTimeline:
    """One finished request as the router recorded it (``*_ms``: milliseconds since it
    was received; None where the request never got there)."""

    id: str
    mode: str
    path: str
    stream: bool
    received: float
    """Unix time the router received it."""
    prefill: str | None
    decode: str | None
    outcome: str
    """ok | error | cancelled."""
    status: int | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    prefill_sent_ms: float | None
    prefill_done_ms: float | None
    decode_sent_ms: float | None
    decode_first_byte_ms: float | None
    done_ms: float | None
    ttft_ms: float | None
    retries: int
    segments: tuple[Segment, ...]
    notes: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False)
    predicted_ttft_ms: float | None = None
    """The router's TTFT prediction for its P->D pair when it was placed (None: unknown)."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestTimeline:
        def opt(key: str) -> str | None:
            v = d.get(key)
            return None if v is None else str(v)

        return cls(
            id=str(d.get("id", "")),
            mode=str(d.get("mode", "")),
            path=str(d.get("path", "")),
            stream=bool(d.get("stream")),
            received=float(d.get("received") or 0.0),
            prefill=opt("prefill"),
            decode=opt("decode"),
            outcome=str(d.get("outcome", "")),
            status=_int(d.get("status")),
            error=opt("error"),
            prompt_tokens=_int(d.get("prompt_tokens")),
            completion_tokens=_int(d.get("completion_tokens")),
            prefill_sent_ms=_ms(d.get("prefill_sent_ms")),
            prefill_done_ms=_ms(d.get("prefill_done_ms")),
            decode_sent_ms=_ms(d.get("decode_sent_ms")),
            decode_first_byte_ms=_ms(d.get("decode_first_byte_ms")),
            done_ms=_ms(d.get("done_ms")),
            ttft_ms=_ms(d.get("ttft_ms")),
            retries=_int(d.get("retries")) or 0,
            segments=tuple(
                Segment(
                    str(s.get("name", "")),
                    _ms(s.get("start_ms")) or 0.0,
                    _ms(s.get("end_ms")) or 0.0,
                    str(s.get("source", "")),
                )
                for s in d.get("segments") or ()
                if isinstance(s, dict)
            ),
            notes=tuple(str(n) for n in d.get("notes") or ()),
            raw=d,
            predicted_ttft_ms=_ms(d.get("predicted_ttft_ms")),
        )


@dataclass(frozen=True)
class RoutedInstance:
    name: str
    role: str
    url: str
    healthy: bool
    drained: bool
    in_flight: int
    """Legs the router has sent to this instance that have not finished."""
    breaker: str
    kv_index: str | None = None
    """cache_aware: EXACT (from the instance's KV events), DEGRADED (events lagging or
    lost) or FALLBACK (the router's routing history); None with other policies."""
    prefix_hit_rate: float | None = None
    """cache_aware: share of routed prompt blocks the index believed the instance held."""


@dataclass(frozen=True)
class RouterState:
    mode: str
    modes: tuple[str, ...]
    """The modes this fleet supports (``push`` and ``push-sequential`` for push fleets)."""
    instances: tuple[RoutedInstance, ...]
    admission: dict[str, Any] = field(default_factory=dict)
    """Admission control's settings and counts (``enabled``, ``max_queued``, ``queued``,
    ``in_prefill``, ``in_flight``, ``saturated``, ``unknown``, ...); empty from a router
    without it."""

    def instance(self, name: str) -> RoutedInstance:
        for i in self.instances:
            if i.name == name:
                return i
        raise KeyError(name)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RouterState:
        index = (data.get("kv_index") or {}).get("instances") or {}
        return cls(
            mode=str(data.get("mode")),
            modes=tuple(str(m) for m in data.get("modes", ())),
            instances=tuple(
                RoutedInstance(
                    name=str(i["name"]),
                    role=str(i["role"]),
                    url=str(i["url"]),
                    healthy=bool(i["healthy"]),
                    drained=bool(i["drained"]),
                    in_flight=int(i["in_flight"]),
                    breaker=str(i["breaker"]),
                    kv_index=index.get(i["name"], {}).get("state"),
                    prefix_hit_rate=index.get(i["name"], {}).get("predicted_hit_rate"),
                )
                for i in data.get("instances", ())
            ),
            admission=dict(data.get("admission") or {}),
        )
