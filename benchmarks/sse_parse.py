"""SSE framing cost: pdctl.sdk.sse's parser (CR, LF, CRLF; the standard's field rules)
against the framing the router's migrating relay used before it (split at ``\\n\\n``, keep
``data:`` lines), on the same vLLM-shaped completion stream, in one run.

Measured per stream, as the router's relay meets it: the stream in network-sized chunks,
framed into events (no JSON decoding in either arm). Medians of ``--rounds`` rounds; each
round frames ``--streams`` streams of ``--events`` events.

    python benchmarks/sse_parse.py [--rounds 15] [--streams 200] [--events 128]
        [--chunk 1500] [--out sse_parse.json]

Prints µs per stream for both arms and the ratio parser / baseline, and writes a JSON
record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from pdctl.sdk.sse import EventParser


def vllm_stream(events: int) -> bytes:
    out = b""
    for i in range(events):
        choice = {"index": 0, "text": f" word{i}", "logprobs": None, "finish_reason": None}
        ev = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m"}
        ev["choices"] = [{**choice, "token_ids": [1000 + i]}]
        out += b"data: " + json.dumps(ev).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


def baseline(chunks: list[bytes]) -> int:
    """The relay's framing before pdctl.sdk.sse: LF LF only."""
    buf, n = b"", 0
    for chunk in chunks:
        buf += chunk
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            event, buf = buf[:end], buf[end + 2 :]
            data = b"\n".join(
                line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")
            )
            n += bool(data)
    return n


def parser(chunks: list[bytes]) -> int:
    p, n = EventParser(), 0
    for chunk in chunks:
        n += len(p.feed(chunk))
    return n


def round_us(arm: Callable[[list[bytes]], int], chunks: list[bytes], streams: int) -> float:
    t0 = time.perf_counter()
    for _ in range(streams):
        arm(chunks)
    return (time.perf_counter() - t0) / streams * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--events", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=1500, help="bytes per network read")
    ap.add_argument("--out", type=Path, default=Path("sse_parse.json"))
    a = ap.parse_args()
    wire = vllm_stream(a.events)
    chunks = [wire[i : i + a.chunk] for i in range(0, len(wire), a.chunk)]
    assert baseline(chunks) == parser(chunks) == a.events + 1
    rounds: dict[str, list[float]] = {"baseline": [], "parser": []}
    for _ in range(a.rounds):  # alternate the arms so drift hits both
        rounds["baseline"].append(round_us(baseline, chunks, a.streams))
        rounds["parser"].append(round_us(parser, chunks, a.streams))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    ratio = med["parser"] / med["baseline"]
    print(f"stream: {a.events} events, {len(wire)} bytes in {len(chunks)} chunks")
    print(f"baseline (LF LF split): {med['baseline']:.1f} µs/stream (median of {a.rounds})")
    print(f"pdctl.sdk.sse parser:   {med['parser']:.1f} µs/stream")
    print(f"ratio parser / baseline: {ratio:.2f}")
    per_event = (med["parser"] - med["baseline"]) / (a.events + 1)
    print(f"difference per event: {per_event:+.2f} µs")
    record = {"args": vars(a) | {"out": str(a.out)}, "median_us": med, "ratio": ratio}
    a.out.write_text(json.dumps(record | {"rounds_us": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
