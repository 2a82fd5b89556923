"""What pdctl needs to know about a model, read from its ``config.json``.

Only local directories (or a ``config.json`` path) are read; a hub name yields ``None``
and callers say they could not check rather than guess.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_vl"})


@dataclass(frozen=True)
class ModelInfo:
    config_path: Path
    model_type: str
    is_mla: bool
    num_layers: int | None
    num_attention_heads: int | None
    num_kv_heads: int | None
    raw: dict[str, Any]
    has_mamba: bool = False
    """State-space (Mamba-style) layers beside attention: vLLM exempts these models from
    the replicated-KV handshake check."""


class ModelInfoError(ValueError):
    """config.json exists but cannot be parsed."""


def config_path_for(model: str) -> Path | None:
    """The config.json a model reference points at, if it is local and exists."""
    p = Path(os.path.expanduser(model))
    if p.is_file() and p.name.endswith(".json"):
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    return None


def looks_like_local_path(model: str) -> bool:
    """True for references that can only mean a local directory (``/x``, ``./x``, ``~/x``)."""
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly multimodal) config."""
    for key in ("text_config", "language_config", "llm_config"):
        inner = cfg.get(key)
        if isinstance(inner, dict):
            merged = dict(inner)
            merged.setdefault("model_type", cfg.get("model_type", ""))
            return merged
    return cfg


def read_model_info(model: str) -> ModelInfo | None:
    path = config_path_for(model)
    if path is None:
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelInfoError(f"{path}: cannot parse config.json: {e}") from None
    if not isinstance(raw, dict):
        raise ModelInfoError(f"{path}: config.json is not a JSON object")
    cfg = text_config(raw)
    model_type = str(cfg.get("model_type") or raw.get("model_type") or "")
    is_mla = bool(cfg.get("kv_lora_rank")) or model_type in _MLA_MODEL_TYPES
    heads = _int(cfg.get("num_attention_heads"))
    kv_heads = _int(cfg.get("num_key_value_heads")) or heads
    return ModelInfo(
        config_path=path,
        model_type=model_type,
        is_mla=is_mla,
        num_layers=_int(cfg.get("num_hidden_layers")),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        raw=raw,
        has_mamba=_has_mamba(cfg, model_type),
    )


_SSM_LAYER_WORDS = ("mamba", "linear_attention", "ssm")


def _has_mamba(cfg: dict[str, Any], model_type: str) -> bool:
    """Hybrid attention/SSM models as their configs mark them: Mamba parameters
    (``mamba_*``, ``ssm_state_size``), per-layer kinds naming SSM or linear attention
    (``layer_types``, ``layers_block_type``), or a model type naming Mamba."""
    if "mamba" in model_type or any(k.startswith("mamba_") for k in cfg):
        return True
    if "ssm_state_size" in cfg or "hybrid_override_pattern" in cfg:
        return True
    for key in ("layer_types", "layers_block_type"):
        kinds = cfg.get(key)
        if isinstance(kinds, list) and any(
            isinstance(k, str) and any(w in k.lower() for w in _SSM_LAYER_WORDS) for k in kinds
        ):
            return True
    return False


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
