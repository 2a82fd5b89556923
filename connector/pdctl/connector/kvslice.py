"""Where a prefill rank's WRITE lands in a decode's block when prefill TP > decode TP.

With ``P_TP = k x D_TP`` each decode rank ``d`` holds the KV heads of ``k`` prefill ranks
(``d·k … d·k+k-1``). vLLM's push worker writes each of them its *whole* block into one
head slice of the decode's block:

* ``compute_tp_mapping`` (``kv_connector/v1/nixl/tp_mapping.py``), run by the prefill
  with its own TP as the local side, names one destination rank per prefill rank
  (``all_source_ranks == (r · D_TP // P_TP,)``) and a ``rank_offset_factor`` of
  ``r % k`` (vLLM 0.33 moved the rule into ``compute_head_offset`` there);
* ``_build_fa_remote`` (``kv_connector/v1/nixl/base_worker.py``) places the destination
  descriptor of every decode block at ``rank_offset_factor x block length`` (the
  prefill's block length per layer) from the block's start, ``block length`` bytes long;
* ``_xfer_blocks_for_req`` (``nixl/push_worker.py``) posts one WRITE per prefill rank,
  and the decode counts ``P_TP // D_TP`` completion notifications
  (``_get_new_notifs`` there, ``producers_per_consumer``) before the receive is done.

A decode block is therefore ``k`` equal runs of bytes, run ``j`` written by the prefill
rank with ``r % k == j``; on a head-major page (vLLM's ``LBHNC`` layout, the CPU
backend's only one: ``cpu_attn.py``, ``supported_kv_cache_layouts``) run ``j`` is
exactly the decode's KV heads ``j·H/P_TP …``. This module states that arithmetic for
the digest check (:mod:`pdctl.connector.kvverify`); the contract tier
(``tests/contract/test_kv_slices.py``) asks vLLM's own ``compute_tp_mapping`` and
``_build_fa_remote`` for many layouts and compares.

Covered: ``P_TP > D_TP``, ``P_TP % D_TP == 0``, ``P_TP ≤`` the model's KV heads (each
prefill rank owns heads no other rank has). Not covered: a prefill whose TP exceeds the
KV heads (vLLM then has several prefill ranks write the same replicated head into the
same slice: ``rank_offset_factor = local_head - p_start``), MLA (every prefill rank
writes the whole latent block at offset 0), decode TP > prefill TP (one prefill rank
writes each decode rank a part of its block).

Pure Python; no torch, no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadSlice:
    """One prefill rank's place in the decode: the decode rank it writes, and which of the
    ``parts`` equal runs of every destination block (``index``) it fills."""

    dst_rank: int
    index: int
    parts: int


def head_slice(p_rank: int, p_tp: int, d_tp: int, kv_heads: int) -> HeadSlice | None:
    """Where prefill rank ``p_rank`` (of ``p_tp``) writes in a decode at ``d_tp`` for a
    model with ``kv_heads`` KV heads; None for a layout this module does not cover
    (see the module). Equal TP is one part: the whole block."""
    if not (0 <= p_rank < p_tp and d_tp >= 1 and kv_heads >= 1):
        return None
    if p_tp == d_tp:
        return HeadSlice(dst_rank=p_rank, index=0, parts=1)
    if p_tp < d_tp or p_tp % d_tp or p_tp > kv_heads or kv_heads % p_tp:
        return None
    k = p_tp // d_tp
    # decode rank d holds heads [d·H/D_TP, (d+1)·H/D_TP); prefill rank r holds
    # [r·H/P_TP, (r+1)·H/P_TP), which is the (r mod k)-th run of H/P_TP heads of d = r // k
    return HeadSlice(dst_rank=p_rank // k, index=p_rank % k, parts=k)


def covered(p_tp: int, d_tp: int, kv_heads: int) -> bool:
    """Whether every rank of a prefill at ``p_tp`` has a :func:`head_slice` in a decode at
    ``d_tp``."""
    return all(head_slice(r, p_tp, d_tp, kv_heads) is not None for r in range(max(p_tp, 0)))


def run(page_elems: int, index: int, parts: int) -> tuple[int, int]:
    """``[start, stop)`` of run ``index`` of ``parts`` in a page of ``page_elems``
    elements (the prefill rank's whole page lands there)."""
    if parts < 1 or not 0 <= index < parts or page_elems % parts:
        raise ValueError(f"a page of {page_elems} elements has no run {index} of {parts}")
    size = page_elems // parts
    return index * size, (index + 1) * size
