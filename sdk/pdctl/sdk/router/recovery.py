"""Recovery: every retry and migration decision the router makes, in one place.

* A leg that could not connect (nothing sent) is re-sent on another instance of its role,
  at most twice.
* A prefill that fails is retried on another prefill, at most ``router.prefill_retries``
  times (the leg sender re-registers decode with it).
* A decode that fails before or while answering a migratable request continues on another
  decode, at most ``router.migration_limit`` times (:mod:`pdctl.sdk.router.migrate`).
* An instance whose leg failed after it was sent counts as down until a health check says
  otherwise.
* Engine death is recognised however it shows: the connection lost
  (:meth:`Recovery.instance_lost`: down at once, re-checked at once), a 5xx answer
  before or instead of the tokens (vLLM's ``EngineDeadError``) or a 5xx error event
  mid-stream (:meth:`Recovery.instance_answered_error`: its ``GET /health`` is asked at
  once, and vLLM answers 503 there once its engine is dead; a prefill's NIXL side
  channel that refuses connections says so before its API server does,
  :mod:`.sidechannel`). A dead instance is down from then on and the fleet's supervisor
  is told (:mod:`pdctl.sdk.router.suspects`), so that it restarts the instance without
  waiting for its own health rounds. A decode that answered an error but is alive
  (``/health`` 200) stays in service; when its prefill is dead (the KV it was to push
  never came) the request runs again — through another prefill in service where there
  is one, else decode-only — on another decode or, when it is the only one, on it. A
  prefill alive means the failure is the request's own.

The dispatcher owns this object and gives it to the leg sender and the relay.
"""

from __future__ import annotations

import json
from typing import Any

from pdctl.sdk.router import tracing
from pdctl.sdk.router.httpclient import UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.migrate import migratable, with_token_ids
from pdctl.sdk.router.replies import RouteError
from pdctl.sdk.router.suspects import SupervisorLink
from pdctl.sdk.router.timeline import RouterMetrics, Timeline


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


class Recovery:
    """Decides where a request goes after a failure, and whether it may go at all."""

    def __init__(
        self, instances: InstanceSet, metrics: RouterMetrics, link: SupervisorLink | None = None
    ) -> None:
        self.instances, self.metrics = instances, metrics
        self.settings = instances.settings
        self.link = link or SupervisorLink(None)
        """Where the supervisor hears of an instance the router saw fail."""

    def instance_lost(self, u: Upstream, why: str) -> None:
        """``u``'s connection was lost mid-leg: down at once, re-checked at once (in the
        background), and the supervisor told."""
        self.instances.mark(u, False)
        self.instances.recheck(u)
        self.link.suspect(u.name, why)

    async def instance_answered_error(self, u: Upstream, why: str, tl: Timeline) -> bool:
        """``u`` answered a 5xx or sent a 5xx error event: its ``/health`` now says
        whether its engine died (then it is down and the supervisor is told). Returns
        whether the request may run again on ``u`` when it is the only decode: it is
        alive and the request's prefill is not (the KV it was to push never came)."""
        await self.instances.check(u)
        if not u.healthy:
            self.link.suspect(u.name, why)
            return False
        if tl.prefill is None:
            return False
        try:
            p = self.instances.upstream(tl.prefill)
        except KeyError:
            return False
        await self.instances.check(p)
        why = (
            " (its NIXL side channel refuses connections)"
            if not p.healthy and self.instances.side_channels.refuses(p)
            else ""
        )
        tl.note(f"{u.role} {u.name} answered an error; prefill {p.name} healthy: {p.healthy}{why}")
        if not p.healthy:
            self.link.suspect(p.name, f"seen dead after {u.role} {u.name} answered an error")
        return not p.healthy

    def another_prefill(self, tl: Timeline) -> Upstream | None:
        """A prefill in service other than the one the request's failed P/D attempt
        used (recorded on the timeline as the request's prefill from now on), or None."""
        try:
            failed = (self.instances.upstream(tl.prefill),) if tl.prefill else ()
            p = self.instances.select(self.instances.prefills, exclude=failed)
        except (RouteError, KeyError):
            return None
        tl.note(f"disaggregated again through prefill {p.name}")
        tl.prefill = p.name
        return p

    def prepare(self, body: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Before a request is sent: whether a decode failing on it continues it elsewhere
        (:meth:`migrates`) and the request as decode gets it (:meth:`as_sent`)."""
        return self.migrates(body), self.as_sent(body)

    def as_sent(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as decode gets it: a stream asks for its token ids when another
        decode could continue it mid-answer (:mod:`pdctl.sdk.router.migrate`); with one
        decode only a stream that has sent nothing yet is started over."""
        if body.get("stream") and self.migrates(body) and len(self.instances.decodes) > 1:
            return with_token_ids(body)
        return body

    def migrates(self, body: dict[str, Any]) -> bool:
        """Whether a decode failing on this request continues it elsewhere."""
        return self.settings.migration_limit > 0 and migratable(body)

    def after_connect_failure(
        self,
        pool: list[Upstream],
        tried: tuple[Upstream, ...],
        e: UpstreamError,
        role: str,
        tl: Timeline,
    ) -> Upstream:
        """Where a leg goes after ``tried[-1]`` failed it with ``e``; re-raises ``e`` when
        something was sent, the retries are used up, or no instance is left."""
        tried[-1].breaker.failure()
        if not e.connect or len(tried) > 2:
            raise e
        try:
            u = self.instances.select(pool, exclude=tried)
        except RouteError:
            raise e from None
        tl.retries += 1
        self.metrics.retries.inc(role)
        if role == "prefill":
            tl.prefill = u.name
        else:
            tl.decode = u.name
        return u

    def leg_failed(
        self, pool: list[Upstream], name: str | None, sent_to: Upstream, e: UpstreamError
    ) -> LegFailed:
        """A leg's connection failed after it was sent (``name``: the instance it ended
        on, after any connect retries): count the instance as down until it answers a
        health check again."""
        failed = next((u for u in pool if u.name == name), sent_to)
        self.instance_lost(failed, str(e))
        return LegFailed(502, f"{failed.role} {failed.name} failed: {e}", failed)

    def next_prefill(self, e: LegFailed, tried: tuple[Upstream, ...], tl: Timeline) -> Upstream:
        """Another prefill for a request whose prefill failed (``tried``: those that
        failed it); re-raises ``e`` when retries are used up or none is left."""
        if len(tried) > self.settings.prefill_retries:
            raise e
        try:
            p = self.instances.select(self.instances.prefills, exclude=tried)
        except RouteError:
            raise e from None
        tl.retries += 1
        tl.prefill = p.name
        tl.note(f"{e}; retried on prefill {p.name}")
        self.metrics.retries.inc("prefill")
        return p

    async def migration_target(
        self,
        tl: Timeline,
        exclude: tuple[Upstream, ...],
        why: str,
        sent_tokens: int = 0,
        *,
        again: bool = False,
    ) -> Upstream:
        """The decode a request continues on after ``exclude[-1]`` failed it (recorded on
        the timeline): another one, or — ``again``, and no other is in service —
        ``exclude[-1]`` itself; 502 once ``router.migration_limit`` is reached."""
        if len(tl.migrations) >= self.settings.migration_limit:
            raise RouteError(502, f"{why} (router.migration_limit reached)")
        decodes = self.instances.decodes
        last = exclude[-1]
        others = [u for u in decodes if u not in exclude and u.eligible() and not u.drained]
        if again and not others and last.eligible() and not last.drained:
            d = last  # alive, and no other: the request failed, not the instance
        else:
            d = await self.instances.acquire(decodes, tl, exclude)
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
        return d
