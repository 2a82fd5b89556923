"""decode's layout check agrees with vLLM's own handshake validation, case by case.

Each case builds the prefill's ``TransferTopology`` (vLLM's class), registers the decode
on it and calls vLLM's real ``_validate_remote_agent_handshake`` on a worker carrying
only the state its TP check reads; an ``AssertionError`` there is vLLM refusing the
decode (anything else is a later check this stand-in cannot feed: past the TP check).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'pdctl[cpu]')")

from vllm.distributed.kv_transfer.kv_connector.utils import (
    EngineTransferInfo,
    TransferTopology,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
    NixlBaseConnectorWorker,
)

from pdctl.connector.layout import refusal


def topo(tp: int, heads: int, engine: str, *, mla: bool = False) -> TransferTopology:
    return TransferTopology(
        tp_rank=0,
        tp_size=tp,
        block_size=16,
        engine_id=engine,
        is_mla=mla,
        is_mamba=False,
        total_num_kv_heads=1 if mla else heads,
        attn_backends=[],
    )


def vllm_refuses(prefill_tp: int, decode_tp: int, heads: int, *, mla: bool = False) -> bool:
    producer = topo(prefill_tp, heads, "p", mla=mla)
    producer.register_remote_engine(
        "d",
        EngineTransferInfo(
            remote_tp_size=decode_tp,
            remote_block_len=1,
            remote_block_size=16,
            remote_physical_blocks_per_logical=1,
        ),
    )
    worker: Any = SimpleNamespace(transfer_topo=producer, dcp_size=1, _has_mamba=False, use_mla=mla)
    meta: Any = SimpleNamespace(
        engine_id="d", block_size=16, physical_blocks_per_logical_kv_block=1
    )
    try:
        NixlBaseConnectorWorker._validate_remote_agent_handshake(worker, meta, decode_tp)
    except AssertionError:
        return True
    except Exception:
        return False  # a later check, past the TP one
    return False


GRID = list(itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 16), (1, 2, 4, 8)))


@pytest.mark.parametrize("mla", [False, True])
def test_decode_predicts_vllms_verdict_on_every_layout(mla: bool):
    disagree = []
    for p, d, heads in GRID:
        ours = refusal(topo(d, heads, "d", mla=mla), prefill_tp=p, decode_tp=d, has_mamba=False)
        if (ours is not None) != vllm_refuses(p, d, heads, mla=mla):
            disagree.append((p, d, heads, ours))
    assert disagree == []
    refused = [c for c in GRID if vllm_refuses(*c, mla=mla)]
    assert (refused != []) is (not mla)  # the grid has refused layouts (none with MLA)


def test_divisibility_is_refused_too_and_the_reason_names_the_layout():
    why = refusal(topo(4, 2, "d"), prefill_tp=1, decode_tp=4, has_mamba=False)
    assert why is not None
    assert why.startswith("prefill TP1 → decode TP4 with 2 KV heads")
    assert "decode TP ≤ 2" in why
    assert vllm_refuses(2, 3, 8)
    odd = refusal(topo(3, 8, "d"), prefill_tp=2, decode_tp=3, has_mamba=False)
    assert odd is not None
    assert "not divisible" in odd


def test_mamba_and_a_missing_topology_are_left_to_vllm():
    assert refusal(topo(4, 2, "d"), prefill_tp=1, decode_tp=4, has_mamba=True) is None
    assert refusal(None, prefill_tp=1, decode_tp=4, has_mamba=False) is None
