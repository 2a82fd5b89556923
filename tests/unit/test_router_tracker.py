"""The migrating relay's tracker on its own (sans-IO): what the client gets of a decode's
stream and what the router keeps to continue it elsewhere. Events in vLLM's framing go
through as decode sent them (token ids cut out unless the client asked for them); the
ids, the prompt's ids and the finish are known exactly whatever the text holds and
however the stream is cut."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pdctl.sdk.router.migrate import StreamTracker
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
