"""The canary's logprob replays, as questions for vLLM: the bodies pdctl's
``ask_logprobs`` makes of client requests (completions and chat, by text and by token
id), each with the tokens a replay generated and the candidates the engine listed for
them, for vLLM's answer builders to turn into the answer a replay reads."""

from __future__ import annotations

from typing import Any

from pdctl.sdk.router.canary import replay_body
from pdctl.sdk.router.canaryverdict import ask_logprobs

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

Step = tuple[int, str, float, list[tuple[int, str, float]]]

STEPS: list[Step] = [
    # (sampled id, its text, its log-probability, the engine's candidates there in
    # rank order); non-ASCII text, so offsets are counted in characters
    (11, " The", -0.25, [(11, " The", -0.25), (12, " A", -1.75), (13, " This", -2.5)]),
    # a near-tie: " car" 0.003 nats below the sampled " café"
    (
        21,
        " café",
        -2.301,
        [(21, " café", -2.301), (22, " car", -2.304), (23, " dog", -2.6), (24, "→", -4.0)],
    ),
    (31, " sat", -0.5, [(31, " sat", -0.5), (30, " sits", -0.9)]),
    # sampled below the top candidate (not greedy): the engine lists it first anyway
    (41, ".", -1.2, [(42, "!", -0.4), (41, ".", -1.2), (43, " 🐈", -1.9)]),
]
TEXT = "".join(tok for _, tok, _, _ in STEPS)
IDS = [i for i, _, _, _ in STEPS]
NEAR_TIE = 1
"""The position where the answer may take ``STEPS[1]``'s second candidate."""

CLIENT_BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "completions": (COMPLETIONS, {"model": "m", "prompt": "Say", "max_tokens": 4}),
    "completions-asking-9": (
        COMPLETIONS,
        {"model": "m", "prompt": "Say", "max_tokens": 4, "logprobs": 9, "temperature": 0},
    ),
    "chat": (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "Say"}], "max_tokens": 4},
    ),
    "chat-asking-8": (
        CHAT,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Say"}],
            "max_tokens": 4,
            "logprobs": True,
            "top_logprobs": 8,
            "stream": True,
        },
    ),
}
REFUSED = {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 5}
"""A body vLLM refuses (``top_logprobs`` without ``logprobs``): the canary that a
refusal comes back as one."""


def engine_logprobs() -> list[list[tuple[int, str, float, int]]]:
    """Each position's ``{id: Logprob}`` entries in the engine's order: the sampled
    token first, then the candidates by rank (a dict: the sampled one listed once)."""
    out = []
    for sampled, tok, lp, cands in STEPS:
        rank = {i: r for r, (i, _, _) in enumerate(cands, 1)}
        entries = [(sampled, tok, lp, rank[sampled])]
        entries += [(i, t, c, rank[i]) for i, t, c in cands if i != sampled]
        out.append(entries)
    return out


def cases() -> list[dict[str, Any]]:
    """Every body the canary sends on a not-comparable pair, with a replay's output."""
    out: list[dict[str, Any]] = []
    output = {"text": TEXT, "token_ids": IDS, "logprobs": engine_logprobs()}
    for label, (endpoint, client) in CLIENT_BODIES.items():
        for by_id in (False, True):
            body = dict(client, return_token_ids=True) if by_id else client
            body = ask_logprobs(endpoint, replay_body(body, "pdctl-canary-x"), by_id=by_id)
            out.append(
                {
                    "label": f"{label}{'-by-id' if by_id else ''}",
                    "endpoint": endpoint,
                    "by_id": by_id,
                    "client": client,
                    "body": body,
                    "output": output,
                }
            )
    out.append({"label": "refused", "endpoint": CHAT, "by_id": False, "body": REFUSED})
    return out
