"""``cache_aware``: pick the instance that already holds most of the prompt.

An instance's score is ``router.cache_weight_prefix`` times the share of the prompt's full
blocks it holds (:mod:`pdctl.sdk.kvindex`) minus ``router.cache_weight_load`` times its
requests in flight; the best score wins, ties go to the least loaded. Prefill is chosen
by score; decode by score too when it publishes KV events: with its prefix caching on,
decode caches what it computed and the KV pushed to it (vLLM caches received blocks once
the transfer is done), so with it off this is load alone. With
``router.disaggregate_min_uncached_tokens`` (256 by default) a prompt whose tokens not
cached on the chosen decode are that few goes to decode alone: the follow-ups of a
prefix decode already received skip the two-leg push.

The text path needs the prompt's token ids to hash it: it asks an instance's
``/tokenize`` once per distinct prompt (cached); the tokens path has them already.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pdctl.sdk.kvindex import BlockHasher, CacheIndex, IndexState, InstanceIndex
from pdctl.sdk.kvindex.index import STATES
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.policies.base import Policy
from pdctl.sdk.router.policies.least_loaded import LeastLoaded
from pdctl.sdk.router.replies import RouteError

if TYPE_CHECKING:
    from pdctl.sdk.fleetplan import FleetPlan
    from pdctl.sdk.kvindex.subscriber import EventSubscriber
    from pdctl.sdk.router.promreg import Registry
    from pdctl.sdk.router.timeline import Timeline
    from pdctl.sdk.spec import FleetSpec, RouterSpec

_CHAT_KEYS = (
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "documents",
)


HEAD_MIN_CHARS = 1024


def _head(prompt: str) -> str:
    """The prompt itself, or its first 1024 x 2^k characters (the most that are fewer
    than the prompt's)."""
    if len(prompt) <= HEAD_MIN_CHARS:
        return prompt
    n = HEAD_MIN_CHARS
    while 2 * n < len(prompt):
        n *= 2
    return prompt[:n]


class CacheAwarePolicy(Policy):
    """The best of the scores :class:`CacheAware` gives (ties: least loaded); without
    scores, least loaded."""

    name = "cache_aware"
    uses_scores = True

    def pick(self, cands: list[Upstream], scores: dict[str, float] | None) -> Upstream:
        if scores:
            top = max(scores.get(u.name, 0.0) for u in cands)
            cands = [u for u in cands if scores.get(u.name, 0.0) == top]
        return self.least_loaded(cands)


class RouterView(Protocol):
    """What the prefix index reads of the instance set (a protocol so that this module
    does not import it back)."""

    spec: FleetSpec
    settings: RouterSpec
    served_name: str
    upstreams: list[Upstream]
    prefills: list[Upstream]
    decodes: list[Upstream]


class CacheAware:
    """The prefix index of a fleet and what the router does with it."""

    def __init__(
        self, router: RouterView, plan: FleetPlan, registry: Registry, tokenize_cache: int = 4096
    ) -> None:
        spec = router.spec
        self.router = router
        names = [u.name for u in router.upstreams if u.role != "render"]
        self.index = CacheIndex(names)
        seeds = {i.env.get("PYTHONHASHSEED") for i in plan.instances if i.role != "render"}
        self.block_size = spec.fleet.effective_block_size
        self.hasher = BlockHasher(
            self.block_size, spec.fleet.prefix_caching_hash_algo, next(iter(seeds), None)
        )
        self.subscribers: list[EventSubscriber] = []
        self._plans = [i for i in plan.instances if i.kv_events_port is not None]
        self._tokens: OrderedDict[str, list[int]] = OrderedDict()
        self._tokens_cap = tokenize_cache
        self.tokenize_calls = 0
        self._least = LeastLoaded()  # its own turns: sharing the router's would skew them
        self.transitions = registry.counter(
            "pdctl_router_kv_index_transitions_total",
            "cache_aware: KV index state changes per instance, by new state.",
            ("instance", "state"),
        )
        self.transitions.prime(names, STATES)
        reg = registry
        reg.gauge(
            "pdctl_router_kv_index_state",
            "cache_aware: 1 for the instance's KV index state (EXACT: from its KV events; "
            "DEGRADED: events lagging or lost; FALLBACK: the router's routing history).",
            ("instance", "state"),
            lambda: {
                (n, s): float(i.state == s) for n, i in self.index.instances.items() for s in STATES
            },
            merge="max",  # with several workers (each its own index): 1 if any is in it
        )
        reg.gauge(
            "pdctl_router_prefix_blocks_routed",
            "cache_aware: prompt blocks routed to each instance.",
            ("instance",),
            lambda: {(n,): float(v) for n, v in self.index.looked_up.items()},
        )
        reg.gauge(
            "pdctl_router_prefix_blocks_matched",
            "cache_aware: of those, blocks the index believed the instance held.",
            ("instance",),
            lambda: {(n,): float(v) for n, v in self.index.matched.items()},
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Subscribe to every instance that publishes KV events (the others stay in the
        approximate FALLBACK state)."""
        from pdctl.sdk.kvindex.subscriber import EventSubscriber

        for p in self._plans:
            if p.name not in self.index.instances or p.kv_events_port is None:
                continue
            host = "127.0.0.1" if p.host in ("0.0.0.0", "::", "") else p.host
            sub = EventSubscriber(
                self.index[p.name],
                host,
                p.kv_events_port,
                check=self.hasher.first_key,
                on_state=self._on_state,
            )
            self.subscribers.append(sub)
            sub.start()

    async def stop(self) -> None:
        for s in self.subscribers:
            await s.stop()
        self.subscribers.clear()

    def _on_state(self, idx: InstanceIndex, state: IndexState) -> None:
        self.transitions.inc(idx.name, state)

    # ------------------------------------------------------------------ token ids

    async def token_ids(
        self, path: str, body: dict[str, Any], tl: Timeline
    ) -> tuple[list[int], int] | None:
        """(token ids to look the prompt up by, the prompt's length in tokens) on the text
        path, from an instance's ``/tokenize``; None when the request is not one prompt
        or no instance could tokenize it.

        A completion prompt over 1024 characters is looked up by its head: the first
        ``n`` characters, ``n`` the largest of 1024, 2048, 4096, ... shorter than the
        prompt, are tokenized (and cached,
        so prompts sharing that head share one ``/tokenize``), their last block dropped
        (a token may straddle the cut), and the length extrapolated."""
        if path == "/v1/completions":
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                return list(prompt), len(prompt)
            if not isinstance(prompt, str):
                return None
            head = _head(prompt)
            ids = await self._cached(head, {"prompt": head}, tl)
            if ids is None or head is prompt:
                return None if ids is None else (ids, len(ids))
            keep = max(0, len(ids) // self.block_size - 1) * self.block_size
            return ids[:keep], round(len(ids) * len(prompt) / len(head))
        elif path == "/v1/chat/completions":
            req = {k: body[k] for k in _CHAT_KEYS if k in body}
            if not isinstance(req.get("messages"), list):
                return None
            key = "\0chat" + json.dumps(req, sort_keys=True, separators=(",", ":"))
            ids = await self._cached(key, req, tl)
            return None if ids is None else (ids, len(ids))
        return None

    async def _cached(self, key: str, req: dict[str, Any], tl: Timeline) -> list[int] | None:
        hit = self._tokens.get(key)
        if hit is not None:
            self._tokens.move_to_end(key)
            return hit
        ids = await self._tokenize({"model": self.router.served_name, **req}, tl)
        if ids is not None:
            self._tokens[key] = ids
            while len(self._tokens) > self._tokens_cap:
                self._tokens.popitem(last=False)
        return ids

    async def _tokenize(self, req: dict[str, Any], tl: Timeline) -> list[int] | None:
        r = self.router
        try:
            u = self._least.choose(r.decodes + r.prefills)
        except RouteError:
            return None
        self.tokenize_calls += 1
        try:
            resp = await u.pool.request(
                "POST",
                "/tokenize",
                json.dumps(req).encode(),
                [("Content-Type", "application/json")],
            )
            try:
                raw = await resp.read()
            finally:
                resp.release()
            data = json.loads(raw) if resp.status == 200 else None
        except Exception as e:  # a lookup that fails only costs the cache-aware choice
            tl.note(f"cache_aware: /tokenize on {u.name} failed: {e}")
            return None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens[:1]):
            tl.note(f"cache_aware: /tokenize on {u.name} answered {resp.status}")
            return None
        return tokens

    # ------------------------------------------------------------------ choice

    def keys(self, token_ids: Sequence[int]) -> list[int]:
        return self.hasher.keys(token_ids)

    def scores(
        self,
        pool: Sequence[Upstream],
        keys: Sequence[int],
        blocks: int = 0,
        over: dict[str, int] | None = None,
    ) -> dict[str, float]:
        """Each instance's score for a prompt of ``blocks`` full blocks whose leading ones
        are ``keys`` (see the module doc); ``over``: their :meth:`overlaps`, when known."""
        s = self.router.settings
        total = max(1, blocks, len(keys))
        if over is None:
            over = self.overlaps(pool, keys)
        return {
            u.name: s.cache_weight_prefix * over.get(u.name, 0) / total
            - s.cache_weight_load * u.outstanding
            for u in pool
        }

    def overlaps(self, pool: Sequence[Upstream], keys: Sequence[int]) -> dict[str, int]:
        """The prompt's leading blocks each instance of ``pool`` holds."""
        known = [u.name for u in pool if u.name in self.index.instances]
        over = self.index.overlaps(known, keys) if known else {}
        return {u.name: over.get(u.name, 0) for u in pool}

    def overlap(self, u: Upstream, keys: Sequence[int]) -> int:
        return self.overlaps((u,), keys)[u.name]

    def routed(self, u: Upstream, keys: Sequence[int], tl: Timeline) -> None:
        """Remember where the prompt went (the routing history, and the hit tally)."""
        matched = self.overlap(u, keys)
        self.index.routed(u.name, keys, matched)
        tl.note(f"cache_aware: {u.name} holds {matched}/{len(keys)} prompt blocks")

    def summary(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "hash_algo": self.hasher.algo,
            "tokenize_calls": self.tokenize_calls,
            "instances": self.index.summary(),
        }
