"""The migrating relay's tracker on its own (sans-IO): what the client gets of a decode's
stream and what the router keeps to continue it elsewhere. Events in vLLM's framing go
through as decode sent them (token ids cut out unless the client asked for them); the
ids, the prompt's ids and the finish are known exactly whatever the text holds and
however the stream is cut."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdctl.sdk.router.migrate import StreamTracker, tracker_for
from pdctl.sdk.sse import DONE, EventParser


def vllm_event(obj: dict[str, Any]) -> bytes:
    """An event as vLLM writes it (pydantic's compact JSON, non-ASCII unescaped)."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def choice(text: str, ids: list[int], finish: str | None = None, **more: Any) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
            "stop_reason": None, "token_ids": ids, **more}  # fmt: skip


def stream(texts: list[str], prompt: list[int], *, finish: bool = True) -> tuple[bytes, list[int]]:
    """A completions stream with ids (what the router asks decode for) and its ids."""
    out, ids = b"", []
    for k, text in enumerate(texts):
        tok = [1000 + k]
        ids += tok
        more = {"prompt_token_ids": prompt} if k == 0 else {}
        last = finish and k == len(texts) - 1
        ch = choice(text, tok, "length" if last else None, **more)
        out += vllm_event({"id": "cmpl-1", "object": "text_completion", "created": 1,
                           "model": "m", "choices": [ch], "usage": None})  # fmt: skip
    if finish:
        out += b"data: [DONE]\n\n"
    return out, ids


def fed(tr: StreamTracker, wire: bytes, cuts: list[int]) -> bytes:
    points = sorted({c % (len(wire) + 1) for c in cuts})
    return b"".join(
        tr.feed(wire[a:b]) for a, b in zip([0, *points], [*points, len(wire)], strict=True)
    )


TRICKY = [
    ' ,"token_ids":[7]',
    "error",
    '"finish_reason":"stop"',
    "data: [DONE]",
    "\n\ndata: x",
    "a\u2028b\u0085",
    "prompt_token_ids",
    "\\",
    "",
]


@given(
    texts=st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=6)), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=5_000), max_size=12),
    wants_ids=st.booleans(),
    finish=st.booleans(),
)
def test_client_gets_the_stream_and_the_router_knows_its_ids(
    texts: list[str], cuts: list[int], wants_ids: bool, finish: bool
):
    texts = texts or [" only"]
    wire, ids = stream(texts, [1, 2, 3], finish=finish)
    tr = StreamTracker(chat=False, client_wants_ids=wants_ids)
    out = fed(tr, wire, cuts)
    events = EventParser().feed(out)
    assert events[-1].data == DONE if finish else events[-1].data != DONE
    chunks = [json.loads(e.data) for e in events if e.data != DONE]
    assert [c["choices"][0]["text"] for c in chunks] == texts
    assert all(("token_ids" in c["choices"][0]) == wants_ids for c in chunks)
    if wants_ids:
        assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == ids
    assert tr.sent_ids == ids
    assert tr.prompt_ids == [1, 2, 3]
    assert (tr.finished, tr.done, tr.events) == (finish, finish, len(texts))
    assert tr.failure is None
    assert tr.can_continue() is not finish


def test_events_in_vllms_framing_go_through_as_they_came():
    wire, _ = stream([" a", " b", " c", " d"], [5], finish=False)
    tr = StreamTracker(chat=False, client_wants_ids=True)
    first_end = wire.index(b"\n\n") + 2
    tr.feed(wire[:first_end])  # the first event (the prompt's ids) is decoded
    assert tr.feed(wire[first_end:]) == wire[first_end:]  # the rest, byte for byte
    plain = StreamTracker(chat=False, client_wants_ids=False)
    plain.feed(wire[:first_end])
    out = plain.feed(wire[first_end:])
    assert out == wire[first_end:].replace(b',"token_ids":[1001]', b"").replace(
        b',"token_ids":[1002]', b""
    ).replace(b',"token_ids":[1003]', b"")
    assert plain.sent_ids == [1000, 1001, 1002, 1003]


def test_an_error_event_in_a_plain_block_is_a_failure_and_not_forwarded():
    wire, _ = stream([" a", " b"], [5], finish=False)
    err = vllm_event({"error": {"message": "EngineCore encountered an issue", "code": 500}})
    tr = StreamTracker(chat=False, client_wants_ids=False)
    out = tr.feed(wire + err + b"data: [DONE]\n\n")
    assert b"EngineCore" not in out
    assert tr.failure is not None
    # what the failed decode sent after its error event (here its [DONE], in the same
    # chunk) is not relayed: the stream continues on another decode
    assert b"[DONE]" not in out
    assert not tr.done
    assert tr.sent_ids == [1000, 1001]
    cont = tr.continuation({"model": "m", "prompt": "x", "max_tokens": 5})
    assert cont is not None
    assert cont[1]["prompt"] == [5, 1000, 1001]
    assert cont[1]["max_tokens"] == 3


def test_a_stream_without_ids_goes_through_as_it_came():
    """One decode: the router did not ask for ids; only a stream with nothing sent could
    start again."""
    wire = b"".join(
        vllm_event({"id": "cmpl-9", "choices": [{"index": 0, "text": t, "finish_reason": None}]})
        for t in (" a", " b")
    )
    tr = StreamTracker(chat=False, client_wants_ids=False)
    assert tr.feed(wire) == wire
    assert tr.events == 2
    assert not tr.can_continue()
    assert tr.sent_ids == []


# ------------------------------------------------- what a continuation recomputes


def vllm_stream(
    tokens: list[tuple[int, str]],
    stop: list[str],
    *,
    prompt: list[int] | None,
    chat: bool = False,
    include: bool = False,
) -> list[bytes]:
    """Events as vLLM's detokenizer sends them (``vllm/v1/engine/detokenizer.py``): the
    last ``max(len(stop)) - 1`` characters held back until the answer finishes, a stop
    string found in the text cut off with everything after it (finish_reason stop);
    ``include`` (``include_stop_str_in_output``): nothing held back, the stop string
    kept."""
    hold = max(map(len, stop)) - 1 if stop and not include else 0
    out, text, sent = [], "", 0
    for k, (tok, piece) in enumerate(tokens):
        text += piece
        found = [(text.find(s), len(s)) for s in stop if s in text]
        finish = None
        if found:
            at, n = min(found)
            text, finish = text[: at + n if include else at], "stop"
        elif k == len(tokens) - 1:
            finish = "length"
        end = len(text) if finish else max(sent, len(text) - hold)
        piece_out, sent = text[sent:end], end
        ch: dict[str, Any] = {"index": 0, "finish_reason": finish, "token_ids": [tok]}
        if chat:
            ch["delta"] = {"content": piece_out}
        else:
            ch["text"] = piece_out
        if prompt is not None and k == 0 and not chat:
            ch["prompt_token_ids"] = prompt
        obj: dict[str, Any] = {"id": "cmpl-2", "choices": [ch]}
        if prompt is not None and k == 0 and chat:
            obj["prompt_token_ids"] = prompt
        out.append(vllm_event(obj))
        if finish:
            break
    return out


def texts_of(out: bytes) -> tuple[str, list[int], list[str | None]]:
    text, ids, finishes = "", list[int](), list[str | None]()
    for e in EventParser().feed(out):
        if e.data == DONE:
            continue
        for ch in json.loads(e.data)["choices"]:
            text += ch.get("text") or (ch.get("delta") or {}).get("content") or ""
            ids += ch.get("token_ids") or []
            finishes.append(ch.get("finish_reason"))
    return text, ids, finishes


ANSWER = [(1, " a"), (2, " b"), (3, " E"), (4, "N"), (5, "D"), (6, " c"), (7, " d")]


def test_a_stop_string_spanning_the_migration_point_is_found_once():
    """Decode dies with " E" and "N" sent as tokens but held back as text; the
    continuation computes them again (its prompt stops where the client's text is
    whole), skips what the client has, and finds "END" itself: the client's answer is
    one instance's, text and tokens."""
    body = {"model": "m", "prompt": "p", "max_tokens": 7, "stop": ["END"], "stream": True}
    alone = b"".join(vllm_stream(ANSWER, ["END"], prompt=[9]))
    tr = tracker_for("/v1/completions", {**body, "return_token_ids": True})
    got = b"".join(tr.feed(e) for e in vllm_stream(ANSWER, ["END"], prompt=[9])[:4])
    assert texts_of(got)[0] == " a b "  # "EN" held back
    cont = tr.continuation(body)
    assert cont is not None
    new = cont[1]
    assert new["prompt"] == [9, 1, 2]  # " E" and "N" computed again
    assert (new["max_tokens"], new["stop"]) == (5, ["END"])
    rest = vllm_stream(ANSWER[2:], ["END"], prompt=None)
    got += b"".join(tr.feed(e) for e in rest) + tr.feed(b"data: [DONE]\n\n")
    assert texts_of(got)[:2] == texts_of(alone)[:2] == (" a b ", [1, 2, 3, 4, 5])
    assert texts_of(got)[2][-1] == "stop"
    assert tr.finished
    assert tr.sent_ids == [1, 2, 3, 4, 5]


def test_a_stop_string_spanning_the_migration_point_is_found_once_when_it_is_sent_too():
    """``include_stop_str_in_output``: vLLM holds nothing back, so " E" and "N" reached
    the client; the continuation still computes them again (vLLM checks stop strings on
    the text it generates only) and finds "END" once."""
    body = {"model": "m", "prompt": "p", "max_tokens": 7, "stop": ["END"], "stream": True,
            "include_stop_str_in_output": True}  # fmt: skip
    events = vllm_stream(ANSWER, ["END"], prompt=[9], include=True)
    alone = texts_of(b"".join(events))
    assert alone[:2] == (" a b END", [1, 2, 3, 4, 5])
    tr = tracker_for("/v1/completions", {**body, "return_token_ids": True})
    got = b"".join(tr.feed(e) for e in events[:4])
    assert texts_of(got)[0] == " a b EN"
    cont = tr.continuation(body)
    assert cont is not None
    assert cont[1]["prompt"] == [9, 1, 2]
    rest = vllm_stream(ANSWER[2:], ["END"], prompt=None, include=True)
    got += b"".join(tr.feed(e) for e in rest)
    assert texts_of(got)[:2] == alone[:2]
    assert texts_of(got)[2][-1] == "stop"


def test_text_held_back_at_the_death_is_neither_lost_nor_sent_twice():
    body = {"model": "m", "prompt": "p", "max_tokens": 7, "stop": ["zzzz"], "stream": True}
    events = vllm_stream(ANSWER, ["zzzz"], prompt=[9])
    alone = texts_of(b"".join(events))
    tr = tracker_for("/v1/completions", {**body, "return_token_ids": True})
    got = b"".join(tr.feed(e) for e in events[:5])
    cont = tr.continuation(body)
    assert cont is not None
    recomputed = vllm_stream(ANSWER[len(cont[1]["prompt"]) - 1 :], ["zzzz"], prompt=None)
    got += b"".join(tr.feed(e) for e in recomputed)
    assert texts_of(got)[:2] == alone[:2] == (" a b END c d", [1, 2, 3, 4, 5, 6, 7])


def test_chat_logprobs_keep_chats_shape_after_a_migration():
    body = {"model": "m", "messages": [], "stream": True, "logprobs": True, "top_logprobs": 1}
    tr = tracker_for("/v1/chat/completions", {**body, "return_token_ids": True})
    tr.feed(b"".join(vllm_stream(ANSWER[:2], [], prompt=[9], chat=True)[:2]))
    cont = tr.continuation(body)
    assert cont is not None
    assert cont[1]["logprobs"] == 1  # completions' logprobs=k lists k+1 alternatives
    lp = {"tokens": [" E"], "token_logprobs": [-0.5], "top_logprobs": [{" E": -0.5, " F": -2.0}],
          "text_offset": [0]}  # fmt: skip
    ev = {"id": "cmpl-x", "object": "text_completion",
          "choices": [{"index": 0, "text": " E", "logprobs": lp, "token_ids": [3]}]}  # fmt: skip
    out = json.loads(tr.feed(vllm_event(ev)).removeprefix(b"data: "))
    assert out["object"] == "chat.completion.chunk"
    assert out["id"] == "cmpl-2"
    ch = out["choices"][0]
    assert ch["delta"] == {"content": " E"}
    assert ch["logprobs"] == {
        "content": [
            {"token": " E", "logprob": -0.5, "bytes": [32, 69],
             "top_logprobs": [{"token": " E", "logprob": -0.5, "bytes": [32, 69]}]}
        ]
    }  # fmt: skip
    plain = tracker_for("/v1/chat/completions", {**body, "top_logprobs": None})
    plain.prompt_ids = [9]
    assert plain.continuation({**body, "top_logprobs": None}) is not None
    assert plain.top_logprobs == 0


def test_usage_of_a_migrated_stream_counts_the_whole_answer():
    body = {"model": "m", "prompt": "p", "max_tokens": 7, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    tr = tracker_for("/v1/completions", {**body, "return_token_ids": True})
    tr.feed(b"".join(vllm_stream(ANSWER, [], prompt=[9, 8])[:3]))
    cont = tr.continuation(body)
    assert cont is not None
    assert cont[1]["stream_options"] == {"include_usage": True}
    usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    out = tr.feed(vllm_event({"id": "c", "choices": [], "usage": usage}))
    assert json.loads(out.removeprefix(b"data: "))["usage"] == {
        "prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}  # fmt: skip


def test_events_that_came_together_are_decoded_only_where_one_alone_would_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relay that fell behind gets several events in one chunk: the plain ones still go
    through as they came, and only the finish (and [DONE]) is decoded, as when each came
    alone; the client gets the same bytes either way."""
    import json as json_module

    wire, ids = stream([" a", " b", " c", " d", " e"], [5])
    first = wire.index(b"\n\n") + 2
    alone = StreamTracker(chat=False, client_wants_ids=False)
    one_by_one = b"".join(alone.feed(e + b"\n\n") for e in wire.split(b"\n\n")[:-1])
    together = StreamTracker(chat=False, client_wants_ids=False)
    out = together.feed(wire[:first])
    decoded: list[Any] = []
    real = json_module.loads

    def counted(s: Any) -> Any:
        decoded.append(s)
        return real(s)

    monkeypatch.setattr(json_module, "loads", counted)
    out += together.feed(wire[first:])
    assert out == one_by_one
    assert together.sent_ids == alone.sent_ids == ids
    assert together.done
    assert together.finished
    assert len(decoded) == 1  # the finishing event; [DONE] is known without JSON
