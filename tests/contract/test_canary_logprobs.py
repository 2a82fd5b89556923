"""The canary's logprob replays against vLLM's own code (router/canaryverdict.py).

On a heterogeneous-TP pair the canary asks the replay for its top log-probabilities
(``ask_logprobs``) and reads them back (``positions``, ``token_ids``, the
``token_id:<id>`` form of ``return_tokens_as_token_ids``). Asked of each vLLM:

* the bodies it sends validate in vLLM's request models: ``CompletionRequest``
  (``vllm/entrypoints/openai/completion/protocol.py``) and ``ChatCompletionRequest``
  (``vllm/entrypoints/openai/chat_completion/protocol.py``), with the logprob fields
  parsed to what the canary asked;
* the answers vLLM's server builds from a replay's tokens —
  ``OpenAIServingCompletion.request_output_to_completion_response`` and
  ``_create_completion_logprobs`` (``completion/serving.py``),
  ``OpenAIServingChat.chat_completion_full_generator`` and ``_create_chat_logprobs``
  (``chat_completion/serving.py``), ``format_token_id_placeholder``
  (``vllm/entrypoints/generate/base/serving.py``), from ``Logprob`` objects
  (``vllm/logprobs.py``) — parse to exactly the tokens, log-probabilities and candidates
  put in, and a near-tie in them is judged ``tied``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk.router.canary import answer_text
from pdctl.sdk.router.canaryverdict import (
    TOKEN_ID_PREFIX,
    Position,
    judge,
    positions,
    token_ids,
)
from tests.contract.logprobs import CHAT, IDS, NEAR_TIE, STEPS, TEXT

WHY = "prefill TP2 → decode TP1"


def _cases(vllm: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return list(zip(vllm["requests"]["logprobs"], vllm["answers"]["logprobs"], strict=True))


def _replays(vllm: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(c, a) for c, a in _cases(vllm) if c.get("output") is not None]


def _name(by_id: bool, token_id: int, text: str) -> str:
    return f"{TOKEN_ID_PREFIX}{token_id}" if by_id else text


def _expected(by_id: bool) -> list[Position]:
    """The positions put in: each sampled token, its log-probability and every
    candidate the engine listed there."""
    out, at = [], 0
    for sampled, tok, lp, cands in STEPS:
        name = _name(by_id, sampled, tok)
        out.append(Position(at, name, lp, {_name(by_id, i, t): c for i, t, c in cands}))
        at += len(name)
    return out


def test_every_logprob_body_validates(vllm):
    refused = []
    for case, ans in _cases(vllm):
        if case["label"] == "refused":
            continue
        if not ans["ok"]:
            refused.append(f"{case['label']}: {ans['error']}")
            continue
        body, parsed = case["body"], ans["parsed"]
        assert parsed["logprobs"] == body["logprobs"], case["label"]
        if case["endpoint"] == CHAT:
            assert parsed["logprobs"] is True
            assert parsed["top_logprobs"] == body["top_logprobs"] >= 5
        else:
            assert parsed["logprobs"] >= 5
        assert parsed["return_tokens_as_token_ids"] is (True if case["by_id"] else None)
        assert parsed["return_token_ids"] is (True if case["by_id"] else None)
    assert not refused, f"vLLM {vllm['version']} refuses the canary's bodies:\n" + "\n".join(
        refused
    )


def test_a_body_vllm_refuses_comes_back_refused(vllm):
    (ans,) = [a for c, a in _cases(vllm) if c["label"] == "refused"]
    assert not ans["ok"]
    assert "logprobs" in ans["error"]


def test_the_client_asked_for_more_candidates_keeps_them(vllm):
    by_label = {c["label"]: a["parsed"] for c, a in _cases(vllm) if a["ok"]}
    assert by_label["completions-asking-9"]["logprobs"] == 9
    assert by_label["chat-asking-8"]["top_logprobs"] == 8
    assert by_label["completions"]["logprobs"] == by_label["chat"]["top_logprobs"] == 5


@pytest.mark.parametrize("by_id", [False, True], ids=["by-text", "by-id"])
def test_positions_read_vllms_answers_exactly(vllm, by_id):
    replays = [(c, a) for c, a in _replays(vllm) if c["by_id"] is by_id]
    assert len(replays) == 4
    for case, ans in replays:
        answer, endpoint = ans["answer"], case["endpoint"]
        got = positions(endpoint, answer, spelled=not by_id)
        assert got == _expected(by_id), f"vLLM {vllm['version']}, {case['label']}"
        assert answer_text(endpoint, answer) == TEXT
        assert token_ids(answer) == (IDS if by_id else None)
        if endpoint != CHAT:  # pdctl counts offsets as vLLM does
            assert [p.start for p in got] == answer["choices"][0]["logprobs"]["text_offset"]


def test_the_token_id_form_is_vllms(vllm):
    for case, ans in _replays(vllm):
        if not case["by_id"]:
            continue
        lp = ans["answer"]["choices"][0]["logprobs"]
        written = [c["token"] for c in lp["content"]] if case["endpoint"] == CHAT else lp["tokens"]
        assert written == [f"{TOKEN_ID_PREFIX}{i}" for i in IDS], case["label"]


@pytest.mark.parametrize("by_id", [False, True], ids=["by-text", "by-id"])
def test_a_near_tie_in_vllms_answer_is_tied(vllm, by_id):
    """The answer took the candidate 0.003 nats below the replay's choice."""
    other_id, other, _ = STEPS[NEAR_TIE][3][1]
    answer_ids = [*IDS[:NEAR_TIE], other_id]
    answer = "".join(t for _, t, _, _ in STEPS[:NEAR_TIE]) + other
    for case, ans in _replays(vllm):
        if case["by_id"] is not by_id:
            continue
        got = ans["answer"]
        kw: dict[str, Any] = {
            "answer": answer,
            "replay": answer_text(case["endpoint"], got) or "",
            "answer_ids": answer_ids if by_id else None,
            "replay_ids": token_ids(got) if by_id else None,
            "replay_positions": positions(case["endpoint"], got, spelled=not by_id),
            "comparable": False,
            "why": WHY,
        }
        assert judge(**kw, tolerance=0.01).result == "tied", case["label"]
        assert judge(**kw, tolerance=0.001).result == "diverged", case["label"]
