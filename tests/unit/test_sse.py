"""The SSE parser against the HTML standard's event-stream rules: lines end at CR, LF or
CRLF only (never at U+2028, U+2029 or U+0085), whatever the chunking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdctl.sdk.sse import DONE, Event, EventFramer, EventParser, LineDecoder, encode_event

SPLITTERS = "\u2028\u2029\u0085"
"""Where ``str.splitlines()`` (and httpx's line iterators) end a line and SSE does not."""

EOLS = ("\n", "\r", "\r\n")

# line text: anything but CR and LF, with the three characters drawn often
line_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(SPLITTERS + "\x0b\x0c\x1c\ufeff:é€😀 "),
        st.characters(blacklist_characters="\r\n", codec="utf-8"),
    ),
    max_size=12,
)
event_strategy = st.builds(
    lambda lines, kind: (lines, kind),
    st.lists(line_text, min_size=1, max_size=4),
    st.one_of(st.none(), st.text(alphabet="abcxyz_", min_size=1, max_size=6)),
)


def join_lines(lines: list[str], eols: list[str]) -> str:
    """``lines`` with the line ends in turn; an empty line after a CR never ends in a bare
    LF (CR + LF would be one line end, CRLF, and the empty line would vanish)."""
    out, prev = "", ""
    for i, line in enumerate(lines):
        end = eols[i % len(eols)]
        if not line and prev == "\r" and end == "\n":
            end = "\r\n"
        out += line + end
        prev = end
    return out


def event_lines(events: list[tuple[list[str], str | None]], comments: bool) -> list[str]:
    """The lines that send ``events`` (each a comment first, with ``comments``)."""
    out: list[str] = []
    for lines, kind in events:
        if comments:
            out.append(": keep-alive")
        if kind is not None:
            out.append(f"event: {kind}")
        out += [f"data: {line}" for line in lines]
        out.append("")
    return out


def feed_in_pieces(parser: EventParser, wire: bytes, cuts: list[int]) -> list[Event]:
    out: list[Event] = []
    points = sorted({c % (len(wire) + 1) for c in cuts})
    for a, b in zip([0, *points], [*points, len(wire)], strict=True):
        out += parser.feed(wire[a:b])
    return out


@given(
    events=st.lists(event_strategy, max_size=6),
    eols=st.lists(st.sampled_from(EOLS), min_size=1, max_size=7),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    comments=st.booleans(),
)
def test_any_chunking_and_line_endings_give_the_events_sent(
    events: list[tuple[list[str], str | None]], eols: list[str], cuts: list[int], comments: bool
):
    expected = [Event("\n".join(lines), kind or "message") for lines, kind in events]
    wire = join_lines(event_lines(events, comments), eols)
    got = feed_in_pieces(EventParser(), wire.encode(), cuts)
    assert got == expected


@given(
    lines=st.lists(line_text, max_size=8),
    eols=st.lists(st.sampled_from(EOLS), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_lines_end_at_cr_lf_and_crlf_only(lines: list[str], eols: list[str], cuts: list[int]):
    wire = join_lines(lines, eols).encode()
    dec = LineDecoder()
    points = sorted({c % (len(wire) + 1) for c in cuts})
    got: list[str] = []
    for a, b in zip([0, *points], [*points, len(wire)], strict=True):
        got += dec.feed(wire[a:b])
    first_bom = bool(lines) and lines[0].startswith("\ufeff")
    assert got == ([lines[0][1:], *lines[1:]] if first_bom else lines)


@given(
    st.builds(
        Event,
        st.lists(line_text, min_size=1, max_size=3).map("\n".join),
        st.text(alphabet="abc", min_size=1, max_size=4),
        st.text(alphabet="0123456789", max_size=3),
    )
)
def test_encoded_events_read_back_equal(event: Event):
    assert EventParser().feed(encode_event(event)) == [event]


def text_stream(texts: list[str]) -> bytes:
    """A vLLM-shaped stream of ``texts`` (non-ASCII left unescaped, as vLLM does)."""
    wire = b"".join(
        b"data: " + json.dumps({"choices": [{"text": t}]}, ensure_ascii=False).encode() + b"\n\n"
        for t in texts
    )
    return wire + b"data: [DONE]\n\n"


def test_vllm_shaped_events_keep_the_characters_splitlines_cuts_at():
    texts = ["a\u2028b", "c\u2029d", "e\u0085f", "plain"]
    wire = text_stream(texts)
    # the hazard is real: str.splitlines() cuts these events apart
    assert len(wire.decode().splitlines()) > 2 * len(texts) + 2
    events = EventParser().feed(wire)
    assert events[-1].data == DONE
    assert [json.loads(e.data)["choices"][0]["text"] for e in events[:-1]] == texts


def test_cr_at_the_end_of_one_chunk_and_lf_at_the_start_of_the_next_is_one_line_end():
    p = EventParser()
    assert p.feed(b"data: x\r") == []
    assert p.feed(b"\n") == []  # the LF completes the CRLF: not a blank line
    assert p.feed(b"\r\n") == [Event("x")]


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (b"data:x\n\n", [Event("x")]),  # no space after the colon
        (b"data:  x\n\n", [Event(" x")]),  # only one space is dropped
        (b"data\n\n", [Event("")]),  # a field name alone: an empty value
        (b"data: a\ndata: b\n\n", [Event("a\nb")]),
        (b"event: ping\n\n", []),  # no data: nothing dispatched
        (b"\n\n\n", []),
        (b"data: x\n", []),  # not closed by a blank line
        (b": comment\ndata: y\n\n", [Event("y")]),
        (b"id: 7\ndata: a\n\ndata: b\n\n", [Event("a", id="7"), Event("b", id="7")]),
        (b"id: 1\x002\ndata: a\n\n", [Event("a")]),  # an id with NUL is ignored
        (b"event: e\ndata: a\n\ndata: b\n\n", [Event("a", "e"), Event("b")]),
        (b"\xef\xbb\xbfdata: bom\n\n", [Event("bom")]),
        (b"data: \xff\n\n", [Event("\ufffd")]),
        (b"foo: bar\ndata: z\n\n", [Event("z")]),
    ],
)
def test_the_standards_field_rules(wire: bytes, expected: list[Event]):
    assert EventParser().feed(wire) == expected


def test_retry_takes_ascii_digits_only():
    p = EventParser()
    p.feed(b"retry: 1500\n\n")
    assert p.retry_ms == 1500
    p.feed(b"retry: 15s\nretry: \xd9\xa3\n\n")  # letters; an Arabic-Indic digit
    assert p.retry_ms == 1500


def test_nothing_reads_a_stream_with_httpx_line_iterators():
    """Every event stream pdctl reads, in its code, benchmarks and tests, goes through
    :class:`EventParser` (``tests/streams.py`` in tests): httpx's ``iter_lines`` cuts
    lines at U+2028/U+0085 too. The one exception shows the old way losing text."""
    from tests.conftest import REPO

    allowed = {"tests/unit/test_client.py": 1, "tests/unit/test_sse.py": 2}  # and this test
    found: dict[str, int] = {}
    for top in ("sdk", "tui", "connector", "tests", "benchmarks", "scripts"):
        for path in (REPO / top).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            n = text.count(".iter_lines(") + text.count(".aiter_lines(")
            if n:
                found[str(path.relative_to(REPO))] = n
    assert {k: v for k, v in found.items() if allowed.get(k) != v} == {}


# ---------------------------------------------------------------------- the framer


def framed(wire: bytes, cuts: list[int]) -> tuple[list[Event], int, bytes]:
    """What a relay gets from :class:`EventFramer` over ``wire`` cut at ``cuts``: the
    events (plain blocks read back by a parser of their own), the count, and the plain
    blocks' bytes."""
    framer, counter = EventFramer(), EventFramer()
    events: list[Event] = []
    plain_bytes, n = b"", 0
    points = sorted({c % (len(wire) + 1) for c in cuts})
    for a, b in zip([0, *points], [*points, len(wire)], strict=True):
        n += counter.count(wire[a:b])
        raw, k = framer.feed(wire[a:b])
        if k >= 0:
            plain_bytes += raw
            events += EventParser().feed(raw)
        elif raw:
            events += framer.events(raw)
    return events, n, plain_bytes


@given(
    events=st.lists(event_strategy, max_size=6),
    eols=st.lists(st.sampled_from(["\n"] * 4 + list(EOLS)), min_size=1, max_size=7),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    comments=st.booleans(),
    done=st.booleans(),
    bom=st.booleans(),
)
def test_framer_gives_the_parsers_events_however_framed_and_cut(
    events: list[tuple[list[str], str | None]],
    eols: list[str],
    cuts: list[int],
    comments: bool,
    done: bool,
    bom: bool,
):
    lines_sent = event_lines(events, comments)
    if done:
        lines_sent += ["data: [DONE]", ""]
    wire = ("\ufeff" if bom else "") + join_lines(lines_sent, eols)
    expected = EventParser().feed(wire.encode())
    got, n, _ = framed(wire.encode(), cuts)
    assert got == expected
    assert n == sum(e.data != DONE for e in expected)


def test_vllm_framing_is_plain_and_forwarded_as_it_came():
    texts = ["data: [DONE]", "a\u2028b", "x\\n\\ndata: y", '"}\n\n']
    wire = text_stream(texts)
    got, n, plain = framed(wire, [7, 30, 31, 95])
    assert plain == wire  # every byte forwarded untouched
    assert n == len(texts)  # text that looks like framing is not counted
    assert [json.loads(e.data)["choices"][0]["text"] for e in got[:-1]] == texts


@pytest.mark.parametrize(
    "wire",
    [
        b"data: a\r\n\r\ndata: b\r\n\r\n",
        b": ping\n\ndata: a\n\n",
        b"data: a\ndata: b\n\n",
        b"data: a\n\n\n\ndata: b\n\n",
        b"event: e\ndata: a\n\n",
        b"\xef\xbb\xbfdata: a\n\n",
    ],
)
def test_framer_hands_whatever_else_to_the_parser(wire: bytes):
    framer = EventFramer()
    raw, n = framer.feed(wire)
    assert n < 0
    assert framer.events(raw) == EventParser().feed(wire)


def test_a_lead_keeps_other_events_for_the_parser():
    framer = EventFramer(b'data: {"id"')
    assert framer.feed(b'data: {"id": 1}\n\ndata: {"id": 2}\n\n')[1] == 2
    raw, n = framer.feed(b'data: {"id": 3}\n\ndata: {"error": {}}\n\n')
    assert n < 0
    assert [e.data for e in framer.events(raw)] == ['{"id": 3}', '{"error": {}}']
