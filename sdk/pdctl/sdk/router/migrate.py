"""Decode migration: continue a stream on another decode when its decode dies mid-answer.

The router asks vLLM for the token ids of every streamed event (``return_token_ids``;
removed again before the client sees the event unless the client asked for them) and
relays the stream one whole SSE event at a time (:class:`pdctl.sdk.sse.EventFramer`;
comments and events without data are not relayed), so at any moment it knows exactly
which tokens the client has received. On the happy path the events go through as decode
sent them: a block of whole events in vLLM's framing is forwarded as raw bytes, its
token ids cut out of it by a byte pattern and kept unparsed until a failure needs them;
only the events that carry what a continuation needs (the prompt's ids, a finish
reason, an error, ``[DONE]``) and whatever is framed otherwise are decoded.

When the decode fails mid-stream, the request continues on another decode as a plain
completion whose prompt is the original prompt's token ids plus the tokens already
sent, with ``max_tokens`` reduced by as many; the new decode computes that prefix
itself (decode-only: no prefill, no KV transfer). Its events are rewritten into the
original stream's shape (id, object, chat deltas), so the client sees one
uninterrupted stream with no token lost or repeated.

With stop strings, the tokens whose text a stop string not found yet may have begun in
are computed again by the continuation (what the client has of them skipped), so that
it is found once (:meth:`StreamTracker._kept`).

Limits: one choice (``n == 1``) and no ``echo``. Recomputing the KV of already-sent
tokens can make a greedy continuation differ numerically from what the dead decode
would have produced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.sse import DONE, Event, EventFramer, encode_event

CONTINUE_ENDPOINT = "/v1/completions"
"""Continuations are token-id completions, whatever the original endpoint."""

# Sampling fields a continuation keeps from the original request (both endpoints).
_CARRIED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "min_tokens",
)


_TOKEN_IDS = re.compile(rb',\s*"token_ids"\s*:\s*(?:\[([0-9,\s]*)\]|null)')
"""A choice's ``token_ids`` in an event's raw JSON. In valid JSON a comma before a quote
is never inside a string (a string's own quotes are escaped), so this only ever matches
the key; a block where the key is found anywhere else is decoded instead."""
_TOKEN_EVENT = b'data: {"id"'
"""How a token event of vLLM's starts (its models' first field is the id); the stream's
error event (``{"error": ...}``) and ``[DONE]`` do not, and are decoded."""
_FINISH = b'"finish_reason"'
_NO_FINISH = b'"finish_reason":null'
_NO_FINISH_SPACED = b'"finish_reason": null'


def migratable(body: dict[str, Any]) -> bool:
    """Whether a request's stream can be continued elsewhere."""
    n = body.get("n", 1)
    return (n in (None, 1)) and not body.get("echo") and not body.get("use_beam_search")


def with_token_ids(body: dict[str, Any]) -> dict[str, Any]:
    """The request as sent to decode: vLLM also returns the token ids of every event."""
    if body.get("return_token_ids"):
        return body
    return {**body, "return_token_ids": True}


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


@dataclass
class StreamTracker:
    """Follows a relayed SSE stream one whole event at a time.

    :meth:`feed` takes raw bytes from decode and returns the bytes to send the client:
    only complete events, rewritten (token ids hidden unless asked for; a continuation's
    events put in the original's shape). What was returned is what the client has."""

    chat: bool
    client_wants_ids: bool
    include_usage: bool = False
    stream_id: str | None = None
    prompt_ids: list[int] | None = None
    _sent: list[int] = field(default_factory=list, repr=False)
    finished: bool = False
    """A finish_reason was sent: nothing is left to continue."""
    done: bool = False
    """``[DONE]`` was sent."""
    events: int = 0
    failure: str | None = None
    """An error event decode sent instead of tokens (an engine that died under it)."""
    continuing: bool = False
    """The events now come from a continuation (a token-id completion)."""
    _sent_before: int = 0
    """Tokens sent before the current continuation started (for usage)."""
    held_back: int = 0
    """How many characters of its text vLLM may hold back behind the tokens it sent: a
    stop string's length less one (its detokenizer's ``stop_buffer_length``), 0 when
    the stop strings are sent too (``include_stop_str_in_output``) or there are none."""
    lookback: int = 0
    """How many characters before the end of the text a stop string not found yet may
    have begun at: the longest stop string's length less one (0: none), whether or not
    vLLM holds text back (``include_stop_str_in_output``): vLLM checks stop strings on
    the text it generated, never on its prompt's (``check_stop_strings``)."""
    track_text: bool = False
    """Count the text sent, event by event (stop strings; completions' logprobs, whose
    text offsets a continuation shifts): such a stream is decoded event by event."""
    top_logprobs: int = 0
    """Chat: how many alternatives each token's logprobs list."""
    chars: int = 0
    """Characters of text sent (when :attr:`track_text`)."""
    _marks: list[tuple[int, int]] = field(default_factory=list, repr=False)
    """(tokens sent, characters sent) after each event (when :attr:`track_text`)."""
    _skip_ids: int = 0
    _skip_chars: int = 0
    """What the continuation under way recomputes that the client has already."""
    _offset: int = 0
    """Where the continuation's text starts in the answer's (its text offsets shift)."""
    _framer: EventFramer = field(default_factory=lambda: EventFramer(_TOKEN_EVENT), repr=False)
    _plain_ok: bool = field(default=False, repr=False)
    """Plain token events may go through as they came: the first event (the prompt's
    ids, vLLM's only event that has them) was decoded, and no continuation is under
    way (its events are rewritten into the original's shape)."""
    _ids: list[bytes] = field(default_factory=list, repr=False)
    """Token ids of plain blocks, as the bytes between their brackets: parsed only when
    :attr:`sent_ids` is read."""

    @property
    def sent_ids(self) -> list[int]:
        """The token ids the client has, in order."""
        if self._ids:
            ids = b",".join(self._ids).split(b",")
            self._sent.extend(int(i) for i in ids if i.strip())
            self._ids.clear()
        return self._sent

    def feed(self, chunk: bytes) -> bytes:
        raw, n = self._framer.feed(chunk)
        if not raw:
            return b""
        if n > 0 and self._plain_ok:
            out = self._plain(raw, n)
            if out is not None:
                return out
        pieces = self._framer.pieces(raw) if n != 1 else None
        if pieces is None:
            return self._decoded(raw)
        # several events that cannot all go through at once (a finish, the [DONE], an
        # error event among them): each as it would have been, had it come alone
        parts: list[bytes] = []
        for piece, plain in pieces:
            out = self._plain(piece, 1) if plain and self._plain_ok else None
            parts.append(out if out is not None else self._decoded(piece))
            if self.failure is not None:
                break
        return b"".join(parts)

    def _decoded(self, raw: bytes) -> bytes:
        """The events of ``raw`` decoded one by one (the parser sees them in order)."""
        parts: list[bytes] = []
        for event in self._framer.events(raw):
            part = self._event(event)
            if self.failure is not None:
                break  # what the failed decode sent after its error event is not relayed
            if part is not None:
                parts.append(part)
        out = b"".join(parts)
        self._plain_ok = not self.continuing and not self.track_text
        return out

    def _plain(self, block: bytes, n: int) -> bytes | None:
        """``n`` plain token events as they go to the client: forwarded as they came,
        their token ids kept (raw) and cut out unless the client asked for them. None:
        the block must be decoded (a finish reason in it, or ids where the pattern does
        not find them)."""
        if n != 1 or _NO_FINISH not in block:  # one event of one choice: null, not finished
            finish = block.count(_FINISH)
            nulls = block.count(_NO_FINISH) if finish else 0  # vLLM's compact JSON, else spaced
            if finish != nulls and finish != nulls + block.count(_NO_FINISH_SPACED):
                return None
        out = block
        if b'"token_ids"' in block:
            parts = _TOKEN_IDS.split(block)
            if not self.client_wants_ids:
                out = b"".join(parts[::2])
                if b'"token_ids"' in out:
                    return None
            self._ids.extend(p for p in parts[1::2] if p)
        self.events += n
        return out

    def _event(self, event: Event) -> bytes | None:
        if event.data == DONE:
            self.done = True
            return b"data: [DONE]\n\n"
        try:
            obj = json.loads(event.data)
        except ValueError:
            return encode_event(event)
        if not isinstance(obj, dict):
            return encode_event(event)
        if "error" in obj and "choices" not in obj:
            err = obj.get("error")
            code = err.get("code") if isinstance(err, dict) else None
            if not isinstance(code, int) or code >= 500:
                self.failure = json.dumps(err)[:300]
                return None  # the caller decides: continue elsewhere or end the stream
            return encode_event(event)
        return self._tokens_event(obj)

    def _tokens_event(self, obj: dict[str, Any]) -> bytes | None:
        if self.stream_id is None:
            self.stream_id = obj.get("id")
        ptoks = obj.pop("prompt_token_ids", None)  # chat: top level, first event
        choices = [ch for ch in obj.get("choices") or [] if isinstance(ch, dict)]
        for ch in choices:
            ptoks = ch.pop("prompt_token_ids", None) or ptoks  # completions: in the choice
            self._choice(ch)
        if isinstance(ptoks, list) and self.prompt_ids is None and not self.continuing:
            self.prompt_ids = [i for i in ptoks if isinstance(i, int)]
            if self.client_wants_ids:
                obj["prompt_token_ids"] = self.prompt_ids
        obj.pop("prompt_text", None)
        if self.continuing:
            kept = [ch for ch in choices if ch]
            if choices and not kept and not obj.get("usage"):
                return None  # every token of it was one the client had: nothing to send
            obj["choices"] = kept
            self._as_original(obj)
        self.events += 1
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def _choice(self, ch: dict[str, Any]) -> None:
        """Note what a choice sends the client (its token ids, its finish, its text's
        length) and shape it for the client (a continuation's in the original's)."""
        if self.continuing:
            self._recomputed(ch)
            if not ch:
                return
        ids = ch.get("token_ids")
        if isinstance(ids, list):
            self.sent_ids.extend(i for i in ids if isinstance(i, int))
        if not self.client_wants_ids:
            ch.pop("token_ids", None)
        if ch.get("finish_reason") is not None:
            self.finished = True
        if self.continuing and self.chat:
            _chat_shaped(ch, self.top_logprobs)
        if self.track_text:
            delta = ch.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else ch.get("text")
            self.chars += len(text) if isinstance(text, str) else 0
            self._marks.append((len(self.sent_ids), self.chars))

    def _as_original(self, obj: dict[str, Any]) -> None:
        """A continuation's event as one of the original stream: its id, its object,
        its usage counting the whole answer (the prompt the client sent, every token)."""
        if self.stream_id is not None:
            obj["id"] = self.stream_id
        if self.chat:
            obj["object"] = "chat.completion.chunk"
        usage = obj.get("usage")
        if isinstance(usage, dict) and self.prompt_ids is not None:
            done = int(usage.get("completion_tokens") or 0) + self._sent_before
            usage["prompt_tokens"] = len(self.prompt_ids)
            usage["completion_tokens"] = done
            usage["total_tokens"] = len(self.prompt_ids) + done

    def _recomputed(self, ch: dict[str, Any]) -> None:
        """A continuation's choice without what the client already has: the first
        :attr:`_skip_ids` tokens (and their logprobs) and :attr:`_skip_chars` characters
        it recomputed (:meth:`continuation`); its text offsets made the original's."""
        ids = ch.get("token_ids")
        k = min(self._skip_ids, len(ids)) if isinstance(ids, list) else 0
        lp = ch.get("logprobs")
        if k and isinstance(ids, list):
            self._skip_ids -= k
            ch["token_ids"] = ids[k:]
            if isinstance(lp, dict):
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    if isinstance(lp.get(key), list):
                        lp[key] = lp[key][k:]
        if isinstance(lp, dict) and isinstance(lp.get("text_offset"), list):
            lp["text_offset"] = [
                o + self._offset if isinstance(o, int) else o for o in lp["text_offset"]
            ]
        text = ch.get("text")
        if self._skip_chars and isinstance(text, str):
            cut = min(self._skip_chars, len(text))
            self._skip_chars -= cut
            ch["text"] = text[cut:]
        if k and not ch.get("token_ids") and not ch.get("text") and not ch.get("finish_reason"):
            ch.clear()  # dropped by the caller

    def can_continue(self) -> bool:
        """Whether the stream can go on elsewhere: the prompt's ids are known (or nothing
        was sent yet: no event, e.g. a stream sent without token ids) and it had not
        finished."""
        return (
            not self.finished
            and not self.done
            and (self.prompt_ids is not None or (not self.sent_ids and not self.events))
        )

    def continuation(self, body: dict[str, Any]) -> tuple[str | None, dict[str, Any]] | None:
        """The request that continues this stream on another decode: ``(endpoint, body)``
        (``endpoint`` None: the original one), or None when nothing is left to generate.
        Resets the tracker for the continuation's events."""
        self._framer = EventFramer(_TOKEN_EVENT)  # the continuation's own stream
        self._plain_ok = False
        self.failure = None

        if self.prompt_ids is None:  # nothing reached the client: start over elsewhere
            return None, with_token_ids(body)
        keep = self._kept()
        limit = _max_tokens(body)
        left = None if limit is None else limit - keep
        if limit is not None and len(self.sent_ids) >= limit:
            return None
        new: dict[str, Any] = {k: body[k] for k in _CARRIED if k in body}
        new.update(
            model=body.get("model"),
            prompt=self.prompt_ids + self.sent_ids[:keep],
            stream=True,
            return_token_ids=True,
        )
        if left is not None:
            new["max_tokens"] = left
        if isinstance(new.get("min_tokens"), int):
            new["min_tokens"] = max(0, new["min_tokens"] - keep)
        if self.include_usage:
            new["stream_options"] = {"include_usage": True}
        lp = body.get("logprobs")
        if self.chat and lp:
            new["logprobs"] = self.top_logprobs
        elif not self.chat and isinstance(lp, int) and not isinstance(lp, bool):
            new["logprobs"] = lp
        self.continuing = True
        self._sent_before = keep
        self._skip_ids = len(self.sent_ids) - keep
        self._offset = self._text_at(keep)
        self._skip_chars = self.chars - self._offset
        return CONTINUE_ENDPOINT, new

    def _kept(self) -> int:
        """How many of the tokens sent a continuation's prompt takes: all of them,
        unless a stop string not found yet may have begun in the text of the last ones
        (:attr:`lookback`); then only those whose text ends before any such start. The
        rest are computed again, so that a stop string that began in them is found,
        once, by the decode that continues (which checks only the text it generates).

        After an event, vLLM has sent all of its text but the last ``held_back``
        characters (none with ``include_stop_str_in_output``): an event after which
        ``c`` characters were sent (``c > 0`` when text is held back) had produced
        ``c + held_back``; a stop string not found yet begins no earlier than
        ``lookback`` characters before the end of what was produced, ``self.chars +
        held_back``: the event's tokens are kept when ``c + lookback <= self.chars``."""
        if not self.lookback:
            return len(self.sent_ids)
        keep = 0
        for tokens, chars in self._marks:
            if (chars or not self.held_back) and chars + self.lookback <= self.chars:
                keep = tokens
        return keep

    def _text_at(self, keep: int) -> int:
        """How long the answer's text was once its first ``keep`` tokens were made."""
        if keep == len(self.sent_ids) or not self.lookback:
            return self.chars
        for tokens, chars in self._marks:
            if tokens == keep and (chars or not self.held_back):
                return chars + self.held_back
        return 0


def _chat_shaped(ch: dict[str, Any], top: int) -> None:
    """A completions choice of a continuation as a chat chunk's choice: its text a
    delta, its logprobs chat's (``content`` entries with ``bytes`` and a
    ``top_logprobs`` list of the first ``top`` alternatives, as vLLM's chat server
    takes them from the same logprobs; ``vllm/entrypoints/openai/chat_completion/
    serving.py``, ``_create_chat_logprobs``)."""
    text = ch.pop("text", "")
    ch["delta"] = {"content": text} if text else {}
    ch.pop("prompt_logprobs", None)
    lp = ch.get("logprobs")
    if not isinstance(lp, dict):
        return
    tokens, lps, tops = (
        lp.get("tokens") or [],
        lp.get("token_logprobs") or [],
        lp.get("top_logprobs") or [],
    )
    content = []
    for i, tok in enumerate(tokens):
        alts = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        content.append(
            {
                "token": tok,
                "logprob": lps[i] if i < len(lps) else None,
                "bytes": list(str(tok).encode("utf-8", errors="replace")),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode("utf-8", errors="replace"))}
                    for t, v in list(alts.items())[:top]
                ],
            }
        )
    ch["logprobs"] = {"content": content}


def _stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return [stop] if stop else []
    return [s for s in stop or [] if isinstance(s, str) and s] if isinstance(stop, list) else []


def tracker_for(endpoint: str, body: dict[str, Any]) -> StreamTracker:
    opts = body.get("stream_options")
    chat = endpoint.endswith("/chat/completions")
    stops = _stop_strings(body)
    lookback = max(map(len, stops)) - 1 if stops else 0
    held = 0 if body.get("include_stop_str_in_output") else lookback
    top = body.get("top_logprobs")
    return StreamTracker(
        chat=chat,
        client_wants_ids=bool(body.get("return_token_ids")),
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage")),
        held_back=held,
        lookback=lookback,
        track_text=bool(stops) or (not chat and body.get("logprobs") is not None),
        top_logprobs=top if isinstance(top, int) and not isinstance(top, bool) else 0,
    )
