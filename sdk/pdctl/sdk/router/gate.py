"""The overload gate around one request: its place in the fleet (:mod:`.admission`),
its first-byte deadline (:mod:`.deadline`), the routing and the answer, and what happens
when the client leaves first."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from pdctl.sdk.router.admission import Admission, Shed, Ticket
from pdctl.sdk.router.asgi import (
    Flag,
    Receive,
    Scope,
    Send,
    cancel_on_disconnect,
    hdrs,
    header,
    send_body,
    send_error,
    stream_reply,
)
from pdctl.sdk.router.core import Reply, Router, StreamReply
from pdctl.sdk.router.deadline import Deadline, first_chunk
from pdctl.sdk.router.hardening import GONE, WHOLE, WholeAnswer
from pdctl.sdk.router.limits import drop_headers
from pdctl.sdk.router.predictor import Size, size_of
from pdctl.sdk.router.running import current_task
from pdctl.sdk.router.terms import Terms
from pdctl.sdk.router.timeline import Timeline


class Gate:
    """Admits, routes and answers validated requests over ``router``."""

    def __init__(self, router: Router, admission: Admission | None) -> None:
        self.router, self.admission = router, admission

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        endpoint: str,
        body: dict[str, Any],
        terms: Terms,
        t0: float,
    ) -> Timeline | None:
        """Admit, route and answer one validated request read at ``t0``; its timeline
        (None: it never reached the fleet)."""
        handler = current_task()
        assert handler is not None
        answered, gone = Flag(), Flag()
        ext = scope.get("extensions") or {}
        told, whole = ext.get(GONE), ext.get(WHOLE)
        watcher: asyncio.Task[None] | None = None
        if told is not None:  # the router's own server says when the client goes away

            def client_gone() -> None:
                if not answered.is_set:
                    gone.set()
                    handler.cancel()

            told.callback = client_gone
        else:  # any other ASGI server: wait for its http.disconnect
            watcher = asyncio.create_task(cancel_on_disconnect(receive, handler, answered, gone))
        ticket: Ticket | None = None
        deadline: Deadline | None = None
        tl: Timeline | None = None
        size = size_of(body)
        try:
            if self.admission is not None:
                entered = await self.admit(terms, t0, size)
                if isinstance(entered, Shed):
                    answered.set()
                    kind = "overloaded_error" if entered.status != 504 else "timeout_error"
                    await send_error(send, entered.status, entered.message, kind, entered.headers())
                    self.admission.answered(entered, time.perf_counter() - t0)
                    return None
                ticket = entered
            tl = Timeline.begin(
                self.router.instances.mode,
                endpoint,
                bool(body.get("stream")),
                self.router.tracer,
                header(scope, b"traceparent"),
            )
            if ticket is not None:
                ticket.tl = tl
            _predictable(tl, size, terms, t0)
            if terms.deadline_s is not None:
                left = terms.deadline_s - (time.perf_counter() - t0)
                deadline = Deadline(left, handler, _expire(self.router, tl, terms))
            await self.answer(send, endpoint, body, tl, deadline, answered, whole)
        except asyncio.CancelledError:
            if deadline is not None and deadline.passed and not (gone.is_set or answered.is_set):
                # the first-byte deadline passed: the legs are cancelled, the request
                # settled as a 504 (:func:`_expire`); answer it now
                handler.uncancel()
                answered.set()
                msg = f"no first byte within the request's deadline of {terms.deadline_s:g} s"
                hs = drop_headers(1.0, "deadline_exceeded")
                await send_error(send, 504, msg, "timeout_error", hs)
                return tl
            if not gone.is_set:
                raise  # not the client's doing (the server is stopping)
            # the client went away: the legs are cancelled and the request settled; there
            # is no one to answer, and nothing went wrong (uvicorn would log a traceback)
            handler.uncancel()
        finally:
            if deadline is not None:
                deadline.disarm()
            if watcher is not None:
                watcher.cancel()
            elif told is not None:
                told.callback = None
            if ticket is not None:
                ticket.release()
        return tl

    async def answer(
        self,
        send: Send,
        endpoint: str,
        body: dict[str, Any],
        tl: Timeline,
        deadline: Deadline | None,
        answered: Flag,
        whole: WholeAnswer | None = None,
    ) -> None:
        """Route the request and send its answer (a stream's first chunk read under the
        deadline, when there is one; a whole one through ``whole`` where the server
        offers it)."""
        reply = await self.router.dispatcher.dispatch(endpoint, body, tl=tl)
        if deadline is not None:
            if isinstance(reply, StreamReply):
                reply = await _first_chunk(reply)
            deadline.disarm()
        if isinstance(reply, Reply):
            answered.set()
            await send_body(send, reply.status, reply.body, hdrs(reply.headers), whole)
            return
        await stream_reply(send, reply, answered)

    async def admit(self, terms: Terms, t0: float, size: Size | None = None) -> Ticket | Shed:
        """A place in the fleet for a request read at ``t0`` (perf_counter), or its shed
        answer, decided at arrival where it can be: a request with an SLO or deadline
        that no P->D pair is predicted to answer within it is shed at once, and one that
        would queue is queued only when its predicted queue wait plus its pair's
        predicted TTFT meets it (SLO routing, :mod:`.predictor`, :mod:`.admission`)."""
        assert self.admission is not None
        limit = terms.queue_limit_s
        at, service = None, 0.0
        if limit is not None:
            left = limit - (time.perf_counter() - t0)
            instances = self.router.instances
            predictor = instances.predictor
            if predictor.routing and size is not None:
                best = predictor.fastest(size, instances.pairs())
                if best is not None and not predictor.reachable(best, left):
                    return self.admission.unreachable(
                        terms.klass,
                        f"no P->D pair is predicted to answer within {left * 1000:.0f} ms "
                        f"(the fastest: {best * 1000:.0f} ms)",
                    )
                service = best or 0.0
            at = self.admission.clock() + left
        return await self.admission.enter(terms.klass, at, service)


def _predictable(tl: Timeline, size: Size, terms: Terms, t0: float) -> None:
    """What SLO routing reads on the timeline: the request's size, and when its first
    byte is wanted (``t0``: when it was read)."""
    tl.size = size
    if terms.queue_limit_s is not None:
        tl.ttft_due = t0 + terms.queue_limit_s


def _expire(router: Router, tl: Timeline, terms: Terms) -> Callable[[], None]:
    """What a passed first-byte deadline does before cancelling the handler: settle the
    request as a 504 (the ledger then asks the prefill to free KV it may hold)."""

    def expire() -> None:
        tl.note(f"no first byte within its deadline of {terms.deadline_s:g} s: cancelled")
        router.ledger.finish(tl, "error", 504, "first-byte deadline passed")

    return expire


async def _first_chunk(reply: StreamReply) -> StreamReply:
    """:func:`first_chunk`, the stream given back whatever happens meanwhile."""
    try:
        return await first_chunk(reply)
    except BaseException:
        with contextlib.suppress(Exception):
            await reply.aclose()
        raise
