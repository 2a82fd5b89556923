"""The router's ``tokens`` path: GPU-less render servers in front of token-in/token-out
engines, and conditional disaggregation on the rendered prompt length.

1. **Render** the OpenAI request once on a render server (``/v1/completions/render`` or
   ``/v1/chat/completions/render``): the answer is vLLM's ``GenerateRequest`` — token
   ids plus sampling parameters.
2. **Decide**: a prompt shorter than ``router.disaggregate_min_tokens`` goes to decode
   alone (moving its KV would cost more than computing it there); longer ones take the
   P/D path with the same push-mode ``kv_transfer_params`` rules as the text path, on
   the engines' ``/inference/v1/generate`` (``--enable-scale-out``).
3. **Derender** decode's token output back into an OpenAI response on the same render
   server (``/…/derender``); streamed answers are derendered chunk by chunk, carrying
   the detokenizer state vLLM returns between calls.

With no render server answering, the request fails with 503, or — with
``router.render_fallback = "text"`` — takes the text path instead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any, Protocol

from pdctl.sdk.pd import prefill_generate_body
from pdctl.sdk.router import tracing
from pdctl.sdk.router.derendered import TokenIds
from pdctl.sdk.router.httpclient import UpstreamError
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.instanceset import InstanceSet
from pdctl.sdk.router.lease import Lease
from pdctl.sdk.router.ledger import Ledger
from pdctl.sdk.router.legs import LegSender
from pdctl.sdk.router.recovery import LegFailed, Recovery
from pdctl.sdk.router.relay import Relay
from pdctl.sdk.router.replies import Reply, RouteError, StreamReply, server_failed
from pdctl.sdk.router.timeline import RouterMetrics, Timeline
from pdctl.sdk.router.tokenresume import Resume, generated

GENERATE_ENDPOINT = "/inference/v1/generate"
"""The engines' token-in/token-out endpoint."""
ENDPOINTS = {
    # OpenAI path -> (render path, derender path)
    "/v1/completions": ("/v1/completions/render", "/v1/completions/derender"),
    "/v1/chat/completions": ("/v1/chat/completions/render", "/v1/chat/completions/derender"),
}


class RenderUnavailable(Exception):
    """No render server could take the request."""


class Strategy(Protocol):
    """A router path: what the tokens path hands what it cannot take to."""

    async def route(
        self, endpoint: str, body: dict[str, Any], tl: Timeline
    ) -> Reply | StreamReply: ...


def _keep_max_tokens(gen: dict[str, Any], body: dict[str, Any]) -> None:
    """vLLM's render leaves ``max_tokens`` out of the sampling parameters when it equals
    SamplingParams' default (16), and ``/inference/v1/generate`` then treats it as unset
    (the rest of the context window). Carry the client's value explicitly."""
    want = body.get("max_completion_tokens", body.get("max_tokens"))
    sampling = gen.get("sampling_params")
    if isinstance(want, int) and isinstance(sampling, dict) and "max_tokens" not in sampling:
        gen["sampling_params"] = {**sampling, "max_tokens": want}


def _derender_payload(ctx: dict[str, Any], generated: dict[str, Any]) -> dict[str, Any]:
    ids: list[int] = ctx["prompt_token_ids"]
    body: dict[str, Any] = ctx["body"]
    if ctx["path"] == "/v1/completions":
        return {
            "model": body.get("model"),
            "generate_responses": [generated],
            "prompt_tokens": [len(ids)],
            "prompt_token_ids": [ids],
            "completion_request": body,
        }
    return {
        "model": body.get("model"),
        "generate_response": generated,
        "prompt_tokens": len(ids),
        "prompt_token_ids": ids,
        "chat_request": body,
    }


class TokensPath:
    """The tokens path as a dispatch strategy: :meth:`route` renders, decides and
    derenders over the instance set, the leg sender and the relay (their public
    methods only); what it cannot take goes to ``fallback`` (the text path)."""

    name = "tokens"

    def __init__(
        self,
        instances: InstanceSet,
        legs: LegSender,
        relay: Relay,
        ledger: Ledger,
        metrics: RouterMetrics,
        fallback: Strategy,
    ) -> None:
        self.instances, self.legs, self.relay = instances, legs, relay
        self.ledger, self.metrics, self.fallback = ledger, metrics, fallback
        self.settings = instances.settings
        self.recovery: Recovery = legs.recovery

    async def _post_json(
        self, u: Upstream, endpoint: str, payload: dict[str, Any], tl: Timeline
    ) -> tuple[int, Any]:
        """POST to a render server; (status, parsed JSON). Connection failures raise
        :class:`UpstreamError`."""
        data = json.dumps(payload).encode()
        leg = await self.legs.send(self.instances.renders, u, endpoint, data, tl.id, tl, "render")
        raw = await leg.read()
        try:
            return leg.status, json.loads(raw)
        except ValueError:
            return leg.status, {"error": {"message": raw[:300].decode(errors="replace")}}

    async def _render(
        self, endpoint: str, body: dict[str, Any], tl: Timeline
    ) -> tuple[Upstream, dict[str, Any]]:
        """The request's ``GenerateRequest`` and the render server that made it."""
        try:
            u = self.instances.select(self.instances.renders)
        except RouteError as e:
            raise RenderUnavailable(str(e)) from None
        tl.render = u.name
        t = tl.mark()
        tracing.open_leg(tl, "render", u.name)
        try:
            status, data = await self._post_json(u, ENDPOINTS[endpoint][0], body, tl)
        except UpstreamError as e:
            raise RenderUnavailable(f"render server {u.name} failed: {e}") from None
        tl.render_done = tl.mark()
        tracing.close_leg(tl, "render", u.name, status)
        self.metrics.render.observe(tl.render_done - t, u.name)
        if status != 200:
            # the request itself is bad (unknown model, too long, malformed): tell the client
            msg = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            raise RouteError(
                status if status < 500 else 502,
                f"render server {u.name} refused the request ({status}): {msg or data}",
                "invalid_request_error" if status < 500 else "upstream_error",
            )
        gen = data[0] if isinstance(data, list) and len(data) == 1 else data
        if not isinstance(gen, dict) or not isinstance(gen.get("token_ids"), list):
            raise RouteError(
                400,
                "the tokens path takes one prompt per request (send a list of prompts as "
                "separate requests, or use router.path = 'text')",
                "invalid_request_error",
            )
        return u, gen

    async def route(self, endpoint: str, body: dict[str, Any], tl: Timeline) -> Reply | StreamReply:
        if endpoint not in ENDPOINTS:
            return await self.fallback.route(endpoint, body, tl)
        try:
            rs, gen = await self._render(endpoint, body, tl)
        except RenderUnavailable as e:
            if self.settings.render_fallback != "text":
                raise RouteError(
                    503, f"no render server available: {e}", "service_unavailable"
                ) from None
            tl.route_path = "text-fallback"
            return await self.fallback.route(endpoint, body, tl)
        tl.route_path = "tokens"
        _keep_max_tokens(gen, body)
        ids: list[int] = gen["token_ids"]
        tl.prompt_tokens = len(ids)
        stream = bool(body.get("stream"))
        gen = {**gen, "request_id": tl.id, "stream": stream}
        if stream:
            gen["stream_options"] = {"include_usage": True}
        decode_only = len(ids) < self.settings.disaggregate_min_tokens
        migrates = self.recovery.migrates(body)
        tried: tuple[Upstream, ...] = ()
        try:
            leg = await self.legs.run(
                GENERATE_ENDPOINT,
                gen,
                tl,
                prefill_generate_body,
                decode_only=decode_only,
                token_ids=ids,
            )
        except LegFailed as e:
            if e.upstream.role != "decode" or not migrates:
                raise
            tried = (e.upstream,)  # nothing reached the client: start over elsewhere
            leg = await self.relay.restart(GENERATE_ENDPOINT, gen, tl, tried, str(e), sent=gen)
        context = {
            "prompt_token_ids": ids,
            "body": body,
            "path": endpoint,
            "render": rs,
            "gen": gen,
            "ids": TokenIds(endpoint, body, ids),
        }
        leg, raw, tried = await self.relay.whole(
            leg, tl, GENERATE_ENDPOINT, gen if migrates else None, tried, stream=stream, sent=gen
        )
        if raw is None:
            resume = Resume(gen, tried, body) if migrates else None
            return self.relay.stream(leg, self._derender_stream(leg, tl, context, resume))
        return await self._derender_whole(leg, raw, tl, context)

    async def _derender_whole(
        self, leg: Lease, raw: bytes, tl: Timeline, ctx: dict[str, Any]
    ) -> Reply:
        d = leg.upstream
        if leg.status != 200:
            self.ledger.finish(tl, "error", leg.status)
            return Reply(leg.status, raw)
        try:
            generated = json.loads(raw)
        except ValueError:
            raise RouteError(502, f"decode {d.name} sent a non-JSON answer") from None
        usage = generated.get("usage") if isinstance(generated, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            tl.completion_tokens = usage["completion_tokens"]
        rs = ctx["render"]
        try:
            status, out = await self._post_json(
                rs, ENDPOINTS[ctx["path"]][1], _derender_payload(ctx, generated), tl
            )
        except UpstreamError as e:
            raise RouteError(502, f"derender on {rs.name} failed: {e}") from None
        if status != 200:
            raise RouteError(502, f"derender on {rs.name} answered {status}: {out}")
        if isinstance(out, dict) and isinstance(generated, dict):
            out = ctx["ids"].whole(out, generated)
        self.ledger.finish(tl, "ok", 200)
        return Reply(200, json.dumps(out).encode())

    async def _derender_stream(
        self, leg: Lease, tl: Timeline, ctx: dict[str, Any], resume: Resume | None
    ) -> AsyncGenerator[bytes, None]:
        """Decode's token chunks in, derendered OpenAI chunks out (one derender call per
        chunk, carrying vLLM's detokenizer state between them). A decode that fails
        mid-stream (the connection lost, a 5xx error event) is continued on another
        with ``resume`` (:class:`Resume`): the derender state goes on as if nothing
        happened, since it only ever sees token ids."""
        ids: list[int] = ctx["prompt_token_ids"]
        key = "completion_request" if ctx["path"] == "/v1/completions" else "chat_request"
        state: Any = None
        events = 0
        current: Lease | None = leg
        try:
            while current is not None:
                assert current.response is not None
                try:
                    async for chunk in generated(current.response, resume):
                        if not events:
                            tl.decode_first_byte = tl.mark()
                        if chunk.get("choices"):
                            events += 1
                        payload = {
                            "stream": True,
                            "model": ctx["body"].get("model"),
                            "generate_chunk": chunk,
                            "stream_state": state,
                            "prompt_tokens": len(ids),
                            "prompt_token_ids": ids,
                            key: ctx["body"],
                        }
                        try:
                            status, out = await self._post_json(
                                ctx["render"], ENDPOINTS[ctx["path"]][1], payload, tl
                            )
                        except UpstreamError as e:
                            raise DerenderFailed(f"derender failed: {e}") from None
                        if status != 200 or not isinstance(out, dict):
                            raise DerenderFailed(f"derender answered {status}: {str(out)[:300]}")
                        state = out.get("stream_state")
                        sent = out.get("chunk")
                        if isinstance(sent, dict):
                            sent = ctx["ids"].chunk(sent, chunk)
                        if resume is not None:
                            resume.derendered(sent)
                        yield b"data: " + json.dumps(sent).encode() + b"\n\n"
                    break
                except UpstreamError as e:
                    if resume is None or resume.finished:
                        raise
                    current.release()
                    d, current = current.upstream, None
                    current = await self._continue(resume, d, e, tl)
            yield b"data: [DONE]\n\n"
            tl.completion_tokens = len(resume.ids) if resume is not None else events
            self.ledger.finish(tl, "ok", 200)
        except (UpstreamError, ValueError, DerenderFailed, RouteError) as e:
            for part in self.relay.stream_failed(tl, f"tokens stream failed mid-answer: {e}"):
                yield part
        finally:
            if current is not None:
                self.relay.closed(current, tl, events)

    async def _continue(self, resume: Resume, d: Upstream, e: UpstreamError, tl: Timeline) -> Lease:
        """The decode the stream goes on from, after ``d`` failed it with ``e``: one that
        answers 5xx is passed over as failed; :class:`RouteError` once
        ``router.migration_limit`` is reached or no decode is left."""
        why = f"decode {d.name} failed mid-answer: {e}"
        resume.tried += (d,)
        recovery = self.recovery
        while True:
            again = False
            if resume.error is not None:  # it answered: its /health says the rest
                again = await recovery.instance_answered_error(d, why, tl)
            else:
                recovery.instance_lost(d, why)
            self.ledger.release_kv(tl)
            body = resume.continuation()
            if body is None:
                raise RouteError(502, f"{why}; nothing left to generate")
            n = len(resume.ids)
            nxt = await self.legs.migrate(GENERATE_ENDPOINT, body, tl, resume.tried, why, n,
                                          again=again)  # fmt: skip
            if nxt.status == 200:
                return nxt
            raw = await self.relay.read(nxt)
            text = raw[:300].decode(errors="replace")
            why = f"decode {nxt.upstream.name} answered {nxt.status}: {text}"
            if not server_failed(nxt.status):
                raise RouteError(502, why)
            d = nxt.upstream
            resume.tried += (d,)
            resume.error = why


class DerenderFailed(Exception):
    """The render server failed to derender a chunk (not decode's failure)."""
