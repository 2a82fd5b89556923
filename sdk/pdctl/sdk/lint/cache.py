"""Rules PD039-PD041: the cache-aware router and what must agree between it and vLLM
(KV events on, the same block hashes), and push mode with prefix caching on decode."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

from pdctl.sdk.kvindex.hashing import CRYPTO_ALGOS
from pdctl.sdk.lint.core import Finding, LintContext, _f, rule

PUSH_WORKER = "distributed/kv_transfer/kv_connector/v1/nixl/push_worker.py"
PUSH_PREFIX_FIX_MARK = "_apply_prefix_caching"
"""What vLLM's push worker defines once it trims the pushed blocks to decode's uncached
tail (vllm#48758, item C3 of the push roadmap vllm#48633)."""


def _cache_aware(ctx: LintContext) -> bool:
    return ctx.spec.router is not None and ctx.spec.router.policy == "cache_aware"


@rule("PD039", "cache-aware routing without KV events")
def _no_events(ctx: LintContext) -> Iterator[Finding]:
    if not _cache_aware(ctx) or ctx.spec.kv_events_on:
        return
    off = ctx.spec.fleet.enable_prefix_caching is False
    yield _f(
        "PD039",
        "warning",
        "fleet.enable_prefix_caching" if off else "fleet.kv_events",
        "router.policy is 'cache_aware' but the instances publish no KV events"
        + (" (prefix caching is off)" if off else ""),
        "the router only guesses what each instance caches from its own routing history "
        "(FALLBACK): evictions and restarts go unseen, so it sends prompts where their "
        "prefix no longer is",
        "set fleet.enable_prefix_caching = true and leave fleet.kv_events unset (or true)"
        if off
        else "remove fleet.kv_events = false",
    )


@rule("PD040", "the router cannot hash prompts like the instances")
def _hash_agreement(ctx: LintContext) -> Iterator[Finding]:
    if not _cache_aware(ctx):
        return
    fleet = ctx.spec.fleet
    engines = [i for i in ctx.plan.instances if i.role != "render"]
    seeds = {i.env.get("PYTHONHASHSEED") for i in engines}
    cost = (
        "the router's block hashes never match the ones in the KV events: every lookup "
        "misses and cache_aware degrades to least-loaded"
    )
    if len(seeds) > 1:
        yield _f(
            "PD040",
            "error",
            "env.PYTHONHASHSEED",
            "instances run with different PYTHONHASHSEED values "
            f"({', '.join(sorted(repr(s) for s in seeds))}); vLLM seeds its block hashes "
            "with it",
            cost + "; instances cannot share prefixes either",
            "set PYTHONHASHSEED once in fleet.env (or nowhere)",
        )
    if fleet.prefix_caching_hash_algo not in CRYPTO_ALGOS and None in seeds:
        yield _f(
            "PD040",
            "error",
            "fleet.prefix_caching_hash_algo",
            f"{fleet.prefix_caching_hash_algo} without PYTHONHASHSEED: each vLLM process "
            "draws a random hash seed",
            cost,
            "set PYTHONHASHSEED in fleet.env, or use prefix_caching_hash_algo = 'sha256'",
        )
    sizes = {i.block_size for i in engines}
    if len(sizes) > 1 or sizes - {fleet.effective_block_size}:
        yield _f(
            "PD040",
            "error",
            "block_size",
            f"groups use block sizes {sorted(sizes)}; the router hashes prompts in blocks "
            f"of fleet.block_size ({fleet.effective_block_size})",
            cost + " on the groups with another size",
            "set the block size once, in fleet.block_size",
        )


def push_prefix_fix_present() -> bool | None:
    """Whether the installed vLLM's push worker trims pushed blocks to decode's uncached
    tail (vllm#48758); None when vLLM is not installed here. Reads the source, never
    imports vLLM."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(next(iter(spec.submodule_search_locations))) / PUSH_WORKER
    try:
        return PUSH_PREFIX_FIX_MARK in src.read_text()
    except OSError:
        return False  # a vLLM without the push worker file predates the fix


def _decode_caches(ctx: LintContext) -> list[str]:
    """Decode groups that run with prefix caching on (vLLM's default is on)."""
    out = []
    for role, _gi, g, where in ctx.groups():
        if role != "decode":
            continue
        on = ctx.spec.fleet.enable_prefix_caching is not False
        for a in [*ctx.spec.fleet.vllm_args, *g.vllm_args]:
            if a == "--no-enable-prefix-caching":
                on = False
            elif a == "--enable-prefix-caching":
                on = True
        if on:
            out.append(where)
    return out


@rule("PD041", "push mode with prefix caching on decode, on a vLLM without the fix")
def _push_decode_prefix(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.mode != "push" or ctx.spec.backend.kind != "local":
        return
    groups = _decode_caches(ctx)
    if not groups or push_prefix_fix_present():
        return
    yield _f(
        "PD041",
        "warning",
        f"{groups[0]}.vllm_args",
        f"{', '.join(groups)} cache prefixes in push mode, and the vLLM here does not trim "
        "pushed blocks to decode's uncached tail (vllm#48758)",
        "a partial prefix hit on decode gets KV written into the wrong blocks: HTTP 200 "
        "with wrong tokens, silently (vllm#48633, item C3)",
        'add "--no-enable-prefix-caching" to the decode groups\' vllm_args, or upgrade '
        "vLLM to a release with vllm#48758",
    )
