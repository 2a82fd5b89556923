"""Prefix-cache block hashes, computed the way vLLM 0.32 computes them.

vLLM keys every full block of ``block_size`` tokens by a chained hash: the hash of
``(parent block's hash, the block's token ids as a tuple, extra keys)`` under the
algorithm of ``--prefix-caching-hash-algo``, where the first block's parent is
``NONE_HASH`` = hash of a seed string. The seed is ``PYTHONHASHSEED`` when set, otherwise
``"vllm-none-hash"`` for the cryptographic algorithms (the xxhash ones then use a random
per-process seed, which nobody outside the process can reproduce). Extra keys (LoRA,
multimodal, cache salt, prompt embeddings) are ``None`` for plain text prompts, the only
kind the router hashes.

KV events publish each hash as an int — the low 64 bits of the digest read big-endian
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default) — or as the raw digest; the
index keys blocks by that 64-bit form (:func:`event_key`).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_SEED = "vllm-none-hash"
CRYPTO_ALGOS = frozenset({"sha256", "sha256_cbor"})
_MASK64 = (1 << 64) - 1


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # a vLLM dependency; only needed for this algorithm

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    import xxhash  # type: ignore[import-not-found,unused-ignore]  # optional, as in vLLM

    return bytes(xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))


def _xxhash_cbor(obj: Any) -> bytes:
    import cbor2
    import xxhash  # type: ignore[import-not-found,unused-ignore]

    return bytes(xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True)))


HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def event_key(h: bytes | int) -> int:
    """A block hash as KV events carry it (int or digest) → the index's 64-bit key."""
    if isinstance(h, int):
        return h & _MASK64
    return int.from_bytes(h, "big") & _MASK64


class BlockHasher:
    """The chained block hashes of a token sequence, as one vLLM instance computes them.

    ``seed`` is the instance's ``PYTHONHASHSEED`` (``None``: unset). A seedless xxhash
    instance draws a random seed per process: its hashes cannot be reproduced, and
    constructing a hasher for it raises ``ValueError``.
    """

    def __init__(self, block_size: int, algo: str = "sha256", seed: str | None = None) -> None:
        if algo not in HASH_FUNCTIONS:
            raise ValueError(
                f"prefix_caching_hash_algo {algo!r} is unknown; use one of "
                f"{', '.join(HASH_FUNCTIONS)}"
            )
        if seed is None and algo not in CRYPTO_ALGOS:
            raise ValueError(
                f"{algo} without PYTHONHASHSEED gives every vLLM process a random seed: set "
                "PYTHONHASHSEED in fleet.env, or use prefix_caching_hash_algo = 'sha256'"
            )
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1 (got {block_size})")
        self.block_size = block_size
        self.algo = algo
        self._fn = HASH_FUNCTIONS[algo]
        self.none_hash = self._fn(seed if seed is not None else DEFAULT_SEED)
        self._memo: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        """(parent digest, block tokens) -> digest: shared prefixes are hashed once."""
        self.memo_size = 1 << 16

    def digests(self, token_ids: Sequence[int], limit: int | None = None) -> list[bytes]:
        """The full digests of the prompt's full blocks (at most ``limit`` of them)."""
        bs = self.block_size
        n = len(token_ids) // bs
        if limit is not None:
            n = min(n, limit)
        out: list[bytes] = []
        parent = self.none_hash
        memo = self._memo
        for i in range(n):
            block = tuple(token_ids[i * bs : (i + 1) * bs])
            d = memo.get((parent, block))
            if d is None:
                if len(memo) >= self.memo_size:
                    memo.clear()
                d = memo[(parent, block)] = self._fn((parent, block, None))
            parent = d
            out.append(d)
        return out

    def keys(self, token_ids: Sequence[int], limit: int | None = None) -> list[int]:
        """The index keys (64-bit event form) of the prompt's full blocks, in order."""
        return [event_key(d) for d in self.digests(token_ids, limit)]

    def first_key(self, token_ids: Sequence[int]) -> int:
        """The key of a block whose parent is ``NONE_HASH`` (``token_ids``: exactly one
        block): lets a subscriber check that it hashes like the publisher."""
        return event_key(self._fn((self.none_hash, tuple(token_ids), None)))
