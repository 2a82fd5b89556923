"""Server-sent events, read as the HTML standard defines them (sans-IO: bytes in, events out).

The one parser pdctl reads every event stream with (the SDK's client, the bench's load
generator, the router's relays). The rules are the standard's "event stream
interpretation" (html.spec.whatwg.org, section 9.2.6):

* a line ends at CRLF, LF or CR, and nowhere else. ``str.splitlines()`` and httpx's
  ``iter_lines()``/``aiter_lines()`` also end lines at U+2028, U+2029, U+0085 (and
  U+000B, U+000C, U+001C..U+001E), characters that vLLM leaves unescaped inside the JSON
  strings of its events and that real models emit: reading vLLM's streams with them
  cuts an event in two and loses its text;
* a blank line dispatches the event; ``data`` lines join with LF; ``:`` starts a comment;
  one space after the field's colon is dropped; ``id`` with a NUL is ignored; ``retry``
  only takes ASCII digits; unknown fields are ignored;
* an event not closed by a blank line when the stream ends is dropped;
* a leading byte order mark is skipped; bytes that are not UTF-8 become U+FFFD.

Splitting happens on bytes (CR and LF never occur inside a UTF-8 multi-byte sequence),
so a chunk boundary may fall anywhere, even inside a character or between CR and LF.

    parser = EventParser()
    for chunk in response.iter_bytes():
        for event in parser.feed(chunk):
            print(event.data)
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["DONE", "Event", "EventFramer", "EventParser", "LineDecoder", "encode_event"]

DONE = "[DONE]"
"""The data of the OpenAI-style stream's last event."""

_EOL = re.compile(rb"\r\n|\r|\n")
_EOL_TEXT = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff"


class LineDecoder:
    """Bytes in, complete lines out (without their CR, LF or CRLF)."""

    def __init__(self, *, at_start: bool = True) -> None:
        self._tail = b""
        self._after_cr = False
        """The last chunk ended with a CR: an LF starting the next one belongs to it."""
        self._first = at_start
        """No line was read yet: a byte order mark before the first is skipped."""

    def feed(self, data: bytes) -> list[str]:
        if not data:
            return []
        if self._after_cr:
            self._after_cr = False
            if data.startswith(b"\n"):
                data = data[1:]
        buf = self._tail + data
        if b"\r" in buf:
            parts = _EOL.split(buf)
            self._tail = parts.pop()
            self._after_cr = buf.endswith(b"\r")
            lines = [p.decode("utf-8", "replace") for p in parts]
        else:  # LF only (what vLLM sends): one split, one decode
            cut = buf.rfind(b"\n")
            if cut < 0:
                self._tail = buf
                return []
            self._tail = buf[cut + 1 :]
            lines = buf[:cut].decode("utf-8", "replace").split("\n")
        if lines and self._first:
            self._first = False
            lines[0] = lines[0].removeprefix(_BOM)
        return lines


class Event(NamedTuple):
    """One dispatched event."""

    data: str
    """The ``data`` lines, joined with LF."""
    event: str = "message"
    """The ``event`` field (``message`` when there was none)."""
    id: str = ""
    """The last event id seen so far in the stream."""


class EventParser:
    """Bytes in, complete events out; chunked however the network likes."""

    def __init__(self, *, at_start: bool = True) -> None:
        self._lines = LineDecoder(at_start=at_start)
        self._data: list[str] = []
        self._type = ""
        self._last_id = ""
        self.retry_ms: int | None = None
        """The last ``retry`` field: the server's reconnection time in milliseconds."""

    def feed(self, data: bytes) -> list[Event]:
        out: list[Event] = []
        lines = self._data
        for line in self._lines.feed(data):
            if line.startswith("data:"):  # the common case first, inline
                lines.append(line[6:] if line.startswith(" ", 5) else line[5:])
            elif line:
                self._field(line)
            elif lines:  # a blank line dispatches the event
                out.append(Event("\n".join(lines), self._type or "message", self._last_id))
                lines.clear()
                self._type = ""
            else:  # nothing to dispatch: the buffers start again
                self._type = ""
        return out

    def _field(self, line: str) -> None:
        """A line other than ``data`` or a blank one."""
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)


_PLAIN_DONE = b"data: [DONE]\n"


class EventFramer:
    """Cuts a raw event stream at its events' ends, for a relay that forwards events as
    they came without decoding each one (sans-IO, bytes in, bytes out).

    :meth:`feed` returns the whole events a chunk completes, as raw bytes, and how many
    there are when they are *plain*: framed as vLLM frames its streams (LF line ends,
    each event one data line starting with ``lead``, then a blank line), which a few
    byte scans tell. A relay can forward plain events as they are. What is not plain
    (CR or CRLF line ends, comments, other fields, several data lines, extra blank
    lines, a byte order mark, a data line not starting with ``lead``) goes to the
    standard's parser (:meth:`events`), which sees every byte that is not in a plain
    block, in order, so that the events it gives are exactly :class:`EventParser`'s for
    the whole stream. Bytes after the last event's end wait for the next chunk; a stream
    with a CR in it goes to the parser as it comes from then on (a CR may end a line
    anywhere)."""

    def __init__(self, lead: bytes = b"data:") -> None:
        self.lead = lead
        self._next = b"\n\n" + lead
        self._tail = b""
        self._parser: EventParser | None = None
        self._started = False
        """A plain block went by: the parser starts mid-stream (no byte order mark)."""
        self._cr = False

    def feed(self, chunk: bytes) -> tuple[bytes, int]:
        """``(raw, n)``: the bytes of the events ``chunk`` completes (empty: none yet),
        and how many events they are when plain; ``n < 0``: they are not, and must be
        given to :meth:`events` before the next :meth:`feed`."""
        if not self._tail and not self._cr and chunk.endswith(b"\n\n"):
            # the common case, one whole event (vLLM writes each in one piece)
            one = chunk.find(b"\n") == len(chunk) - 2 and b"\r" not in chunk
            if one and chunk.startswith(self.lead):
                self._started = True
                return chunk, 1
        buf = self._tail + chunk if self._tail else chunk
        if self._cr or b"\r" in buf:
            self._cr, self._tail = True, b""
            return buf, -1
        cut = buf.rfind(b"\n\n") + 2
        if cut < 2:
            self._tail = buf
            return b"", 0
        if cut == len(buf):
            self._tail, block = b"", buf
        else:
            self._tail, block = buf[cut:], buf[:cut]
        if not block.startswith(self.lead):
            return block, -1
        n = block.count(self._next) + 1
        if block.count(b"\n") != 2 * n:
            return block, -1
        self._started = True
        return block, n

    def pieces(self, raw: bytes) -> list[tuple[bytes, bool]] | None:
        """``raw`` (what :meth:`feed` gave) cut into its events, each with whether it is
        plain (one data line starting with ``lead``), for a caller that forwards the plain
        ones and gives the rest to :meth:`events`, in order; None where it cannot be cut
        without the parser (a stream with a CR in it)."""
        if self._cr:
            return None
        lead = self.lead
        out = [(p + b"\n\n", p.startswith(lead) and b"\n" not in p) for p in raw.split(b"\n\n")]
        out.pop()  # raw ends with an event's end: nothing after it
        if any(plain for _, plain in out):
            if self._parser is None:  # what it sees of these starts where the stream does
                self._parser = EventParser(at_start=not self._started)
            self._started = True
        return out

    def events(self, raw: bytes) -> list[Event]:
        """The events of bytes :meth:`feed` said are not plain (or of a plain block the
        caller wants decoded: that leaves the parser as it found it)."""
        if self._parser is None:
            self._parser = EventParser(at_start=not self._started)
        return self._parser.feed(raw)

    def count(self, chunk: bytes) -> int:
        """How many events ``chunk`` completes, the closing ``[DONE]`` not counted."""
        raw, n = self.feed(chunk)
        if n > 0 and _PLAIN_DONE.startswith(self.lead):
            return n - raw.startswith(_PLAIN_DONE) - raw.count(b"\n\n" + _PLAIN_DONE)
        if n >= 0:
            return n
        return sum(e.data != DONE for e in self.events(raw))


def encode_event(event: Event) -> bytes:
    """``event`` as it goes on the wire (what :class:`EventParser` reads back as equal;
    the id is written when it has one)."""
    head = "" if event.event == "message" else f"event: {event.event}\n"
    if event.id:
        head += f"id: {event.id}\n"
    body = "".join(f"data: {line}\n" for line in _EOL_TEXT.split(event.data))
    return (head + body + "\n").encode()
