"""KV bytes per token / prompt / TP rank against the published reference figures."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.modelinfo import text_config
from pdctl.sdk.preflight.kvsize import (
    ModelConfigError,
    active_params,
    kv_layout,
    prefill_flops,
    resolve_dtype,
)
from tests.conftest import FIXTURES

MODELS = FIXTURES / "models"


def _cfg(name: str):
    return text_config(json.loads((MODELS / name / "config.json").read_text()))


def test_qwen25_7b_worked_example():
    kv = kv_layout(_cfg("qwen2.5-7b"), "bfloat16")
    assert kv.kind == "standard"
    assert kv.bytes_per_token == 57_344
    assert kv.sliding_layers == 0  # sliding_window set but use_sliding_window false
    assert kv.bytes_for(8192) == 469_762_048  # 469.8 MB, the published ≈470 MB
    assert kv.per_rank(8192, 2) == 469_762_048 // 2
    assert kv.per_rank(8192, 8) == 469_762_048 // 4  # 4 KV heads: replicated beyond TP 4


def test_deepseek_v3_mla_ignores_kv_heads():
    kv = kv_layout(_cfg("deepseek-v3"), "bfloat16")
    assert kv.kind == "mla"
    assert kv.bytes_per_token == 70_272
    assert kv.per_rank(1000, 8) == kv.bytes_for(1000)  # latent replicated on every rank
    assert any("57x" in n for n in kv.notes)
    assert kv_layout(_cfg("deepseek-v3"), "fp8").bytes_per_token == 35_136


def test_gpt_oss_sliding_layers_capped_at_window():
    kv = kv_layout(_cfg("gpt-oss-120b"), "bfloat16")
    assert (kv.full_layers, kv.sliding_layers, kv.sliding_window) == (18, 18, 128)
    assert kv.layer_token_bytes * kv.full_layers == 36_864
    assert kv.bytes_for(8000) == 299_630_592  # ≈ 299.6 MB
    assert kv.bytes_for(100) == 100 * 73_728


def test_gemma3_nested_text_config_with_layer_types():
    cfg = _cfg("gemma-3-12b")
    assert cfg["hidden_size"] == 3840
    dtype, _nbytes = resolve_dtype("auto", "auto", {"torch_dtype": "bfloat16"})
    kv = kv_layout(cfg, dtype)
    assert (kv.full_layers, kv.sliding_layers) == (8, 40)
    assert kv.bytes_for(8192) == 8192 * (8 * 8192 + 40 * 1024)


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (
            {
                "num_hidden_layers": 64,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 128,
            },
            262_144,
        ),  # Qwen3-32B
        (
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
            },
            131_072,
        ),  # Llama-3.1-8B
        (
            {
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "hidden_size": 8192,
            },
            327_680,
        ),  # Llama-3.3-70B
        (
            {
                "num_hidden_layers": 48,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "head_dim": 128,
            },
            98_304,
        ),  # Qwen3-30B-A3B
        (
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
                "sliding_window": None,
            },
            131_072,
        ),  # Mixtral-8x7B
    ],
)
def test_reference_bytes_per_token(cfg, expected):
    assert kv_layout(cfg).bytes_per_token == expected


def test_sliding_window_pattern_and_every_layer_default():
    base = {"num_hidden_layers": 12, "num_attention_heads": 4, "head_dim": 8}
    kv = kv_layout({**base, "sliding_window": 16, "sliding_window_pattern": 6})
    assert (kv.full_layers, kv.sliding_layers) == (2, 10)
    every = kv_layout({**base, "sliding_window": 16})
    assert every.sliding_layers == 12
    assert every.notes


def test_dtype_resolution_order():
    assert resolve_dtype("fp8_e4m3", "bfloat16", {}) == ("fp8_e4m3", 1)
    assert resolve_dtype("auto", "float16", {"torch_dtype": "float32"}) == ("float16", 2)
    assert resolve_dtype("auto", "auto", {"dtype": "float32"}) == ("float32", 4)
    assert resolve_dtype("auto", "auto", {}) == ("bfloat16", 2)
    with pytest.raises(ModelConfigError, match="unknown KV dtype"):
        resolve_dtype("int3", "auto", {})


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({}, "num_hidden_layers"),
        ({"num_hidden_layers": 2}, "num_attention_heads"),
        ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 10}, "head_dim"),
        ({"num_hidden_layers": 2, "kv_lora_rank": 512}, "qk_rope_head_dim"),
        ({"num_hidden_layers": True, "num_attention_heads": 2}, "num_hidden_layers"),
        (
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "head_dim": 2,
                "layer_types": ["sliding_attention"] * 2,
            },
            "sliding_window",
        ),
    ],
)
def test_missing_fields_name_the_field(cfg, field):
    with pytest.raises(ModelConfigError, match=field) as e:
        kv_layout(cfg)
    assert isinstance(e.value, PdctlError)


def test_prefill_flops_qwen_7b_dense_size():
    n = active_params(_cfg("qwen2.5-7b"))
    assert n is not None
    assert 7.0e9 < n < 7.2e9
    f = prefill_flops(_cfg("qwen2.5-7b"), 8192)
    assert f is not None
    assert f > 2 * n * 8192
    moe = active_params(_cfg("deepseek-v3"))
    assert moe is not None
    assert 20e9 < moe < 60e9
    assert active_params({"num_hidden_layers": 2}) is None


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.text(max_size=5),
    st.floats(),
    st.lists(st.sampled_from(["sliding_attention", "full_attention", 3]), max_size=6),
)
_KEYS = st.sampled_from(
    [
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_size",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "sliding_window",
        "layer_types",
        "use_sliding_window",
        "sliding_window_pattern",
        "v_head_dim",
        "intermediate_size",
        "num_experts_per_tok",
        "n_routed_experts",
        "vocab_size",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=10), st.integers(0, 100_000))
def test_fuzz_configs_give_a_size_or_a_named_error(cfg, tokens):
    try:
        kv = kv_layout(cfg)
    except ModelConfigError as e:
        message = str(e)
        assert "config.json" in message
    else:
        assert kv.bytes_for(tokens) >= 0
        assert kv.bytes_for(tokens) <= kv.bytes_per_token * tokens
        assert kv.per_rank(tokens, 4) <= kv.bytes_for(tokens)
    active_params(cfg)
    prefill_flops(cfg, tokens)
