"""Lint's handshake rules agree with vLLM's own handshake check, case by case, on both
vLLM versions: TP 1..16 on both sides for models with 2, 4 and 8 KV heads, MLA and a
Mamba hybrid, in push and pull; block sizes; DCP sizes."""

from __future__ import annotations

from collections import Counter

from tests.contract.grid import lint_code, vllm_code


def test_lint_equals_vllm_on_every_layout(vllm):
    layouts = vllm["requests"]["handshake"]
    answers = vllm["answers"]["handshake"]
    assert len(answers) == len(layouts) > 5000
    wrong = []
    for lay, ans in zip(layouts, answers, strict=True):
        theirs, ours = vllm_code(ans), lint_code(lay)
        if theirs != ours:
            wrong.append(f"{lay}: vLLM {ans}, lint {ours}")
    assert not wrong, f"{len(wrong)} of {len(layouts)} differ, e.g.\n" + "\n".join(wrong[:10])


def test_the_grid_exercises_every_refusal(vllm):
    seen = Counter(vllm_code(a) for a in vllm["answers"]["handshake"])
    assert {None, "PD005", "PD007", "PD044"} <= set(seen), seen
    assert not [c for c in seen if c and c.startswith("unclassified")], seen


def test_the_issue_layouts(vllm):
    by_key = {
        (lay["mode"], lay["model"], lay["p_tp"], lay["d_tp"]): vllm_code(a)
        for lay, a in zip(vllm["requests"]["handshake"], vllm["answers"]["handshake"], strict=True)
        if lay["p_bs"] == lay["d_bs"] and lay.get("p_dcp", 1) == lay.get("d_dcp", 1) == 1
    }
    assert by_key["push", "8kv", 8, 16] == "PD005"  # the old k8s example
    assert by_key["push", "2kv", 1, 4] == "PD005"  # the CPU reproduction
    assert by_key["push", "8kv", 16, 8] is None  # producer TP > consumer TP works in push
    assert by_key["pull", "8kv", 16, 8] == "PD005"  # ... and not in pull past the KV heads
    assert by_key["push", "mla", 8, 16] is None  # MLA is exempt
    assert by_key["push", "mamba-4kv", 1, 8] is None  # so are Mamba hybrids
