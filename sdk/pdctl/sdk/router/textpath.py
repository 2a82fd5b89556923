"""The ``text`` path, a dispatch strategy: the OpenAI body goes to the engines as it is."""

from __future__ import annotations

from typing import Any

from pdctl.sdk.pd import prefill_body
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.legs import LegSender
from pdctl.sdk.router.recovery import LegFailed, Recovery
from pdctl.sdk.router.relay import Relay
from pdctl.sdk.router.replies import Reply, StreamReply
from pdctl.sdk.router.timeline import Timeline


class TextPath:
    """Routes a request on the text path over the leg sender and the relay."""

    name = "text"

    def __init__(
        self, instances: InstanceSet, legs: LegSender, relay: Relay, recovery: Recovery
    ) -> None:
        self.instances, self.legs, self.relay, self.recovery = instances, legs, relay, recovery

    async def route(self, endpoint: str, body: dict[str, Any], tl: Timeline) -> Reply | StreamReply:
        """A streamed answer asks decode for its token ids so that it can be migrated; a
        decode that dies before answering restarts the request on another."""
        stream = bool(body.get("stream"))
        migrates, sent = self.recovery.prepare(body)
        cache = self.instances.cache_aware
        found = await cache.token_ids(endpoint, body, tl) if cache is not None else None
        ids, n = found if found is not None else (None, None)
        tried: tuple[Upstream, ...] = ()
        try:
            leg = await self.legs.run(endpoint, sent, tl, prefill_body, token_ids=ids, prompt_len=n)
        except LegFailed as e:
            if e.upstream.role != "decode" or not migrates:
                raise
            # decode died before answering: nothing reached the client, start it over
            # on another decode, which computes the prompt itself
            tried = (e.upstream,)
            leg = await self.relay.restart(endpoint, body, tl, tried, str(e))
        return await self.relay.reply(
            leg, tl, stream=stream, body=body, endpoint=endpoint, migrate=migrates, tried=tried
        )
