"""The dispatcher: where every request enters routing, and the one owner of how it is
routed — the strategy for the router's path (text or tokens), the leg sender, the relay,
and the :class:`Recovery` that makes every retry and migration decision.

Modes (the instance set's, switchable by an operator):

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
from typing import Any, Protocol

from pdctl.sdk.router import tracing
from pdctl.sdk.router.canary import Canary, canary_counters
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.ledger import Ledger
from pdctl.sdk.router.legs import LegSender
from pdctl.sdk.router.recovery import Recovery
from pdctl.sdk.router.relay import Relay
from pdctl.sdk.router.replies import Reply, RouteError, StreamReply, error_body
from pdctl.sdk.router.textpath import TextPath
from pdctl.sdk.router.timeline import RouterMetrics, Timeline
from pdctl.sdk.router.tokens import TokensPath


class Strategy(Protocol):
    """A router path: takes a validated request to its reply."""

    name: str

    async def route(
        self, endpoint: str, body: dict[str, Any], tl: Timeline
    ) -> Reply | StreamReply: ...


class Dispatcher:
    """Routes requests over the instance set; settles the ones that fail in the ledger."""

    def __init__(
        self,
        instances: InstanceSet,
        ledger: Ledger,
        metrics: RouterMetrics,
        tracer: tracing.Tracer,
    ) -> None:
        self.instances, self.ledger, self.tracer = instances, ledger, tracer
        self.recovery = Recovery(instances, metrics)
        self.legs = LegSender(instances, self.recovery, metrics)
        self.relay = Relay(instances, self.legs, ledger)
        self.text = TextPath(instances, self.legs, self.relay, self.recovery)
        self.tokens: Strategy | None = None
        if instances.settings.path == "tokens" and instances.renders:
            self.tokens = TokensPath(instances, self.legs, self.relay, ledger, metrics, self.text)
        canary = instances.settings.canary
        self.canary: Canary | None = None
        """The live output canary (router.canary.rate > 0, a disaggregated fleet)."""
        if canary.rate > 0 and instances.prefills:
            timeout = instances.settings.connect_timeout_s
            self.canary = Canary(
                canary,
                metrics.registry,
                instances.upstreams,
                connect_timeout_s=timeout,
                tp=instances.tp,
            )
        elif instances.prefills:  # off: its counters still read 0, for the panel and PA013
            canary_counters(metrics.registry, instances.upstreams)

    def strategy(self) -> Strategy:
        """The strategy for the router's path."""
        return self.tokens if self.tokens is not None else self.text

    async def dispatch(
        self,
        endpoint: str,
        body: dict[str, Any],
        traceparent: str | None = None,
        *,
        tl: Timeline | None = None,
    ) -> Reply | StreamReply:
        """Route one validated request: the entry every request passes (admitted by the
        app's guard before it). ``tl`` is the request's timeline when the caller opened it
        (:meth:`Timeline.begin`, to read its usage afterwards). A :class:`RouteError` becomes its
        OpenAI-style error reply; a request cancelled (its client gone) is settled as
        such."""
        if tl is None:
            stream = bool(body.get("stream"))
            tl = Timeline.begin(self.instances.mode, endpoint, stream, self.tracer, traceparent)
        sample = self.canary.draw(endpoint, body, tl) if self.canary is not None else None
        try:
            reply = await self.strategy().route(endpoint, body, tl)
            return reply if sample is None else sample.watch(reply)
        except RouteError as e:
            self.ledger.finish(tl, "error", e.status, str(e))
            return Reply(e.status, error_body(e.status, str(e), e.kind))
        except asyncio.CancelledError:
            self.ledger.finish(tl, "cancelled", 499, "client disconnected")
            raise
