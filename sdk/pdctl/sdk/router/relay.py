"""The relay: decode's answer back to the client — read whole or streamed through — and
the request settled in the ledger. A decode failing mid-answer on a migratable request
continues on another decode (:class:`~pdctl.sdk.router.recovery.Recovery` decides, the
leg sender sends)."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import Any

from pdctl.sdk.router.httpclient import UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.lease import Lease
from pdctl.sdk.router.ledger import Ledger
from pdctl.sdk.router.legs import LegSender
from pdctl.sdk.router.migrate import StreamTracker, tracker_for
from pdctl.sdk.router.recovery import passthrough
from pdctl.sdk.router.replies import Reply, RouteError, StreamReply, error_body, server_failed
from pdctl.sdk.router.timeline import Timeline
from pdctl.sdk.sse import EventFramer

USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
"""An answer's completion length (its usage block), without parsing the whole answer."""


class Relay:
    """Relays decode's answers and settles their timelines."""

    def __init__(self, instances: InstanceSet, legs: LegSender, ledger: Ledger) -> None:
        self.instances, self.legs, self.ledger = instances, legs, ledger
        self.layout_note: str | None = None
        """Set when the fleet was launched past a handshake lint error: vLLM's own 5xx
        for such a request says only "Internal server error", so the answer names it."""

    async def read(self, leg: Lease) -> bytes:
        """Decode's whole answer; the leg's slot is given back."""
        try:
            return await leg.read()
        except UpstreamError as e:
            raise RouteError(502, f"decode {leg.upstream.name} failed mid-answer: {e}") from None

    def stream_failed(self, tl: Timeline, msg: str) -> tuple[bytes, bytes]:
        """Settle a stream that broke mid-answer; the two SSE events that end it cleanly
        for the client (an OpenAI-style error, then ``[DONE]``)."""
        self.ledger.finish(tl, "error", 502, msg)
        return b"data: " + error_body(502, msg, "upstream_error") + b"\n\n", b"data: [DONE]\n\n"

    def closed(self, leg: Lease, tl: Timeline, events: int) -> None:
        """A relayed stream ended (or its client went away): give back decode's slot."""
        leg.release()
        if tl.done is None:  # the client went away
            tl.completion_tokens = events
            self.ledger.finish(tl, "cancelled", 499, "client disconnected")

    def stream(
        self, leg: Lease, chunks: AsyncGenerator[bytes, None], ctype: str = "text/event-stream"
    ) -> StreamReply:
        """A streamed reply over ``chunks`` that gives back ``leg`` when it is closed."""
        headers = [("Content-Type", ctype), ("Cache-Control", "no-cache")]
        return StreamReply(200, chunks, headers, leg.release)

    async def reply(
        self,
        leg: Lease,
        tl: Timeline,
        *,
        stream: bool,
        body: dict[str, Any] | None = None,
        endpoint: str = "",
        migrate: bool = False,
        tried: tuple[Upstream, ...] = (),
    ) -> Reply | StreamReply:
        """Relay decode's answer (streamed, or read whole) and settle the timeline. With
        ``migrate`` (:meth:`Recovery.migrates` said so for ``body``, the client's request)
        a decode that fails before the client has anything — a 5xx answer or response
        head (vLLM's engine-dead error), or the connection lost while reading a whole
        answer — is left for another decode (decode-only), at most
        ``router.migration_limit`` times; a stream that fails later continues where it
        was (:meth:`_relay_migrating`). ``tried``: the decodes that failed it already."""
        leg, raw, tried = await self.whole(
            leg, tl, endpoint, body if migrate else None, tried, stream=stream
        )
        assert leg.response is not None
        ctype = (leg.response.header(b"content-type") or b"application/json").decode()
        if raw is None:  # a stream, its head 200
            if migrate and body is not None:
                chunks = self._relay_migrating(leg, tl, endpoint, body, tried)
                return self.stream(leg, chunks, ctype)
            return self.stream(leg, self._relay(leg, tl), ctype)
        m = USAGE_RE.search(raw)
        if m:
            tl.completion_tokens = int(m.group(1))
        if leg.status >= 500 and self.layout_note is not None:
            raw = self._named(leg, raw, self.layout_note)
            ctype = "application/json"
        self.ledger.finish(tl, "ok" if leg.status == 200 else "error", leg.status)
        return Reply(leg.status, raw, [("Content-Type", ctype)])

    async def whole(
        self,
        leg: Lease,
        tl: Timeline,
        endpoint: str,
        body: dict[str, Any] | None,
        tried: tuple[Upstream, ...] = (),
        *,
        stream: bool = False,
        sent: dict[str, Any] | None = None,
    ) -> tuple[Lease, bytes | None, tuple[Upstream, ...]]:
        """Decode's whole answer, the lease it came on and the decodes that failed it
        (answer None: ``stream``, and its head is 200: the caller relays it). With
        ``body`` (a migratable request) a decode that fails before the client has
        anything — a 5xx answer or response head (vLLM's engine-dead error), or the
        connection lost while reading a whole answer — is left for another decode
        (decode-only), at most ``router.migration_limit`` times; once none is left the
        client gets the last one's own answer. ``sent``: the body a decode gets, when
        not what :meth:`Recovery.as_sent` makes of ``body`` (the tokens path's)."""
        while True:
            if stream and leg.status == 200:
                return leg, None, tried
            try:
                raw = await self.read(leg)
            except RouteError as e:
                if body is None:
                    raise
                tried += (leg.upstream,)
                leg = await self.restart(endpoint, body, tl, tried, str(e), sent=sent)
                continue
            if body is None or not server_failed(leg.status):
                return leg, raw, tried
            text = raw[:300].decode(errors="replace")
            why = f"decode {leg.upstream.name} answered {leg.status}: {text}"
            try:
                nxt = await self.restart(
                    endpoint, body, tl, (*tried, leg.upstream), why, answered=True, sent=sent
                )
            except RouteError:
                return leg, raw, tried  # nowhere left to go: decode's own answer
            leg, tried = nxt, (*tried, leg.upstream)

    async def restart(
        self,
        endpoint: str,
        body: dict[str, Any],
        tl: Timeline,
        tried: tuple[Upstream, ...],
        why: str,
        *,
        answered: bool = False,
        sent: dict[str, Any] | None = None,
    ) -> Lease:
        """Start a request the client has nothing of yet over after ``tried[-1]``
        failed it (``answered``: with a 5xx answer; else its connection was lost):
        decode-only, the KV its prefill pushed released, on another decode (or on the
        same one, alive and the only one: :meth:`Recovery.migration_target`). Raises
        :class:`RouteError` once ``router.migration_limit`` is reached or no decode is
        left."""
        recovery = self.legs.recovery
        again = False
        if answered:
            again = await recovery.instance_answered_error(tried[-1], why, tl)
        else:
            recovery.instance_lost(tried[-1], why)
        self.ledger.release_kv(tl)
        return await self.legs.migrate(
            endpoint, sent or recovery.as_sent(body), tl, tried, why, again=again
        )

    @staticmethod
    def _named(leg: Lease, raw: bytes, note: str) -> bytes:
        """Decode's error answer with ``note`` added to its message (OpenAI's shape)."""
        e = passthrough("decode", leg.upstream.name, leg.status, raw)
        return error_body(leg.status, f"{e}; {note}", "upstream_error")

    async def _relay(self, leg: Lease, tl: Timeline) -> AsyncGenerator[bytes, None]:
        """Stream the decode answer through as it comes, counting its events (where they
        end, not what they say: :class:`~pdctl.sdk.sse.EventFramer`); settles the timeline. A
        decode failure mid-stream ends the stream with an OpenAI-style error event."""
        assert leg.response is not None
        events, first, framer = 0, True, EventFramer()
        try:
            async for chunk in leg.response.iter_chunks():
                if first:  # a stream's first token, not its response head
                    tl.decode_first_byte, first = tl.mark(), False
                events += framer.count(chunk)
                yield chunk
            tl.completion_tokens = events
            self.ledger.finish(tl, "ok", 200)
        except UpstreamError as e:
            for part in self.stream_failed(
                tl, f"decode {leg.upstream.name} failed mid-answer: {e}"
            ):
                yield part
        finally:
            self.closed(leg, tl, events)

    async def _relay_migrating(
        self,
        leg: Lease,
        tl: Timeline,
        endpoint: str,
        body: dict[str, Any],
        tried: tuple[Upstream, ...] = (),
    ) -> AsyncGenerator[bytes, None]:
        """:meth:`_relay`, one whole event at a time, knowing which tokens the client has:
        when decode fails mid-stream (the connection lost, a 5xx error event) the stream
        continues on another decode (:mod:`pdctl.sdk.router.migrate`), at most
        ``router.migration_limit`` times in all (``tried``: the decodes that failed the
        request before its stream started)."""
        tr = tracker_for(endpoint, body)
        first = True
        current: Lease | None = leg
        try:
            while current is not None:
                assert current.response is not None
                d = current.upstream
                try:
                    async for chunk in current.response.iter_chunks():
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
                    self.ledger.finish(tl, "ok", 200)
                    return
                except UpstreamError as e:
                    why = f"decode {d.name} failed mid-answer: {e}"
                    current.release()
                    current = None
                    tried += (d,)
                    again = False
                    if tr.failure is not None:  # it answered: its /health says the rest
                        again = await self.legs.recovery.instance_answered_error(d, why, tl)
                    else:
                        self.legs.recovery.instance_lost(d, why)
                    self.ledger.release_kv(tl)
                    nxt, tried = await self._next_decode(tr, tl, endpoint, body, why, tried, again)
                    if isinstance(nxt, str):
                        for part in self.stream_failed(tl, nxt):
                            yield part
                        return
                    current = nxt
        finally:
            if current is not None:
                self.closed(current, tl, tr.events)

    async def _next_decode(
        self,
        tr: StreamTracker,
        tl: Timeline,
        endpoint: str,
        body: dict[str, Any],
        why: str,
        tried: tuple[Upstream, ...],
        again: bool = False,
    ) -> tuple[Lease | str, tuple[Upstream, ...]]:
        """The decode a failed stream continues on (one answering 5xx is passed over, as
        failed), or why it cannot continue; and the decodes that failed it so far."""
        while True:
            cont = tr.continuation(body) if tr.can_continue() else None
            if cont is None:
                return why, tried
            cpath, cbody = cont
            try:
                n = len(tr.sent_ids)
                nxt = await self.legs.migrate(
                    cpath or endpoint, cbody, tl, tried, why, n, again=again
                )
                if nxt.status == 200:
                    return nxt, tried
                raw = await self.read(nxt)
            except RouteError as e:
                return f"{why}; {e}", tried
            text = raw[:300].decode(errors="replace")
            answer = f"decode {nxt.upstream.name} answered {nxt.status}: {text}"
            if not server_failed(nxt.status):
                return f"{why}; {answer}", tried
            why = answer
            tried += (nxt.upstream,)
            again = await self.legs.recovery.instance_answered_error(nxt.upstream, why, tl)
