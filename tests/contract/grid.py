"""The layouts the handshake grid asks vLLM about, and lint's verdict on each."""

from __future__ import annotations

from itertools import product
from typing import Any

from pdctl.sdk.lint.handshake import KvLayout, Side, handshake_refusal

MODELS: dict[str, dict[str, Any]] = {
    "2kv": {"kv_heads": 2, "mla": False},
    "4kv": {"kv_heads": 4, "mla": False},
    "8kv": {"kv_heads": 8, "mla": False},
    "mla": {"kv_heads": 8, "mla": True},
    "mamba-4kv": {"kv_heads": 4, "mla": False, "mamba": True},
}
TPS = range(1, 17)
BLOCK_TPS = (1, 2, 4, 8, 16)
BLOCKS = (16, 32, 64, 128)
DCP_TPS = (4, 6, 8, 12)


def layouts() -> list[dict[str, Any]]:
    """TP 1..16 on both sides for every model and both modes (block size 128); block
    sizes 16..128 on both sides with power-of-two TPs; DCP sizes on MLA and GQA."""
    out: list[dict[str, Any]] = []
    for mode, model, p, d in product(("push", "pull"), MODELS, TPS, TPS):
        out.append({"mode": mode, "model": model, "p_tp": p, "d_tp": d, "p_bs": 128, "d_bs": 128})
    for mode, model, p, d, pb, db in product(
        ("push", "pull"), MODELS, BLOCK_TPS, BLOCK_TPS, BLOCKS, BLOCKS
    ):
        if pb != db:
            out.append({"mode": mode, "model": model, "p_tp": p, "d_tp": d, "p_bs": pb, "d_bs": db})
    for mode, model, tp in product(("push", "pull"), ("8kv", "mla"), DCP_TPS):
        sizes = [s for s in range(1, tp + 1) if tp % s == 0]
        for pd, dd in product(sizes, sizes):
            if (pd, dd) != (1, 1):
                out.append(
                    {
                        "mode": mode,
                        "model": model,
                        "p_tp": tp,
                        "d_tp": tp,
                        "p_bs": 128,
                        "d_bs": 128,
                        "p_dcp": pd,
                        "d_dcp": dd,
                    }
                )
    for lay in out:
        lay.update(MODELS[lay["model"]])
    return out


def lint_layout(lay: dict[str, Any]) -> KvLayout:
    return KvLayout(
        lay["mode"],
        Side(lay["p_tp"], lay["p_bs"], lay.get("p_dcp", 1)),
        Side(lay["d_tp"], lay["d_bs"], lay.get("d_dcp", 1)),
        kv_heads=lay["kv_heads"],
        mla=lay["mla"],
        mamba=lay.get("mamba", False),
    )


def vllm_code(answer: dict[str, Any]) -> str | None:
    """The lint code for what vLLM raised: TP (PD005), block size (PD007), DCP (PD044)."""
    if answer["ok"]:
        return None
    text = f"{answer['error']} {answer['at']}"
    if "DCP" in text or "dcp" in answer["at"]:
        return "PD044"
    if "block size" in text.lower() or "block_size" in text:
        return "PD007"
    if "tensor parallel" in text or "tp_ratio" in text:
        return "PD005"
    return f"unclassified: {text}"


def lint_code(lay: dict[str, Any]) -> str | None:
    refusal = handshake_refusal(lint_layout(lay))
    return None if refusal is None else refusal.code
