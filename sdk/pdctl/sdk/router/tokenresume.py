"""What the tokens path keeps of a stream to continue it on another decode, and decode's
generate stream read as chunks (:mod:`pdctl.sdk.router.tokens`).

Every chunk of ``/inference/v1/generate`` carries its token ids, so the router always
knows the tokens the client has; a continuation is a ``GenerateRequest`` whose prompt is
the original prompt's ids followed by them (decode-only), ``max_tokens`` less as many.

**Stop strings.** The engine checks stop strings on the text it generates, never on its
prompt's (``vllm/v1/engine/detokenizer.py``, ``check_stop_strings`` over the output text
only). A stop string whose first characters came from the decode that died and whose
last come from the continuation would not be found. So with stop strings the
continuation's prompt stops short: at the last chunk whose text ends at least
``max(len(stop)) - 1`` characters before the end of the text sent (a stop string that
began earlier would have ended, and been found, on the decode that died). The tokens
after it are computed again by the new decode, which therefore sees every character a
stop string could start at and finds it once; the ids the client already has are cut out
of its chunks (with their logprobs) before the render server derenders them, so the
derender's state goes on as if nothing happened.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pdctl.sdk.router.httpclient import Response, UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.sse import DONE, EventParser


def _lookback(gen: dict[str, Any], body: dict[str, Any]) -> int:
    """How many characters before the end of the text a stop string may have begun at
    without having ended yet: the longest stop string's length less one (0: none)."""
    sampling = gen.get("sampling_params")
    stop = sampling.get("stop") if isinstance(sampling, dict) else None
    if stop is None:
        stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    lengths = [len(s) for s in stops if isinstance(s, str) and s]
    return max(lengths) - 1 if lengths else 0


def _text(chunk: Any) -> int:
    """Characters of text in a derendered chunk (completions' text, chat's delta)."""
    n = 0
    for ch in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        parts = (
            [delta.get(k) for k in ("content", "reasoning", "reasoning_content")]
            if isinstance(delta, dict)
            else [ch.get("text")]
        )
        n += sum(len(p) for p in parts if isinstance(p, str))
    return n


class Resume:
    """One stream's continuation state: the token ids the client has (every chunk
    carries its ids), whether it finished, the decodes that failed it; and, with stop
    strings, how much text each chunk added (:meth:`derendered`).
    :meth:`continuation` is the ``GenerateRequest`` that goes on from there."""

    def __init__(
        self, gen: dict[str, Any], tried: tuple[Upstream, ...], body: dict[str, Any] | None = None
    ) -> None:
        self.gen, self.tried = gen, tried
        self.ids: list[int] = []
        self.finished = False
        self.error: str | None = None
        """The 5xx error event decode sent (None: its connection was lost)."""
        self.sent_before = 0
        """Tokens of the answer before the continuation under way (for its usage)."""
        self.lookback = _lookback(gen, body or {})
        self.chars = 0
        """Characters of text sent (with stop strings)."""
        self._marks: list[tuple[int, int]] = []
        """(tokens sent, characters sent) after each derendered chunk (stop strings)."""
        self._skip = 0
        """Ids the continuation under way computes again that the client has."""
        self._continuing = False

    def seen(self, chunk: dict[str, Any]) -> bool:
        """Note a generate chunk's ids and finish; cut out of it what the client has
        already (a continuation's recomputed ids and their logprobs, its prompt's ids).
        False: nothing is left of it to derender."""
        keep = not self._continuing
        if self._continuing:
            chunk.pop("prompt_token_ids", None)  # the continuation's own prompt
            chunk.pop("mm_placeholders", None)
        for ch in chunk.get("choices") or []:
            if not isinstance(ch, dict):
                continue
            got = ch.get("token_ids")
            if isinstance(got, list) and self._skip:
                k = min(self._skip, len(got))
                self._skip -= k
                got = ch["token_ids"] = got[k:]
                lp = ch.get("logprobs")
                if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                    lp["content"] = lp["content"][k:]
            if isinstance(got, list):
                self.ids.extend(t for t in got if isinstance(t, int))
                keep = keep or bool(got)
            if ch.get("finish_reason") is not None:
                self.finished = keep = True
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            keep = True
            if self._continuing:
                done = int(usage.get("completion_tokens") or 0) + self.sent_before
                prompt = len(self.gen.get("token_ids") or [])
                chunk["usage"] = {**usage, "prompt_tokens": prompt, "completion_tokens": done,
                                  "total_tokens": prompt + done}  # fmt: skip
        return keep

    def derendered(self, out: Any) -> None:
        """Note the text the client got for the ids seen so far (stop strings only)."""
        if self.lookback:
            self.chars += _text(out)
            self._marks.append((len(self.ids), self.chars))

    def _kept(self) -> int:
        """How many of the ids sent the continuation's prompt takes (:mod:`module doc
        <pdctl.sdk.router.tokenresume>`)."""
        if not self.lookback:
            return len(self.ids)
        keep = 0
        for tokens, chars in self._marks:
            if chars + self.lookback <= self.chars:
                keep = tokens
        return keep

    def continuation(self) -> dict[str, Any] | None:
        """The ``GenerateRequest`` that goes on (None: nothing is left to generate)."""
        sampling = dict(self.gen.get("sampling_params") or {})
        limit = sampling.get("max_tokens")
        if isinstance(limit, int) and limit - len(self.ids) <= 0:
            return None
        keep = self._kept()
        if isinstance(limit, int):
            sampling["max_tokens"] = limit - keep
        if isinstance(sampling.get("min_tokens"), int):
            sampling["min_tokens"] = max(0, sampling["min_tokens"] - keep)
        self.sent_before, self._skip, self._continuing = keep, len(self.ids) - keep, True
        self.error = None
        prompt = list(self.gen.get("token_ids") or [])
        body = {k: v for k, v in self.gen.items() if k != "kv_transfer_params"}
        return {**body, "token_ids": prompt + self.ids[:keep], "sampling_params": sampling}


async def sse_events(r: Response) -> AsyncIterator[str]:
    """The data of each event of an SSE stream, whatever its chunking (lines end at CR, LF
    or CRLF only: :mod:`pdctl.sdk.sse`)."""
    parser = EventParser()
    async for chunk in r.iter_chunks():
        for event in parser.feed(chunk):
            yield event.data


async def generated(r: Response, resume: Resume | None) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a ``/inference/v1/generate`` stream, to its ``[DONE]``, less what
    the client has already (:meth:`Resume.seen`); a 5xx error event (an engine that died
    under the stream) or a stream that ends before its last chunk raises
    :class:`UpstreamError` (noted on ``resume``)."""
    async for data in sse_events(r):
        if data == DONE:
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"decode sent a chunk that is not an object: {data[:100]}")
        err = chunk.get("error")
        if err is not None and "choices" not in chunk:
            code = err.get("code") if isinstance(err, dict) else None
            if not isinstance(code, int) or code >= 500:
                if resume is not None:
                    resume.error = json.dumps(err)[:300]
                raise UpstreamError(f"decode sent an error event: {json.dumps(err)[:300]}")
        if resume is not None and not resume.seen(chunk):
            continue
        yield chunk
    if resume is not None and not resume.finished:
        raise UpstreamError("the stream ended before its last event")
