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

import asyncio
import contextlib
import itertools
import json
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body
from pdctl.sdk.render import FleetPlan, InstancePlan
from pdctl.sdk.router.instances import Breaker, Upstream, choose
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
from pdctl.sdk.router.timeline import RouterMetrics, Timeline
from pdctl.sdk.router.upstream import Pools, Response, UpstreamError
from pdctl.sdk.spec import FleetSpec, RouterSpec

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
    """Decode's leg is done and answered with an error status (or failed)."""
    if not d_task.done() or d_task.cancelled():
        return False
    if d_task.exception() is not None:
        return False  # raised when awaited, after prefill settles
    return d_task.result()[1].status != 200


async def _cancel_prefill(task: asyncio.Task[tuple[Upstream, dict[str, Any]]]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------- the router


class Router:
    """Routes OpenAI-style requests over a fleet plan. Single event loop; no locks."""

    def __init__(
        self,
        spec: FleetSpec,
        plan: FleetPlan,
        *,
        mode: RouterMode | None = None,
        history: int = 1000,
        health_interval_s: float = 2.0,
    ) -> None:
        self.spec = spec
        self.settings: RouterSpec = spec.router or RouterSpec()
        self.mode: RouterMode = mode or mode_of(spec)
        self.served_name = spec.model.effective_served_name
        self.pools = Pools()
        self.health_interval_s = health_interval_s
        self.upstreams: list[Upstream] = []
        for inst in plan.instances:
            self.upstreams.append(self._upstream(inst))
        self.prefills = [u for u in self.upstreams if u.role == "prefill"]
        self.decodes = [u for u in self.upstreams if u.role == "decode"]
        self.renders = [u for u in self.upstreams if u.role == "render"]
        if self.mode == "colocated":
            self.prefills = []
            self.decodes = [u for u in self.upstreams if u.role != "render"]
        elif not self.prefills or not self.decodes:
            raise ValueError(f"{self.mode} mode needs at least one prefill and one decode")
        self._rr = itertools.count()
        self.history: deque[Timeline] = deque(maxlen=history)
        self._health_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        """Set (and replaced) whenever an instance's health changes."""
        self._checking: dict[str, asyncio.Task[None]] = {}
        self.metrics = RouterMetrics(self.upstreams)
        self.registry = self.metrics.registry

    def _upstream(self, inst: InstancePlan) -> Upstream:
        ident = PrefillIdentity.from_plan(inst) if inst.role == "prefill" else None
        return Upstream(inst.name, inst.role, inst.url, self.pools.get(inst.url), ident)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            self._health_task = None
        self.pools.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(u) for u in self.upstreams))
            await asyncio.sleep(self.health_interval_s)

    async def _check(self, u: Upstream) -> None:
        try:
            async with asyncio.timeout(2.0):
                r = await u.pool.request("GET", "/health")
                await r.read()
            healthy = r.status == 200
        except (UpstreamError, TimeoutError, OSError):
            healthy = False
        self._set(u, healthy)

    async def _recheck(self, u: Upstream) -> None:
        try:
            await self._check(u)
        finally:
            self._checking.pop(u.name, None)

    def _set(self, u: Upstream, healthy: bool) -> None:
        if u.healthy != healthy:
            u.healthy = healthy
            self._changed.set()
            self._changed = asyncio.Event()

    def health(self) -> tuple[bool, str]:
        roles = [("decode", self.decodes)] + ([("prefill", self.prefills)] if self.prefills else [])
        if self.settings.path == "tokens" and self.settings.render_fallback == "error":
            roles.append(("render", self.renders))
        for role, ups in roles:
            if not any(u.eligible() for u in ups):
                return False, f"no healthy {role} instance"
        return True, "ok"

    # ------------------------------------------------------------------ selection

    def select(self, pool: list[Upstream], exclude: tuple[Upstream, ...] = ()) -> Upstream:
        return choose(pool, self.settings.policy, self._rr, exclude)

    async def acquire(
        self, pool: list[Upstream], tl: Timeline, exclude: tuple[Upstream, ...] = ()
    ) -> Upstream:
        """:meth:`select`, but when no instance of the role is available, hold the
        request up to ``router.unavailable_wait_s`` for one to come back (re-checking the
        role's unhealthy instances meanwhile) before answering 503."""
        try:
            return self.select(pool, exclude)
        except RouteError as e:
            wait = self.settings.unavailable_wait_s
            if e.status != 503 or wait <= 0 or all(u.drained for u in pool if u not in exclude):
                raise
            first = e
        t = time.perf_counter()
        deadline = t + wait
        while (left := deadline - time.perf_counter()) > 0:
            changed = self._changed
            for u in pool:
                if not u.healthy and u not in exclude and u.name not in self._checking:
                    self._checking[u.name] = asyncio.create_task(self._recheck(u))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.5)):
                    await changed.wait()
            with contextlib.suppress(RouteError):
                u = self.select(pool, exclude)
                tl.note(f"waited {time.perf_counter() - t:.2f} s for a healthy {u.role}")
                return u
        tl.note(f"no healthy instance within router.unavailable_wait_s = {wait:g} s")
        raise RouteError(
            503, f"{first} (waited {wait:g} s: router.unavailable_wait_s)", "service_unavailable"
        )

    # ------------------------------------------------------------------ legs

    async def _send(
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
        try:
            async with asyncio.timeout(self.settings.prefill_timeout_s):
                used, r = await self._send(self.prefills, p, path, data, rid, tl, "prefill")
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
            failed = next((u for u in self.prefills if u.name == tl.prefill), p)
            self._set(failed, False)
            raise LegFailed(502, f"prefill {tl.prefill} failed: {e}", failed) from None
        tl.prefill_done = tl.mark()
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
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                used, r = await self._send(self.decodes, d, path, data, rid, tl, "decode")
        except TimeoutError:
            raise RouteError(
                504,
                f"decode {tl.decode} did not start answering within "
                f"{self.settings.request_timeout_s:g} s",
                "timeout",
            ) from None
        except UpstreamError as e:
            failed = next((u for u in self.decodes if u.name == tl.decode), d)
            self._set(failed, False)
            raise LegFailed(502, f"decode {tl.decode} failed: {e}", failed) from None
        if first:
            tl.decode_first_byte = tl.mark()
        return used, r

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
        attempt = 0
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
                    if attempt >= self.settings.prefill_retries:
                        raise
                    try:
                        p = self.select(self.prefills, exclude=(e.upstream,))
                    except RouteError:
                        raise e from None
                    attempt += 1
                    await _cancel(d_task)
                    rid = f"{tl.id}-retry{attempt}"
                    tl.retries += 1
                    tl.prefill = p.name
                    tl.note(f"{e}; retried on prefill {p.name} as {rid}")
                    self.metrics.retries.inc("prefill")
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
        attempt = 0
        while True:
            rid = tl.id if not attempt else f"{tl.id}-retry{attempt}"
            try:
                return await self._prefill(p, path, body, rid, tl, make_prefill)
            except LegFailed as e:
                if attempt >= self.settings.prefill_retries:
                    raise
                try:
                    p = self.select(self.prefills, exclude=(e.upstream,))
                except RouteError:
                    raise e from None
                attempt += 1
                tl.retries += 1
                tl.prefill = p.name
                tl.note(f"{e}; retried on prefill {p.name}")
                self.metrics.retries.inc("prefill")

    # ------------------------------------------------------------------ entry point

    def new_timeline(self, path: str, stream: bool) -> Timeline:
        return Timeline(
            id=f"pdctl-{uuid.uuid4().hex}",
            mode=self.mode,
            path=path,
            stream=stream,
            received=time.time(),
            t0=time.perf_counter(),
        )

    async def route(self, path: str, body: dict[str, Any], tl: Timeline) -> Reply | StreamReply:
        """Dispatch one request. Raises :class:`RouteError` for OpenAI-style errors (the
        caller records it with :meth:`finish`)."""
        if self.settings.path == "tokens" and self.renders:
            from pdctl.sdk.router.tokens import route_tokens  # imports this module

            return await route_tokens(self, path, body, tl)
        return await self.route_text(path, body, tl)

    async def route_text(
        self, path: str, body: dict[str, Any], tl: Timeline
    ) -> Reply | StreamReply:
        """The text path: the OpenAI body goes to the engines as it is. A streamed
        answer asks decode for its token ids so that it can be migrated."""
        stream = bool(body.get("stream"))
        sent = with_token_ids(body) if stream and self._migrates(body) else body
        try:
            d, r = await self.legs(path, sent, tl, prefill_body)
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
        tl.decode = d.name
        return await self._decode(d, path, body, tl.id, tl, first=False)

    async def legs(
        self,
        path: str,
        body: dict[str, Any],
        tl: Timeline,
        make_prefill: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        decode_only: bool = False,
    ) -> tuple[Upstream, Response]:
        """Run the mode's legs; returns decode's instance and response head (still
        outstanding). ``decode_only`` skips prefill (decode computes the prompt)."""
        rid = tl.id
        d = await self.acquire(self.decodes, tl)
        tl.decode = d.name
        if self.mode == "colocated" or decode_only:
            d, r = await self._decode(d, path, body, rid, tl)
        else:
            p = await self.acquire(self.prefills, tl)
            tl.prefill = p.name
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

    async def read_decode(self, d: Upstream, r: Response) -> bytes:
        """Decode's whole answer; the leg stops being outstanding."""
        try:
            return await r.read()
        except UpstreamError as e:
            raise RouteError(502, f"decode {d.name} failed mid-answer: {e}") from None
        finally:
            d.outstanding -= 1
            r.release()

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

    # ------------------------------------------------------------------ operator control

    def modes(self) -> tuple[RouterMode, ...]:
        """The modes this fleet's engines support: a push fleet can be dispatched
        concurrently or sequentially (the A/B); pull and colocated fleets have one."""
        if self.spec.fleet.mode == "push":
            return ("push", "push-sequential")
        return (self.mode,)

    def set_mode(self, mode: str) -> RouterMode:
        for m in self.modes():
            if m == mode:
                self.mode = m
                return m
        raise ValueError(
            f"mode {mode!r} is not available for this {self.spec.fleet.mode} fleet "
            f"(choose one of: {', '.join(self.modes())})"
        )

    def set_drained(self, name: str, drained: bool) -> Upstream:
        for u in self.upstreams:
            if u.name == name:
                u.drained = drained
                return u
        raise KeyError(name)

    def set_health(self, name: str, healthy: bool) -> Upstream:
        """The supervisor says an instance is up (restarted and ready) or down (stopped,
        failed, restarting): take it at its word now instead of at the next health check.
        An instance said to be up also gets a fresh circuit breaker."""
        for u in self.upstreams:
            if u.name == name:
                u.healthy = healthy
                if healthy:
                    u.breaker = Breaker()
                return u
        raise KeyError(name)

    def control_state(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "modes": list(self.modes()),
            "instances": [
                {
                    "name": u.name,
                    "role": u.role,
                    "url": u.url,
                    "healthy": u.healthy,
                    "drained": u.drained,
                    "in_flight": u.outstanding,
                    "breaker": u.breaker.state,
                }
                for u in self.upstreams
            ],
        }

    # ------------------------------------------------------------------ bookkeeping

    def finish(self, tl: Timeline, outcome: str, status: int, error: str | None = None) -> None:
        if tl.done is not None:
            return
        tl.done = tl.mark()
        tl.outcome = outcome
        tl.status = status
        if error:
            tl.error = error
        self.metrics.finished(tl, self.mode, outcome)
        self.history.append(tl)

    def recent(
        self, limit: int = 100, match: Callable[[Timeline], bool] | None = None
    ) -> list[dict[str, Any]]:
        items = [t for t in reversed(self.history) if match is None or match(t)]
        return [t.as_dict() for t in items[:limit]]
