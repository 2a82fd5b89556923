"""The push layouts the head-slice contract asks vLLM about: prefill TP ≥ decode TP."""

from __future__ import annotations

from itertools import product
from typing import Any

KV_HEADS = (1, 2, 4, 8)
TPS = (1, 2, 3, 4, 6, 8, 12, 16)


def _loadable(tp: int, heads: int) -> bool:
    """A TP the model's KV heads shard over (or are replicated across) evenly."""
    return heads % tp == 0 if tp <= heads else tp % heads == 0


def layouts() -> list[dict[str, Any]]:
    """Every (prefill TP, decode TP, KV heads) with prefill TP a multiple of decode TP
    that both sides can load, equal TP included."""
    return [
        {"p_tp": p, "d_tp": d, "kv_heads": h}
        for h, p, d in product(KV_HEADS, TPS, TPS)
        if p >= d and p % d == 0 and _loadable(p, h) and _loadable(d, h)
    ]
