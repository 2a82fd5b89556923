"""KV-cache bytes per token and per prompt from a model's ``config.json`` (pure).

* Standard / GQA: ``2 x layers x kv_heads x head_dim x dtype_bytes`` per token.
* MLA (``kv_lora_rank`` present): ``layers x (kv_lora_rank + qk_rope_head_dim) x
  dtype_bytes``: one latent, no x2, ``num_key_value_heads`` ignored.
* Sliding-window layers hold ``min(T, sliding_window)`` tokens.
* TP splits KV heads over ranks (a head is never split: with fewer KV heads than ranks,
  heads are replicated); MLA's latent is replicated on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pdctl.sdk.errors import PdctlError

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "int8": 1,
}


class ModelConfigError(PdctlError):
    """config.json lacks a field the KV size needs, or holds a value that cannot be used."""


@dataclass(frozen=True)
class KvLayout:
    kind: Literal["standard", "mla"]
    num_layers: int
    sliding_layers: int
    sliding_window: int | None
    layer_token_bytes: int
    """Bytes one token occupies in one layer (K+V of every KV head, or the MLA latent)."""
    kv_heads: int | None
    dtype: str
    dtype_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    @property
    def bytes_per_token(self) -> int:
        """Every layer at full length (the figure usually quoted)."""
        return self.layer_token_bytes * self.num_layers

    def bytes_for(self, tokens: int) -> int:
        """KV of one prompt of ``tokens`` tokens, all TP ranks together."""
        t = max(0, tokens)
        swa = min(t, self.sliding_window) if self.sliding_window else t
        return self.layer_token_bytes * (self.full_layers * t + self.sliding_layers * swa)

    def per_rank(self, tokens: int, tp: int) -> int:
        """Bytes one TP rank holds (and sends) for one prompt."""
        total = self.bytes_for(tokens)
        if self.kind == "mla" or tp <= 1:
            return total
        heads = self.kv_heads or 1
        return total * math.ceil(heads / tp) // heads


def resolve_dtype(kv_cache_dtype: str, model_dtype: str, cfg: dict[str, Any]) -> tuple[str, int]:
    """The dtype KV is stored in: ``kv_cache_dtype`` unless auto, else the model's dtype."""
    for candidate in (kv_cache_dtype, model_dtype, cfg.get("torch_dtype"), cfg.get("dtype")):
        if isinstance(candidate, str) and candidate and candidate != "auto":
            key = candidate.lower().removeprefix("torch.")
            if key not in DTYPE_BYTES:
                raise ModelConfigError(
                    f"unknown KV dtype {candidate!r}; use one of "
                    f"{', '.join(sorted(DTYPE_BYTES))} (--kv-dtype or model.kv_cache_dtype)"
                )
            return key, DTYPE_BYTES[key]
    return "bfloat16", 2


def kv_layout(cfg: dict[str, Any], dtype: str = "bfloat16") -> KvLayout:
    """KV shape of a text config (pass :func:`pdctl.sdk.modelinfo.text_config` output)."""
    key = dtype.lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ModelConfigError(f"unknown KV dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
    nbytes = DTYPE_BYTES[key]
    layers = _need_int(cfg, "num_hidden_layers")
    notes: list[str] = []
    sliding, window = _sliding(cfg, layers, notes)
    if _pos_int(cfg.get("kv_lora_rank")):
        rank = _need_int(cfg, "kv_lora_rank")
        rope = _need_int(cfg, "qk_rope_head_dim")
        kv_heads = _pos_int(cfg.get("num_key_value_heads"))
        naive_dim = _pos_int(cfg.get("v_head_dim")) or _pos_int(cfg.get("qk_nope_head_dim"))
        if kv_heads:
            ratio = f"{2 * kv_heads * naive_dim / (rank + rope):.0f}x " if naive_dim else ""
            notes.append(
                f"MLA: num_key_value_heads={kv_heads} ignored (the GQA formula would be "
                f"{ratio}too big)"
            )
        per = (rank + rope) * nbytes
        return KvLayout("mla", layers, sliding, window, per, None, key, nbytes, tuple(notes))
    heads = _pos_int(cfg.get("num_key_value_heads")) or _need_int(cfg, "num_attention_heads")
    per = 2 * heads * _head_dim(cfg) * nbytes
    return KvLayout("standard", layers, sliding, window, per, heads, key, nbytes, tuple(notes))


def _sliding(cfg: dict[str, Any], layers: int, notes: list[str]) -> tuple[int, int | None]:
    window = _pos_int(cfg.get("sliding_window"))
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(1 for t in types[:layers] if t == "sliding_attention")
        if n and not window:
            raise ModelConfigError(
                "config.json: layer_types has sliding_attention layers but no sliding_window; "
                "add the window size"
            )
        return n, window if n else None
    if not window or cfg.get("use_sliding_window") is False:
        return 0, None
    pattern = _pos_int(cfg.get("sliding_window_pattern"))
    if pattern and pattern > 1:
        return layers - layers // pattern, window
    notes.append(f"sliding_window={window} applies to every layer (no layer_types)")
    return layers, window


def _head_dim(cfg: dict[str, Any]) -> int:
    hd = _pos_int(cfg.get("head_dim"))
    if hd:
        return hd
    hidden = _need_int(cfg, "hidden_size")
    heads = _need_int(cfg, "num_attention_heads")
    if hidden % heads:
        raise ModelConfigError(
            f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads "
            f"{heads}; add head_dim"
        )
    return hidden // heads


def _pos_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _need_int(cfg: dict[str, Any], name: str) -> int:
    v = _pos_int(cfg.get(name))
    if v is None:
        raise ModelConfigError(
            f"config.json: {name} is missing or not a positive integer (got "
            f"{cfg.get(name)!r}); the KV size needs it — point --model at the model's own "
            "config.json"
        )
    return v


def active_params(cfg: dict[str, Any]) -> int | None:
    """Parameters one token passes through (MoE: routed top-k plus shared experts); None
    when the config lacks the sizes."""
    d, layers = _pos_int(cfg.get("hidden_size")), _pos_int(cfg.get("num_hidden_layers"))
    heads = _pos_int(cfg.get("num_attention_heads"))
    if not (d and layers and heads):
        return None
    hd = _pos_int(cfg.get("head_dim")) or d // heads
    kv = _pos_int(cfg.get("num_key_value_heads")) or heads
    attn = 2 * d * heads * hd + 2 * d * kv * hd
    inter = _pos_int(cfg.get("intermediate_size")) or 4 * d
    experts = next(
        (
            _pos_int(cfg.get(k))
            for k in ("n_routed_experts", "num_local_experts", "num_experts")
            if _pos_int(cfg.get(k))
        ),
        None,
    )
    top_k = _pos_int(cfg.get("num_experts_per_tok"))
    if experts and top_k:
        moe = _pos_int(cfg.get("moe_intermediate_size")) or inter
        shared = _pos_int(cfg.get("n_shared_experts")) or 0
        mlp = 3 * d * moe * (top_k + shared)
    else:
        mlp = 3 * d * inter
    vocab = _pos_int(cfg.get("vocab_size")) or 0
    return layers * (attn + mlp) + d * vocab


def prefill_flops(cfg: dict[str, Any], tokens: int) -> float | None:
    """≈ 2·N_active·T + 2·L·T²·d_model."""
    n = active_params(cfg)
    d, layers = _pos_int(cfg.get("hidden_size")), _pos_int(cfg.get("num_hidden_layers"))
    if n is None or not d or not layers:
        return None
    return 2.0 * n * tokens + 2.0 * layers * tokens * tokens * d
