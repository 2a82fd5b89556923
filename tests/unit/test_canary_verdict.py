"""The canary's verdict on a replay (router/canaryverdict.py): ids compared where both
answers carry them, text otherwise; on a pair whose sides do not compute alike
(heterogeneous TP) a first difference at a near-tie is ``tied``, anything else
``diverged``; on an equal-TP pair every difference is ``diverged``."""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk.router.canaryverdict import (
    TOP_LOGPROBS,
    Position,
    Verdict,
    ask_logprobs,
    judge,
    positions,
    token_ids,
)

WHY = "prefill TP2 → decode TP1"


def completion(tokens: list[tuple[str, float, dict[str, float]]], **extra: Any) -> dict[str, Any]:
    """A vLLM completions answer with ``logprobs`` (tokens, their log-probabilities and
    top candidates)."""
    return {
        "choices": [
            {
                "text": "".join(t for t, _, _ in tokens),
                "logprobs": {
                    "tokens": [t for t, _, _ in tokens],
                    "token_logprobs": [lp for _, lp, _ in tokens],
                    "top_logprobs": [top for _, _, top in tokens],
                    "text_offset": [0] * len(tokens),
                },
                **extra,
            }
        ]
    }


# the replay chose " cat" at token 1 by 0.003 nats over " car"
REPLAY = completion(
    [
        (" the", -1.0, {" the": -1.0, " a": -1.5}),
        (" cat", -2.301, {" cat": -2.301, " car": -2.304, " dog": -2.6}),
        (" sat", -0.5, {" sat": -0.5}),
    ]
)


def test_the_replays_tokens_and_candidates_are_read_with_their_text_offsets():
    ps = positions("/v1/completions", REPLAY)
    assert ps is not None
    assert [(p.start, p.token) for p in ps] == [(0, " the"), (4, " cat"), (8, " sat")]
    assert ps[1].top[" car"] == -2.304
    chat = {
        "choices": [
            {
                "message": {"content": "ab"},
                "logprobs": {
                    "content": [
                        {
                            "token": "a",
                            "logprob": -0.1,
                            "top_logprobs": [{"token": "a", "logprob": -0.1}],
                        },
                        {"token": "b", "logprob": -0.2, "top_logprobs": []},
                    ]
                },
            }
        ]
    }
    cps = positions("/v1/chat/completions", chat)
    assert cps == [Position(0, "a", -0.1, {"a": -0.1}), Position(1, "b", -0.2, {})]
    assert positions("/v1/completions", {"choices": [{"text": "x"}]}) is None  # no logprobs
    # tokens that do not spell the text (token_id:N, byte fallbacks): no offsets
    ids = completion([("token_id:7", -0.1, {"token_id:7": -0.1})])
    ids["choices"][0]["text"] = "x"
    assert positions("/v1/completions", ids) is None
    assert positions("/v1/completions", ids, spelled=False) is not None


def test_a_first_difference_at_a_near_tie_on_a_heterogeneous_pair_is_tied():
    v = judge(
        answer=" the car sat",
        replay=" the cat sat",
        replay_positions=positions("/v1/completions", REPLAY),
        comparable=False,
        tolerance=0.05,
        on="replay on decode-0",
        why=WHY,
    )
    assert v.result == "tied"
    assert "character 7" in v.detail  # the usual detail, then the near-tie
    assert "near-tie at token 1" in v.detail
    assert "' car'" in v.detail
    assert "0.0030 apart" in v.detail
    assert WHY in v.detail


@pytest.mark.parametrize(
    ("answer", "kw", "why"),
    [
        (" the car sat", {"comparable": True, "tolerance": 0.05}, "equal TP: always exact"),
        (" the car sat", {"comparable": False, "tolerance": 0.001}, "beyond the tolerance"),
        (" the dog sat", {"comparable": False, "tolerance": 0.05}, "0.299 apart"),
        (" the cow sat", {"comparable": False, "tolerance": 5.0}, "not a candidate there"),
        (" the", {"comparable": False, "tolerance": 5.0}, "the answer stopped early"),
    ],
)
def test_other_differences_diverge(answer: str, kw: dict[str, Any], why: str):
    ps = positions("/v1/completions", REPLAY)
    v = judge(answer=answer, replay=" the cat sat", replay_positions=ps, **kw)
    assert v.result == "diverged", why
    assert "differs from the answer at character" in v.detail


def test_without_the_replays_candidates_a_difference_diverges():
    v = judge(answer="b", replay="a", comparable=False, tolerance=1.0)
    assert v.result == "diverged"
    assert judge(answer="a", replay="a", comparable=False).result == "match"


def test_token_ids_are_compared_where_both_answers_carry_them():
    # same text, other ids (a different tokenization): ids decide
    v = judge(answer="ab", replay="ab", answer_ids=[1, 2], replay_ids=[3])
    assert v.result == "diverged"
    assert "token 0: id 1 (answer) vs 3 (replay)" in v.detail
    assert judge(answer="x", replay="y", answer_ids=[1, 2], replay_ids=[1, 2]).result == "match"
    by_id = [
        Position(0, "token_id:5", -1.0, {"token_id:5": -1.0}),
        Position(0, "token_id:8", -0.70, {"token_id:8": -0.70, "token_id:9": -0.72}),
    ]

    def by_ids(tolerance: float) -> Verdict:
        return judge(
            answer="",
            replay="",
            answer_ids=[5, 9],
            replay_ids=[5, 8],
            replay_positions=by_id,
            comparable=False,
            tolerance=tolerance,
            why=WHY,
        )

    tied = by_ids(0.05)
    assert tied.result == "tied"
    assert "'token_id:9'" in tied.detail
    assert by_ids(0.01).result == "diverged"
    assert token_ids({"choices": [{"token_ids": [1, 2]}]}) == [1, 2]
    assert token_ids({"choices": [{"text": "x"}]}) is None
    assert token_ids({"choices": [{"token_ids": ["1"]}]}) is None


def test_the_replay_asks_for_candidates_in_both_protocols():
    c = ask_logprobs("/v1/completions", {"logprobs": 2}, by_id=False)
    assert c == {"logprobs": TOP_LOGPROBS}
    assert ask_logprobs("/v1/completions", {"logprobs": 9}, by_id=False)["logprobs"] == 9
    chat = ask_logprobs("/v1/chat/completions", {}, by_id=True)
    assert chat == {
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "return_tokens_as_token_ids": True,
    }
