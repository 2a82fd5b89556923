"""The router's engine: choose instances, build both legs, dispatch, observe.

Modes:

* ``push`` — prefill and decode legs are sent **at once**. Decode's
  ``kv_transfer_params`` name the prefill's identity (engine id, side channel, TP, PP)
  known from the spec from the very first request and kept current from every prefill
  response; if a response reveals a different identity (a restarted prefill), the decode
  leg is cancelled and re-sent.
* ``push-sequential`` — prefill first, then decode (the A/B baseline).
* ``pull`` — prefill first; decode gets prefill's ``kv_transfer_params`` as returned.
* ``colocated`` — plain load balancing over every instance.

Both legs carry the same ``X-Request-Id`` on the same path. A failed prefill cancels
decode (502), a leg past its timeout gives 504, and a client that goes away cancels both
legs (closing their connections makes vLLM abort them).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from pdctl.sdk.pd import prefill_body
from pdctl.sdk.router import tracing
from pdctl.sdk.router.instances import Breaker, Upstream
from pdctl.sdk.router.legs import LegFailed, Legs
from pdctl.sdk.router.migrate import migratable, tracker_for, with_token_ids
from pdctl.sdk.router.replies import (
    JSON_HEADERS,
    ROUTER_MODES,
    Reply,
    RouteError,
    RouterMode,
    StreamReply,
    error_body,
    mode_of,
)
from pdctl.sdk.router.timeline import Timeline
from pdctl.sdk.router.tokens import TokensPath
from pdctl.sdk.router.upstream import Response, UpstreamError

_USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')

__all__ = [
    "JSON_HEADERS",
    "ROUTER_MODES",
    "Breaker",
    "Reply",
    "RouteError",
    "Router",
    "RouterMode",
    "StreamReply",
    "Timeline",
    "Upstream",
    "error_body",
    "mode_of",
]


class Router(Legs):
    """Routes OpenAI-style requests over a fleet plan. Single event loop; no locks."""

    _tokens: TokensPath | None = None
    """The tokens path, a strategy given this router's legs (made on first use)."""

    async def route(self, path: str, body: dict[str, Any], tl: Timeline) -> Reply | StreamReply:
        """Dispatch one request. Raises :class:`RouteError` for OpenAI-style errors (the
        caller records it with :meth:`finish`)."""
        if self.settings.path == "tokens" and self.renders:
            if self._tokens is None:
                self._tokens = TokensPath(self, self.route_text)
            return await self._tokens.route(path, body, tl)
        return await self.route_text(path, body, tl)

    async def route_text(
        self, path: str, body: dict[str, Any], tl: Timeline
    ) -> Reply | StreamReply:
        """The text path: the OpenAI body goes to the engines as it is. A streamed
        answer asks decode for its token ids so that it can be migrated."""
        stream = bool(body.get("stream"))
        sent = with_token_ids(body) if stream and self._migrates(body) else body
        cache = self.cache if self.cache_aware else None
        found = await cache.token_ids(path, body, tl) if cache is not None else None
        ids, n = found if found is not None else (None, None)
        try:
            d, r = await self.legs(path, sent, tl, prefill_body, token_ids=ids, prompt_len=n)
        except LegFailed as e:
            if e.upstream.role != "decode" or not self._migrates(body):
                raise
            # decode died before answering: nothing reached the client, start it over
            # on another decode, which computes the prompt itself
            d, r = await self._migrate(path, sent, tl, (e.upstream,), str(e))
        return await self.reply(d, r, tl, stream=stream, body=body, path=path)

    def _migrates(self, body: dict[str, Any]) -> bool:
        return self.settings.migration_limit > 0 and migratable(body) and len(self.decodes) > 1

    async def _migrate(
        self,
        path: str,
        body: dict[str, Any],
        tl: Timeline,
        exclude: tuple[Upstream, ...],
        why: str,
        sent_tokens: int = 0,
    ) -> tuple[Upstream, Response]:
        """Continue (or restart) a request on another decode, decode-only."""
        if len(tl.migrations) >= self.settings.migration_limit:
            raise RouteError(502, f"{why} (router.migration_limit reached)")
        d = await self.acquire(self.decodes, tl, exclude)
        tl.migrations.append(
            {
                "from": exclude[-1].name,
                "to": d.name,
                "at_ms": round(tl.mark() * 1000, 3),
                "tokens_sent": sent_tokens,
                "why": why[:300],
            }
        )
        self.metrics.migrations.inc(exclude[-1].name)
        tracing.migrated(tl, why[:200])
        tl.decode = d.name
        return await self._decode(d, path, body, tl.id, tl, first=False)

    async def reply(
        self,
        d: Upstream,
        r: Response,
        tl: Timeline,
        *,
        stream: bool,
        body: dict[str, Any] | None = None,
        path: str = "",
    ) -> Reply | StreamReply:
        """Relay decode's answer (streamed, or read whole) and settle the timeline. With
        ``body`` (the client's request) a decode that fails mid-answer is migrated."""
        ctype = (r.header(b"content-type") or b"application/json").decode()
        migrate = body is not None and self._migrates(body)
        if stream and r.status == 200:
            chunks = (
                self._relay_migrating(d, r, tl, path, body)
                if migrate and body is not None
                else self._relay(d, r, tl)
            )
            return StreamReply(
                200, chunks, [("Content-Type", ctype), ("Cache-Control", "no-cache")]
            )
        while True:
            try:
                raw = await self.read_decode(d, r)
                break
            except RouteError as e:
                if not migrate or body is None:
                    raise
                self._set(d, False)
                d, r = await self._migrate(path, body, tl, (d,), str(e))
        m = _USAGE_RE.search(raw)
        if m:
            tl.completion_tokens = int(m.group(1))
        self.finish(tl, "ok" if r.status == 200 else "error", r.status)
        return Reply(r.status, raw, [("Content-Type", ctype)])

    async def _relay(self, d: Upstream, r: Response, tl: Timeline) -> AsyncIterator[bytes]:
        """Stream the decode answer through, counting events; settles the timeline. A
        decode failure mid-stream ends the stream with an OpenAI-style error event."""
        events = 0
        try:
            async for chunk in r.iter_chunks():
                if not events:  # a stream's first token, not its response head
                    tl.decode_first_byte = tl.mark()
                events += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
                yield chunk
            tl.completion_tokens = events
            self.finish(tl, "ok", 200)
        except UpstreamError as e:
            for part in self.stream_failed(tl, f"decode {d.name} failed mid-answer: {e}"):
                yield part
        finally:
            self.stream_closed(d, r, tl, events)

    async def _relay_migrating(
        self, d: Upstream, r: Response, tl: Timeline, path: str, body: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        """:meth:`_relay`, one whole event at a time, knowing which tokens the client has:
        when decode fails mid-stream the stream continues on another decode
        (:mod:`pdctl.sdk.router.migrate`), at most ``router.migration_limit`` times."""
        tr = tracker_for(path, body)
        first = True
        leg: tuple[Upstream, Response] | None = (d, r)
        tried: tuple[Upstream, ...] = ()
        try:
            while leg is not None:
                d, r = leg
                try:
                    async for chunk in r.iter_chunks():
                        out = tr.feed(chunk)
                        if out:
                            if first:  # a stream's first token, not its response head
                                tl.decode_first_byte, first = tl.mark(), False
                            yield out
                        if tr.failure is not None:
                            raise UpstreamError(f"decode sent an error event: {tr.failure}")
                    if not (tr.done or tr.finished):
                        raise UpstreamError("the stream ended before its last event")
                    if not tr.done:
                        yield b"data: [DONE]\n\n"
                    tl.completion_tokens = len(tr.sent_ids) or tr.events
                    self.finish(tl, "ok", 200)
                    return
                except UpstreamError as e:
                    why = f"decode {d.name} failed mid-answer: {e}"
                    d.outstanding -= 1
                    r.release()
                    leg = None
                    self._set(d, False)
                    tried += (d,)
                    cont = tr.continuation(body) if tr.can_continue() else None
                    if cont is None:
                        for part in self.stream_failed(tl, why):
                            yield part
                        return
                    cpath, cbody = cont
                    try:
                        leg = await self._migrate(
                            cpath or path, cbody, tl, tried, why, len(tr.sent_ids)
                        )
                    except RouteError as e2:
                        for part in self.stream_failed(tl, f"{why}; {e2}"):
                            yield part
                        return
                    if leg[1].status != 200:
                        nd, nr = leg
                        leg = None
                        raw = await self.read_decode(nd, nr)
                        msg = f"{why}; {nd.name} answered {nr.status}: {raw[:300]!r}"
                        for part in self.stream_failed(tl, msg):
                            yield part
                        return
        finally:
            if leg is not None:
                self.stream_closed(leg[0], leg[1], tl, tr.events)
