"""Per-block digests of KV cache bytes, and the wire form that carries them.

A block's digest is a 64-bit position-weighted sum of the block's bytes in every KV
layer: each layer's page of the block is read as little machine words (the widest of
1, 2, 4 or 8 bytes that the cache's dtype has), each word is multiplied by an odd weight
that depends on its position in the page, the products are summed modulo 2**64, and the
layers are combined with a second odd weight per layer (in sorted layer-name order).
Integer sums are order-free, so the value is the same on any device and for any
reduction order; it is computed with torch ops where the KV lives (no host copy on a
GPU: only the 8-byte results leave it).

What it sees: any change of one word (an odd weight times a non-zero difference is never
0 mod 2**64), a block's bytes written into another block's slot (each block is checked
in its own destination slot), words moved within a page (position weights) and a layer
written into another layer (layer weights); a random multi-word corruption collides with
probability about 2**-64. What it cannot see: a change that keeps the weighted sum (not
an adversary's tool: it is a check against bugs, not a MAC), and anything outside the
blocks the prefill wrote (a decode's own prefix-cached blocks are not re-checked here).

Pure torch and Python; no vLLM, no NIXL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pdctl.connector import kvslice

MASK = (1 << 64) - 1
WIRE = b"pdkv1|"
"""Prefix of a WRITE notification that carries the digests of the blocks it wrote."""
_WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_weights: dict[tuple[int, str], torch.Tensor] = {}


def _signed(v: int) -> int:
    """``v`` (0 ≤ v < 2**64) as the int64 with the same bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _odd_weights(n: int, device: torch.device) -> torch.Tensor:
    """``n`` odd int64 weights (a splitmix-style hash of the position), cached per device."""
    key = (n, str(device))
    w = _weights.get(key)
    if w is None:
        i = torch.arange(n, dtype=torch.int64, device=device)
        x = i * _signed(0x9E3779B97F4A7C15)  # int64 arithmetic wraps mod 2**64
        x = x ^ (x >> 31)
        x = x * _signed(0x5851F42D4C957F2D)
        w = _weights[key] = x | 1
    return w


def _words(pages: torch.Tensor, part: tuple[int, int] | None = None) -> torch.Tensor:
    """``pages`` (one row per block, any shape after) as int64 words; with ``part``
    (``(index, parts)``), only run ``index`` of ``parts`` equal runs of each page."""
    flat = pages.reshape(pages.shape[0], -1)
    if part is not None:
        start, stop = kvslice.run(flat.shape[1], *part)
        flat = flat[:, start:stop]
    word = _WORD.get(flat.element_size(), torch.uint8)
    if word is torch.uint8 and flat.element_size() != 1:
        flat = flat.contiguous().view(torch.uint8)
    return flat.contiguous().view(word).to(torch.int64)


def _layer_weight(name: str) -> int:
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return h | 1


def block_digests(
    caches: Mapping[str, torch.Tensor],
    block_ids: Sequence[int],
    part: tuple[int, int] | None = None,
) -> list[int]:
    """The digest of each block in ``block_ids`` over every cache in ``caches`` (layer
    name → block-major tensor: dim 0 indexes blocks), as unsigned 64-bit ints. With
    ``part`` (``(index, parts)``), the digest of run ``index`` of ``parts`` equal runs
    of each layer's page (in the page's element order): the bytes one prefill rank
    wrote under heterogeneous TP (:mod:`pdctl.connector.kvslice`); it equals the digest
    of that rank's own whole page when the bytes are equal."""
    if not block_ids:
        return []
    acc: torch.Tensor | None = None
    for name in sorted(caches):
        cache = caches[name]
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=cache.device)
        words = _words(cache.index_select(0, idx), part)
        layer = (words * _odd_weights(words.shape[1], words.device)).sum(dim=1)
        layer = layer * _signed(_layer_weight(name))
        acc = layer if acc is None else acc + layer
    assert acc is not None
    return [v & MASK for v in acc.tolist()]


def sampled(request_id: str, rate: float) -> bool:
    """Whether ``request_id`` is in the verified share ``rate`` (0..1). Deterministic:
    every rank of a decode decides alike for the same id."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    h = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little")
    return h / 2**64 < rate


# ---------------------------------------------------------------------- wire form


@dataclass(frozen=True)
class Tagged:
    """What one tagged notification carries: ``digests`` (destination block id →
    digest), ``plain`` (vLLM's own notification) and ``part`` (``(index, parts)``: the
    run of each destination block the WRITE filled; None for the whole block)."""

    digests: dict[int, int]
    plain: bytes
    part: tuple[int, int] | None = None


def encode(
    pairs: Sequence[tuple[int, int]], notif: bytes, part: tuple[int, int] | None = None
) -> bytes:
    """``notif`` (vLLM's ``<request id>:<tp size>``) carrying ``(destination block id,
    digest)`` pairs: ``pdkv1|<id>=<hex>,...|<notif>``; a WRITE that fills run ``i`` of
    ``n`` of each block (``part``) says so first: ``pdkv1|@<i>/<n>,<id>=<hex>,...|``."""
    items = [f"{b}={d:x}" for b, d in pairs]
    if part is not None:
        items.insert(0, f"@{part[0]}/{part[1]}")
    return WIRE + ",".join(items).encode() + b"|" + notif


def parse(notif: bytes) -> Tagged | None:
    """What ``notif`` carries; None when it carries no digests. A malformed digest list
    parses as no digests (the receiver treats it as a mismatch: the notification was not
    what the prefill sent)."""
    if not notif.startswith(WIRE):
        return None
    body, sep, rest = notif[len(WIRE) :].partition(b"|")
    if not sep:
        return Tagged({}, notif)
    out: dict[int, int] = {}
    part: tuple[int, int] | None = None
    try:
        for item in body.decode("ascii").split(","):
            if item.startswith("@") and part is None and not out:
                i, _, n = item[1:].partition("/")
                part = (int(i), int(n))
                kvslice.run(part[1], *part)  # a run that exists, or ValueError
            elif item:
                b, _, d = item.partition("=")
                out[int(b)] = int(d, 16)
    except ValueError:
        return Tagged({}, rest)
    return Tagged(out, rest, part)


def decode(notif: bytes) -> tuple[dict[int, int], bytes] | None:
    """``({destination block id: digest}, vLLM's notification)``; None when ``notif``
    carries no digests (:func:`parse` without the part)."""
    tagged = parse(notif)
    return None if tagged is None else (tagged.digests, tagged.plain)


def describe(caches: Mapping[str, Any]) -> str:
    """One line naming what the digest covers (for the log)."""
    first = next(iter(caches.values()), None)
    shape = tuple(first.shape) if first is not None else ()
    return f"{len(caches)} KV layer(s), shape {shape}"
