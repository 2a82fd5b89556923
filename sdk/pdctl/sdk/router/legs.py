"""The router's legs: prefill and decode requests, both at once (push) or one after the
other, with retries on another instance when one fails."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body
from pdctl.sdk.router import tracing
from pdctl.sdk.router.base import RouterBase
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.replies import RouteError, error_body
from pdctl.sdk.router.timeline import Timeline
from pdctl.sdk.router.upstream import Response, UpstreamError

_PROMPT_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


class LegFailed(RouteError):
    """A leg's instance failed (connection lost, 5xx): worth another instance."""

    def __init__(self, status: int, message: str, upstream: Upstream) -> None:
        super().__init__(status, message)
        self.upstream = upstream


def passthrough(role: str, name: str, status: int, raw: bytes) -> RouteError:
    """A 4xx from vLLM keeps its status and message (OpenAI's error shape): the client
    sent something no instance will accept, and retrying it cannot help."""
    message, kind = raw[:500].decode(errors="replace"), "invalid_request_error"
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            kind = str(err.get("type") or kind)
        elif isinstance(err, str):
            message = err
    except (ValueError, AttributeError):
        pass
    return RouteError(status, f"{message} ({role} {name})", kind)


_USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


async def _cancel(task: asyncio.Task[tuple[Upstream, Response]]) -> None:
    """Cancel a decode leg; if it had already got its response, drop it (closing the
    connection, so the upstream aborts the request)."""
    task.cancel()
    (res,) = await asyncio.gather(task, return_exceptions=True)
    if isinstance(res, tuple):
        u, r = res
        u.outstanding -= 1
        r.release()


def _refused(d_task: asyncio.Task[tuple[Upstream, Response]]) -> bool:
    """Decode's leg is done and refused the request itself (4xx: bad input). A 5xx is
    not a refusal: decode may have been told a prefill that has since restarted, and the
    prefill's answer is what lets the router re-send decode with the right identity."""
    if not d_task.done() or d_task.cancelled():
        return False
    if d_task.exception() is not None:
        return False  # raised when awaited, after prefill settles
    return 400 <= d_task.result()[1].status < 500


async def _cancel_prefill(task: asyncio.Task[tuple[Upstream, dict[str, Any]]]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Legs(RouterBase):
    """Sends a request's legs."""

    # ------------------------------------------------------------------ legs

    async def send_leg(
        self,
        pool: list[Upstream],
        first: Upstream,
        path: str,
        body: bytes,
        rid: str,
        tl: Timeline,
        role: str,
    ) -> tuple[Upstream, Response]:
        """Send a leg and wait for its response head. The instance counts the leg as
        outstanding until the caller drops it. A connection failure (nothing sent) is
        retried on another instance of the same role, at most twice."""
        u = first
        tried: tuple[Upstream, ...] = ()
        headers = [("Content-Type", "application/json"), ("X-Request-Id", rid)]
        if tl.trace is not None:
            headers.append((tracing.TRACEPARENT, tl.trace.header(role)))
        while True:
            u.outstanding += 1
            try:
                r = await u.pool.request(
                    "POST",
                    path,
                    body,
                    headers,
                    connect_timeout_s=self.settings.connect_timeout_s,
                )
            except BaseException as e:
                u.outstanding -= 1
                if not isinstance(e, UpstreamError):
                    raise
                u.breaker.failure()
                tried += (u,)
                if not e.connect or len(tried) > 2:
                    raise
                try:
                    u = self.select(pool, exclude=tried)
                except RouteError:
                    raise e from None
                tl.retries += 1
                self.metrics.retries.inc(role)
                if role == "prefill":
                    tl.prefill = u.name
                else:
                    tl.decode = u.name
                continue
            u.breaker.success()
            return u, r

    async def _prefill(
        self,
        p: Upstream,
        path: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        make_body: Callable[[dict[str, Any]], dict[str, Any]] = prefill_body,
    ) -> tuple[Upstream, dict[str, Any]]:
        """Run the prefill leg to completion; returns the instance used and its JSON."""
        data = json.dumps(make_body(body)).encode()
        tl.prefill_sent = tl.mark()
        tracing.open_leg(tl, "prefill", p.name)
        push = self.mode != "pull"
        try:
            async with asyncio.timeout(self.settings.prefill_timeout_s):
                if push:  # cancelled before its answer, it may still have finished
                    tl.kv_on = (p, rid)
                used, r = await self.send_leg(self.prefills, p, path, data, rid, tl, "prefill")
                if push:
                    tl.kv_on = (used, rid)
                try:
                    raw = await r.read()
                finally:
                    used.outstanding -= 1
        except TimeoutError:
            raise RouteError(
                504,
                f"prefill {tl.prefill} did not answer within {self.settings.prefill_timeout_s:g} s",
                "timeout",
            ) from None
        except UpstreamError as e:
            raise self._leg_failed(self.prefills, tl.prefill, p, e) from None
        tl.prefill_done = tl.mark()
        tracing.close_leg(tl, "prefill", used.name, r.status)
        self.metrics.prefill_leg.observe(tl.prefill_done - tl.prefill_sent, used.name)
        if 400 <= r.status < 500:
            raise passthrough("prefill", used.name, r.status, raw)
        if r.status != 200:
            used.breaker.failure()
            raise LegFailed(
                502,
                f"prefill {used.name} answered {r.status}: {raw[:500].decode(errors='replace')}",
                used,
            )
        try:
            resp = json.loads(raw)
        except ValueError:
            raise RouteError(502, f"prefill {used.name} sent a non-JSON answer") from None
        m = _PROMPT_RE.search(raw)
        if m and tl.prompt_tokens is None:  # the tokens path already knows it
            tl.prompt_tokens = int(m.group(1))
        return used, resp if isinstance(resp, dict) else {}

    def _learn_identity(self, p: Upstream, resp: dict[str, Any]) -> bool:
        """Update p's identity from its response; True when it changed."""
        ktp = resp.get("kv_transfer_params")
        if not isinstance(ktp, dict) or p.identity is None:
            return False
        try:
            new = PrefillIdentity(
                engine_id=str(ktp.get("remote_engine_id") or p.identity.engine_id),
                host=str(ktp.get("remote_host") or p.identity.host),
                port=int(ktp.get("remote_port") or p.identity.port),
                tp_size=int(ktp.get("tp_size") or p.identity.tp_size),
                pp_size=int(ktp.get("pp_size") or p.identity.pp_size),
            )
        except (TypeError, ValueError):
            return False
        if new != p.identity:
            p.identity = new
            self.metrics.identity.inc(p.name)
            return True
        return False

    async def _decode(
        self,
        d: Upstream,
        path: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        *,
        first: bool = True,
    ) -> tuple[Upstream, Response]:
        """Send the decode leg; returns once its response head is in (still outstanding:
        the answer is relayed by :meth:`reply`). ``first`` False: a continuation (the
        request's own send and first-byte times stay)."""
        data = json.dumps(body).encode()
        if first:
            tl.decode_sent = tl.mark()
        tracing.open_leg(tl, "decode", d.name)
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                used, r = await self.send_leg(self.decodes, d, path, data, rid, tl, "decode")
        except TimeoutError:
            raise RouteError(
                504,
                f"decode {tl.decode} did not start answering within "
                f"{self.settings.request_timeout_s:g} s",
                "timeout",
            ) from None
        except UpstreamError as e:
            raise self._leg_failed(self.decodes, tl.decode, d, e) from None
        if first:
            tl.decode_first_byte = tl.mark()
        return used, r

    def _leg_failed(
        self, pool: list[Upstream], name: str | None, sent_to: Upstream, e: UpstreamError
    ) -> LegFailed:
        """A leg's connection failed after it was sent (``name``: the instance it ended
        on, after any connect retries): count the instance as down until it answers a
        health check again."""
        failed = next((u for u in pool if u.name == name), sent_to)
        self._set(failed, False)
        return LegFailed(502, f"{failed.role} {failed.name} failed: {e}", failed)

    async def _push(
        self,
        p: Upstream,
        d: Upstream,
        path: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        make_prefill: Callable[[dict[str, Any]], dict[str, Any]] = prefill_body,
    ) -> tuple[Upstream, Response]:
        """Both legs at once; re-send decode if prefill's identity turns out different.
        A decode that refuses the request (4xx) before prefill is done cancels prefill at
        once (so prefill never holds KV nobody will read); a prefill that fails before
        answering is retried on another prefill with a fresh decode registration."""
        assert p.identity is not None
        d_task = asyncio.create_task(
            self._decode(d, path, push_decode_body(body, p.identity, rid), rid, tl)
        )
        tried: tuple[Upstream, ...] = ()
        try:
            while True:
                p_task = asyncio.create_task(self._prefill(p, path, body, rid, tl, make_prefill))
                try:
                    await asyncio.wait({p_task, d_task}, return_when=asyncio.FIRST_COMPLETED)
                    if not p_task.done() and _refused(d_task):
                        await _cancel_prefill(p_task)
                        tl.note("decode refused the request; prefill cancelled")
                        return d_task.result()
                    used_p, presp = await p_task
                    break
                except LegFailed as e:
                    tried += (e.upstream,)
                    p = self._next_prefill(e, tried, tl)
                    await _cancel(d_task)
                    rid = f"{tl.id}-retry{len(tried)}"
                    assert p.identity is not None
                    d_task = asyncio.create_task(
                        self._decode(d, path, push_decode_body(body, p.identity, rid), rid, tl)
                    )
                finally:
                    if not p_task.done():
                        await _cancel_prefill(p_task)
            if self._learn_identity(used_p, presp) or used_p is not p:
                # decode was told the wrong prefill: cancel it and send it again
                await _cancel(d_task)
                tl.redispatched = True
                tracing.migrated(tl, "prefill identity changed")
                assert used_p.identity is not None
                d_task = asyncio.create_task(
                    self._decode(d, path, push_decode_body(body, used_p.identity, rid), rid, tl)
                )
            return await d_task
        except BaseException:
            await _cancel(d_task)
            raise

    async def _prefill_retrying(
        self,
        p: Upstream,
        path: str,
        body: dict[str, Any],
        tl: Timeline,
        make_prefill: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> tuple[Upstream, dict[str, Any]]:
        """Sequential modes: the prefill leg, retried on another prefill if it fails."""
        tried: tuple[Upstream, ...] = ()
        while True:
            rid = f"{tl.id}-retry{len(tried)}" if tried else tl.id
            try:
                return await self._prefill(p, path, body, rid, tl, make_prefill)
            except LegFailed as e:
                tried += (e.upstream,)
                p = self._next_prefill(e, tried, tl)

    def _next_prefill(self, e: LegFailed, tried: tuple[Upstream, ...], tl: Timeline) -> Upstream:
        """Another prefill for a request whose prefill failed (``tried``: those that
        failed it); re-raises ``e`` when retries are used up or none is left."""
        if len(tried) > self.settings.prefill_retries:
            raise e
        try:
            p = self.select(self.prefills, exclude=tried)
        except RouteError:
            raise e from None
        tl.retries += 1
        tl.prefill = p.name
        tl.note(f"{e}; retried on prefill {p.name}")
        self.metrics.retries.inc("prefill")
        return p

    async def legs(
        self,
        path: str,
        body: dict[str, Any],
        tl: Timeline,
        make_prefill: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        decode_only: bool = False,
        token_ids: list[int] | None = None,
        prompt_len: int | None = None,
    ) -> tuple[Upstream, Response]:
        """Run the mode's legs; returns decode's instance and response head (still
        outstanding). ``decode_only`` skips prefill (decode computes the prompt);
        ``token_ids`` (the prompt's, or its head's when ``prompt_len`` says it is longer)
        let the cache-aware policy choose by prefix."""
        rid = tl.id
        cache = self.cache if token_ids and self.cache_aware else None
        n = prompt_len or len(token_ids or ())
        keys = cache.keys(token_ids) if cache is not None and token_ids else []
        blocks = n // cache.block_size if cache is not None else 0
        d = await self.acquire(
            self.decodes, tl, scores=cache.scores(self.decodes, keys, blocks) if cache else None
        )
        tl.decode = d.name
        if cache is not None and token_ids and self.mode != "colocated" and not decode_only:
            limit = self.settings.disaggregate_min_uncached_tokens
            uncached = n - cache.overlap(d, keys) * cache.block_size
            if limit and uncached <= limit:
                decode_only = True
                tl.decision = "decode-only"
                tl.note(f"{uncached} uncached tokens on {d.name}: decode alone")
        if self.mode == "colocated":
            tl.decision = "colocated"
        elif decode_only:
            tl.decision = "decode-only"
        elif tl.decision is None:
            tl.decision = "disaggregated"
        self.metrics.decisions.inc(tl.decision, tl.route_path)
        if self.mode == "colocated" or decode_only:
            if cache is not None:
                cache.routed(d, keys, tl)
            d, r = await self._decode(d, path, body, rid, tl)
        else:
            scores = cache.scores(self.prefills, keys, blocks) if cache else None
            p = await self.acquire(self.prefills, tl, scores=scores)
            tl.prefill = p.name
            if cache is not None:
                cache.routed(p, keys, tl)
            if self.mode == "push":
                d, r = await self._push(p, d, path, body, rid, tl, make_prefill)
            else:
                p, presp = await self._prefill_retrying(p, path, body, tl, make_prefill)
                if self.mode == "pull":
                    d_body = dict(body)
                    d_body["kv_transfer_params"] = presp.get("kv_transfer_params")
                else:
                    self._learn_identity(p, presp)
                    assert p.identity is not None
                    ktp = presp.get("kv_transfer_params") or {}
                    d_body = push_decode_body(
                        body, p.identity, str(ktp.get("remote_request_id") or rid)
                    )
                d, r = await self._decode(d, path, d_body, rid, tl)
        tl.decode = d.name
        return d, r

    async def read_decode(self, d: Upstream, r: Response) -> bytes:
        """Decode's whole answer; the leg stops being outstanding."""
        try:
            return await r.read()
        except UpstreamError as e:
            raise RouteError(502, f"decode {d.name} failed mid-answer: {e}") from None
        finally:
            d.outstanding -= 1
            r.release()

    def stream_failed(self, tl: Timeline, msg: str) -> tuple[bytes, bytes]:
        """Settle a stream that broke mid-answer; the two SSE events that end it cleanly
        for the client (an OpenAI-style error, then ``[DONE]``)."""
        self.finish(tl, "error", 502, msg)
        return b"data: " + error_body(502, msg, "upstream_error") + b"\n\n", b"data: [DONE]\n\n"

    def stream_closed(self, d: Upstream, r: Response, tl: Timeline, events: int) -> None:
        """A relayed stream ended (or its client went away): release decode's leg."""
        d.outstanding -= 1
        r.release()
        if tl.done is None:  # the client went away
            tl.completion_tokens = events
            self.finish(tl, "cancelled", 499, "client disconnected")
