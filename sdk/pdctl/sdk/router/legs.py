"""The leg sender: a request's prefill and decode legs, both at once (push) or one after
the other (push-sequential, pull), or decode alone; each leg holds a :class:`Lease` on
its instance. Where a failed leg goes next is :class:`Recovery`'s call."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

from pdctl.sdk.pd import PrefillIdentity, push_decode_body
from pdctl.sdk.router import tracing
from pdctl.sdk.router.deadline import Within
from pdctl.sdk.router.httpclient import UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.lease import Lease
from pdctl.sdk.router.recovery import LegFailed, Recovery, passthrough
from pdctl.sdk.router.replies import RouteError
from pdctl.sdk.router.running import current_task
from pdctl.sdk.router.timeline import RouterMetrics, Timeline

PROMPT_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
"""A response's prompt length (its usage block), without parsing the whole answer."""

MakeBody = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns the request's body into the prefill leg's."""


async def _cancel(task: asyncio.Task[Lease]) -> None:
    """Cancel a decode leg; if it had already got its response, drop it (closing the
    connection, so the upstream aborts the request)."""
    task.cancel()
    (res,) = await asyncio.gather(task, return_exceptions=True)
    if isinstance(res, Lease):
        res.release()


def _refused(d_task: asyncio.Task[Lease]) -> bool:
    """Decode's leg is done and refused the request itself (4xx: bad input). A 5xx is
    not a refusal: decode may have been told a prefill that has since restarted, and the
    prefill's answer is what lets the router re-send decode with the right identity."""
    if not d_task.done() or d_task.cancelled():
        return False
    if d_task.exception() is not None:
        return False  # raised when awaited, after prefill settles
    return 400 <= d_task.result().status < 500


class _RefusalWatch:
    """While armed, cancels ``task`` (the one running the prefill leg) the moment decode's
    leg ``d_task`` refuses the request (:func:`_refused`), and says so in :attr:`fired`:
    prefill runs in the request's own task, not one of its own awaited beside decode's."""

    __slots__ = ("armed", "cancelling", "d_task", "fired", "task")

    def __init__(self, task: asyncio.Task[Any], d_task: asyncio.Task[Lease]) -> None:
        self.task, self.d_task = task, d_task
        self.armed, self.fired = True, False
        self.cancelling = task.cancelling()
        """The task's cancellation requests before (none of them this watch's)."""
        d_task.add_done_callback(self._done)

    def _done(self, d_task: asyncio.Task[Lease]) -> None:
        if self.armed and _refused(d_task):
            self.fired = True
            self.task.cancel()

    def disarm(self) -> None:
        self.armed = False
        self.d_task.remove_done_callback(self._done)


class LegSender:
    """Sends a request's legs over the instance set."""

    def __init__(self, instances: InstanceSet, recovery: Recovery, metrics: RouterMetrics) -> None:
        self.instances, self.recovery, self.metrics = instances, recovery, metrics
        self.settings = instances.settings

    async def send(
        self,
        pool: list[Upstream],
        first: Upstream,
        endpoint: str,
        body: bytes,
        rid: str,
        tl: Timeline,
        role: str,
    ) -> Lease:
        """Send a leg and wait for its response head; the returned lease holds the slot
        until the caller releases it. A connection failure (nothing sent) is retried on
        another instance of the same role (see :class:`Recovery`)."""
        u = first
        tried: tuple[Upstream, ...] = ()
        headers = [("Content-Type", "application/json"), ("X-Request-Id", rid)]
        if tl.trace is not None:
            headers.append((tracing.TRACEPARENT, tl.trace.header(role)))
        timeout = self.settings.connect_timeout_s
        while True:
            async with Lease(u) as sending:
                try:
                    r = await u.pool.request(
                        "POST", endpoint, body, headers, connect_timeout_s=timeout
                    )
                except UpstreamError as e:
                    tried += (u,)
                    failed = e
                else:
                    u.breaker.success()
                    return sending.hand_over(r)
            u = self.recovery.after_connect_failure(pool, tried, failed, role, tl)

    async def prefill(
        self,
        p: Upstream,
        endpoint: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        make: MakeBody,
    ) -> tuple[Upstream, dict[str, Any]]:
        """Run the prefill leg to completion; returns the instance used and its JSON."""
        data = json.dumps(make(body)).encode()
        tl.prefill_sent = tl.mark()
        tracing.open_leg(tl, "prefill", p.name)
        push = self.instances.mode != "pull"
        try:
            async with Within(self.settings.prefill_timeout_s):
                if push:  # cancelled before its answer, it may still have finished
                    tl.kv_on = (p, rid)
                leg = await self.send(
                    self.instances.prefills, p, endpoint, data, rid, tl, "prefill"
                )
                used = leg.upstream
                if push:
                    tl.kv_on = (used, rid)
                raw = await leg.read()
        except TimeoutError:
            raise RouteError(
                504,
                f"prefill {tl.prefill} did not answer within {self.settings.prefill_timeout_s:g} s",
                "timeout",
            ) from None
        except UpstreamError as e:
            raise self.recovery.leg_failed(self.instances.prefills, tl.prefill, p, e) from None
        tl.prefill_done = tl.mark()
        tracing.close_leg(tl, "prefill", used.name, leg.status)
        self.metrics.prefill_leg.observe(tl.prefill_done - tl.prefill_sent, used.name)
        if 400 <= leg.status < 500:
            raise passthrough("prefill", used.name, leg.status, raw)
        if leg.status != 200:
            used.breaker.failure()
            raise LegFailed(
                502,
                f"prefill {used.name} answered {leg.status}: {raw[:500].decode(errors='replace')}",
                used,
            )
        try:
            resp = json.loads(raw)
        except ValueError:
            raise RouteError(502, f"prefill {used.name} sent a non-JSON answer") from None
        m = PROMPT_RE.search(raw)
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

    async def decode(
        self,
        d: Upstream,
        endpoint: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        *,
        first: bool = True,
    ) -> Lease:
        """Send the decode leg; returns once its response head is in (the lease still
        held: the answer is relayed). ``first`` False: a continuation (the request's own
        send and first-byte times stay)."""
        data = json.dumps(body).encode()
        if first:
            tl.decode_sent = tl.mark()
        tracing.open_leg(tl, "decode", d.name)
        try:
            async with Within(self.settings.request_timeout_s):
                leg = await self.send(self.instances.decodes, d, endpoint, data, rid, tl, "decode")
        except TimeoutError:
            raise RouteError(
                504,
                f"decode {tl.decode} did not start answering within "
                f"{self.settings.request_timeout_s:g} s",
                "timeout",
            ) from None
        except UpstreamError as e:
            raise self.recovery.leg_failed(self.instances.decodes, tl.decode, d, e) from None
        if first:
            tl.decode_first_byte = tl.mark()
        return leg

    async def migrate(
        self,
        endpoint: str,
        body: dict[str, Any],
        tl: Timeline,
        exclude: tuple[Upstream, ...],
        why: str,
        sent_tokens: int = 0,
        *,
        again: bool = False,
    ) -> Lease:
        """Continue (or restart) a request on another decode, decode-only (``again``: on
        ``exclude[-1]`` if no other: :meth:`Recovery.migration_target`). ``again`` means
        its prefill died (the KV never came): where another prefill is in service the
        request is disaggregated again through that one instead of decode-only."""
        d = await self.recovery.migration_target(tl, exclude, why, sent_tokens, again=again)
        p = self.recovery.another_prefill(tl) if again and self.instances.mode == "push" else None
        if p is None or tl.prefill_leg is None:
            return await self.decode(d, endpoint, body, tl.id, tl, first=False)
        tl.migrations[-1]["through_prefill"] = p.name
        rid = f"{tl.id}-kv{len(tl.migrations)}"
        return await self.push(p, d, endpoint, body, rid, tl, tl.prefill_leg, first=False)

    def _decode_task(
        self,
        d: Upstream,
        p: Upstream,
        endpoint: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        first: bool = True,
    ) -> asyncio.Task[Lease]:
        assert p.identity is not None
        decode_body = push_decode_body(body, p.identity, rid)
        task = current_task()  # the loop it runs on, without asking for it again
        assert task is not None
        return task.get_loop().create_task(
            self.decode(d, endpoint, decode_body, rid, tl, first=first)
        )

    async def push(
        self,
        p: Upstream,
        d: Upstream,
        endpoint: str,
        body: dict[str, Any],
        rid: str,
        tl: Timeline,
        make: MakeBody,
        *,
        first: bool = True,
    ) -> Lease:
        """Both legs at once; re-send decode if prefill's identity turns out different.
        A decode that refuses the request (4xx) before prefill is done cancels prefill at
        once (so prefill never holds KV nobody will read); a prefill that fails before
        answering is retried on another prefill with a fresh decode registration.
        ``first`` False: a retry (the request's own send and first-byte times stay)."""
        tl.prefill_leg = make
        task = current_task()
        assert task is not None
        d_task = self._decode_task(d, p, endpoint, body, rid, tl, first)
        tried: tuple[Upstream, ...] = ()
        try:
            while True:
                watch = _RefusalWatch(task, d_task)
                try:
                    # decode's leg goes out first (its task's first step sends it), as
                    # when both legs had tasks: decode knows the request before its KV
                    await asyncio.sleep(0)
                    used_p, presp = await self.prefill(p, endpoint, body, rid, tl, make)
                    break
                except asyncio.CancelledError:
                    # decode refused it: prefill is cancelled, not the request (unless
                    # someone else cancelled the request meanwhile too)
                    if not watch.fired or task.uncancel() > watch.cancelling:
                        raise
                    tl.note("decode refused the request; prefill cancelled")
                    return d_task.result()
                except LegFailed as e:
                    watch.disarm()
                    tried += (e.upstream,)
                    p = self.recovery.next_prefill(e, tried, tl)
                    await _cancel(d_task)
                    rid = f"{tl.id}-retry{len(tried)}"
                    d_task = self._decode_task(d, p, endpoint, body, rid, tl, first)
                finally:
                    watch.disarm()
            if self._learn_identity(used_p, presp) or used_p is not p:
                # decode was told the wrong prefill: cancel it and send it again
                await _cancel(d_task)
                tl.redispatched = True
                tracing.migrated(tl, "prefill identity changed")
                d_task = self._decode_task(d, used_p, endpoint, body, rid, tl, first)
            return await d_task
        except BaseException:
            await _cancel(d_task)
            raise

    async def _sequential(
        self,
        p: Upstream,
        d: Upstream,
        endpoint: str,
        body: dict[str, Any],
        tl: Timeline,
        make: MakeBody,
    ) -> Lease:
        """Sequential modes: the prefill leg (retried on another prefill if it fails),
        then decode with what prefill answered."""
        tried: tuple[Upstream, ...] = ()
        while True:
            rid = f"{tl.id}-retry{len(tried)}" if tried else tl.id
            try:
                p, presp = await self.prefill(p, endpoint, body, rid, tl, make)
                break
            except LegFailed as e:
                tried += (e.upstream,)
                p = self.recovery.next_prefill(e, tried, tl)
        if self.instances.mode == "pull":
            d_body = dict(body)
            d_body["kv_transfer_params"] = presp.get("kv_transfer_params")
        else:
            self._learn_identity(p, presp)
            assert p.identity is not None
            ktp = presp.get("kv_transfer_params") or {}
            d_body = push_decode_body(body, p.identity, str(ktp.get("remote_request_id") or rid))
        return await self.decode(d, endpoint, d_body, tl.id, tl)

    async def run(
        self,
        endpoint: str,
        body: dict[str, Any],
        tl: Timeline,
        make_prefill: MakeBody,
        *,
        decode_only: bool = False,
        token_ids: list[int] | None = None,
        prompt_len: int | None = None,
    ) -> Lease:
        """Choose the instances and run the mode's legs; returns decode's lease (its
        response head in). ``decode_only`` skips prefill (decode computes the prompt);
        ``token_ids`` (the prompt's, or its head's when ``prompt_len`` says it is longer)
        let the cache-aware policy choose by prefix."""
        inst = self.instances
        mode = inst.mode
        cache = inst.cache_aware if token_ids else None
        keys = cache.keys(token_ids) if cache is not None and token_ids else None
        d, p = await inst.place(tl, keys, prompt_len or len(token_ids or ()), decode_only)
        if p is None:
            leg = await self.decode(d, endpoint, body, tl.id, tl)
        elif mode == "push":
            leg = await self.push(p, d, endpoint, body, tl.id, tl, make_prefill)
        else:
            leg = await self._sequential(p, d, endpoint, body, tl, make_prefill)
        tl.decode = leg.upstream.name
        return leg
