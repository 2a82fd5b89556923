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
from pdctl.sdk.router import tracing
from pdctl.sdk.router.instances import Breaker, Upstream, choose
from pdctl.sdk.router.replies import (
    ROUTER_MODES,
    JSON_HEADERS,
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
    "ROUTER_MODES",
    "JSON_HEADERS",
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
        self.metrics = RouterMetrics(self.upstreams)
        self.tracer = tracing.Tracer(
            self.settings.otlp_traces_url, **{"pdctl.fleet": spec.fleet.name}
        )
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
        self.tracer.shutdown()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(u) for u in self.upstreams))
            await asyncio.sleep(self.health_interval_s)

    async def _check(self, u: Upstream) -> None:
        try:
            async with asyncio.timeout(2.0):
                r = await u.pool.request("GET", "/health")
                await r.read()
            u.healthy = r.status == 200
        except (UpstreamError, TimeoutError, OSError):
            u.healthy = False

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
            raise RouteError(502, f"prefill {tl.prefill} failed: {e}") from None
        tl.prefill_done = tl.mark()
        tracing.close_leg(tl, "prefill", used.name, r.status)
        self.metrics.prefill_leg.observe(tl.prefill_done - tl.prefill_sent, used.name)
        if r.status != 200:
            if r.status >= 500:
                used.breaker.failure()
            raise RouteError(
                502,
                f"prefill {used.name} answered {r.status}: {raw[:500].decode(errors='replace')}",
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
        self, d: Upstream, path: str, body: dict[str, Any], rid: str, tl: Timeline
    ) -> tuple[Upstream, Response]:
        """Send the decode leg; returns once its response head is in (still outstanding:
        the answer is relayed by :meth:`_finish_decode`)."""
        data = json.dumps(body).encode()
        tl.decode_sent = tl.mark()
        tracing.open_leg(tl, "decode", d.name)
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
            raise RouteError(502, f"decode {tl.decode} failed: {e}") from None
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
        """Both legs at once; re-send decode if prefill's identity turns out different."""
        assert p.identity is not None
        d_task = asyncio.create_task(
            self._decode(d, path, push_decode_body(body, p.identity, rid), rid, tl)
        )
        try:
            used_p, presp = await self._prefill(p, path, body, rid, tl, make_prefill)
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

    # ------------------------------------------------------------------ entry point

    def new_timeline(self, path: str, stream: bool, traceparent: str | None = None) -> Timeline:
        tl = Timeline(
            id=f"pdctl-{uuid.uuid4().hex}",
            mode=self.mode,
            path=path,
            stream=stream,
            received=time.time(),
            t0=time.perf_counter(),
        )
        tl.trace = self.tracer.begin(traceparent)
        return tl

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
        """The text path: the OpenAI body goes to the engines as it is."""
        d, r = await self.legs(path, body, tl, prefill_body)
        return await self.reply(d, r, tl, stream=bool(body.get("stream")))

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
        d = self.select(self.decodes)
        tl.decode = d.name
        if self.mode == "colocated" or decode_only:
            d, r = await self._decode(d, path, body, rid, tl)
        else:
            p = self.select(self.prefills)
            tl.prefill = p.name
            if self.mode == "push":
                d, r = await self._push(p, d, path, body, rid, tl, make_prefill)
            else:
                p, presp = await self._prefill(p, path, body, rid, tl, make_prefill)
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
        self, d: Upstream, r: Response, tl: Timeline, *, stream: bool
    ) -> Reply | StreamReply:
        """Relay decode's answer (streamed, or read whole) and settle the timeline."""
        ctype = (r.header(b"content-type") or b"application/json").decode()
        if stream and r.status == 200:
            return StreamReply(
                200, self._relay(d, r, tl), [("Content-Type", ctype), ("Cache-Control", "no-cache")]
            )
        raw = await self.read_decode(d, r)
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
        tracing.finished(tl)
        self.history.append(tl)

    def recent(
        self, limit: int = 100, match: Callable[[Timeline], bool] | None = None
    ) -> list[dict[str, Any]]:
        items = [t for t in reversed(self.history) if match is None or match(t)]
        return [t.as_dict() for t in items[:limit]]
