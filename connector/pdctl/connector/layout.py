"""Would the prefill refuse this decode? vLLM's handshake check, asked from decode's side.

In push mode the prefill (producer) validates each decode (consumer) when it handshakes
to WRITE: ``_validate_remote_agent_handshake`` in vLLM's ``nixl/base_worker.py`` asserts,
for a model that is neither MLA nor Mamba, ``not (tp_ratio < 0 and is_kv_replicated)``
on the prefill's ``TransferTopology`` (``kv_connector/utils.py``): a decode with a
larger TP whose KV heads are replicated (TP above the model's KV heads) is refused, and
``tp_ratio`` asserts that the TP sizes divide. The assertion carries no message and
decode never hears of it.

:func:`refusal` builds the prefill's topology from decode's own (same model, the
prefill's TP) with vLLM's class, registers decode on it and evaluates the same
expression, so it follows vLLM wherever those two methods go. It answers the reason in
words, or None when the prefill will accept.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.utils import EngineTransferInfo

_log = logging.getLogger("vllm.pdctl.connector")
_DECODE = "pdctl-layout-check-decode"
_PREFILL = "pdctl-layout-check-prefill"


def refusal(topo: Any, *, prefill_tp: int, decode_tp: int, has_mamba: bool) -> str | None:
    """Why a prefill at ``prefill_tp`` will refuse this decode (``topo``: decode's own
    ``TransferTopology``), or None. Never raises: a topology this vLLM cannot build here
    is left to the prefill's own check."""
    try:
        if topo is None or topo.is_mla or has_mamba:
            return None  # vLLM exempts MLA (KV not split by heads) and Mamba models
        heads = int(topo.total_num_kv_heads)
        layout = f"prefill TP{prefill_tp} → decode TP{decode_tp} with {heads} KV heads"
        producer = dataclasses.replace(topo, tp_rank=0, tp_size=prefill_tp, engine_id=_PREFILL)
        producer.register_remote_engine(
            _DECODE,
            EngineTransferInfo(
                remote_tp_size=decode_tp,
                remote_block_len=1,
                remote_block_size=int(topo.block_size),
                remote_physical_blocks_per_logical=1,
            ),
        )
        try:
            ratio = producer.tp_ratio(decode_tp)
        except AssertionError as e:
            return f"{layout}: {e}; use TP sizes that divide one another"
        if ratio < 0 and producer.is_kv_replicated(_DECODE):
            return (
                f"{layout}: vLLM's prefill refuses a decode with a larger TP that replicates "
                f"its KV heads (_validate_remote_agent_handshake); use decode TP ≤ {heads}, "
                f"or prefill TP ≥ decode TP"
            )
    except Exception:
        _log.debug("pdctl: the layout check could not run here", exc_info=True)
    return None
