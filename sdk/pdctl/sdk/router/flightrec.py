"""The flight recorder: where each request's time to first token went.

Joins the router's timeline of a request with the prefill's and the decode's flight
records (:mod:`pdctl.sdk.metrics.flight`) into contiguous, named segments from the
router receiving the request to decode's first byte (its TTFT), then ``streaming``.

Clocks: each instance's record holds durations from the request's arrival *on that
instance*, measured on its own clock. A prefill record is placed on the router's timeline
at the router's prefill send time, a decode record at the decode send time; no two
hosts' clocks are ever subtracted. Boundaries are then clamped into order, so segments
are contiguous and sum to the router-measured TTFT exactly; the gap between two
instances' events (a notification in flight) is named for what it holds.

Where a step cannot be measured (vLLM's stock connector, pull mode, a record that aged
out), the span is labelled for what it contains (``decode, incl. wait``), never
``transfer``: only NIXL's own measured time is called ``WRITE``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pdctl.sdk.metrics import flight as fl
from pdctl.sdk.metrics.flight import InstanceRecord, records_of
from pdctl.sdk.metrics.promtext import parse_text

# segment names (the TUI's legend explains each)
ROUTER = "router"
PREFILL_QUEUE = "prefill queue"
PREFILL = "prefill"
WAIT_REGISTRATION = "wait: registration"
PREFILL_ANSWER = "prefill answer → router"
ROUTER_TO_DECODE = "router → decode"
DECODE_ADMISSION = "decode admission"
REGISTRATION = "registration → prefill"
HANDOFF = "hand-off to writer"
WRITE = "WRITE"
NOTIFICATION = "notification"
PICKUP = "notification pick-up"
DECODE_SCHEDULE = "decode scheduling"
FIRST_TOKEN = "first token"
GENERATION = "generation"
"""A non-streamed answer's last segment: its first byte arrives with the whole answer."""
STREAMING = "streaming"
# spans that hold more than one step (nothing finer was measured)
PREFILL_LEG = "prefill leg"
DECODE_INCL_WAIT = "decode, incl. wait"
DECODE_INCL_READ = "decode, incl. KV read"
DECODE = "decode"

LEGEND: dict[str, str] = {
    ROUTER: "router: choose instances, build and send the legs",
    PREFILL_QUEUE: "prefill: request parsed, waiting to be scheduled",
    PREFILL: "prefill: computing the prompt until its blocks are done",
    WAIT_REGISTRATION: "prefill done, waiting for decode's registration (prefill-first)",
    PREFILL_ANSWER: "prefill-first wait: prefill's answer reaching the router",
    ROUTER_TO_DECODE: "prefill-first wait: router sending the decode leg (sequential)",
    DECODE_ADMISSION: "prefill-first wait: decode parses, queues and registers the request",
    REGISTRATION: "prefill-first wait: decode's registration reaching prefill's writer",
    HANDOFF: "finished blocks / registration reaching prefill's writer; WRITE posting",
    WRITE: "NIXL's own measured transfer time of the request's WRITEs",
    NOTIFICATION: "WRITE done until decode's writer has the notification",
    PICKUP: "decode's engine picking the notification up (once per step)",
    DECODE_SCHEDULE: "decode scheduling the request after its KV arrived",
    FIRST_TOKEN: "decode's first step, detokenizing, first byte reaching the router",
    GENERATION: "decode generating the whole answer (not streamed: it arrives at once)",
    STREAMING: "the rest of the answer (after TTFT)",
    PREFILL_LEG: "prefill leg as the router saw it (no prefill record)",
    DECODE_INCL_WAIT: "decode after prefill: KV wait, transfer, first step (not itemized)",
    DECODE_INCL_READ: "pull: decode reads the KV, then computes its first token",
    DECODE: "decode computing the whole prompt (no prefill leg)",
}
WAIT_GROUP = frozenset(
    {WAIT_REGISTRATION, PREFILL_ANSWER, ROUTER_TO_DECODE, DECODE_ADMISSION, REGISTRATION}
)
"""Segments that are the prefill-first wait (prefill done, no registration yet)."""


@dataclass
class Segment:
    name: str
    start_ms: float
    end_ms: float
    source: str
    """Whose clock measured it: router | prefill | decode | prefill→decode (a span
    between two instances' events, placed by both anchors)."""

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "start_ms": round(self.start_ms, 3),
            "end_ms": round(self.end_ms, 3),
            "source": self.source,
        }


@dataclass
class Flight:
    """One request's TTFT split, plus what the instances measured about its push."""

    ttft_ms: float | None
    segments: list[Segment] = field(default_factory=list)
    complete: bool = False
    """Every record the mode promises was found (nothing left to wait for)."""
    order: str | None = None
    """registration-first | prefill-first (prefill's own clock)."""
    wait_ms: float | None = None
    """How long the first of the pair waited for the second (prefill's clock)."""
    write_ms: float | None = None
    post_ms: float | None = None
    bytes: float | None = None
    descriptors: float | None = None
    verified: bool | None = None
    """The decode's digest check: True passed, False failed, None not sampled."""

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "ttft_ms": r(self.ttft_ms),
            "segments": [s.as_dict() for s in self.segments],
            "push": {
                "order": self.order,
                "wait_ms": r(self.wait_ms),
                "write_ms": r(self.write_ms),
                "post_ms": r(self.post_ms),
                "bytes": self.bytes,
                "descriptors": self.descriptors,
                "verified": self.verified,
            },
        }


class _Track:
    """Boundaries placed in order: each segment ends where the next begins."""

    def __init__(self, end: float) -> None:
        self.end = end
        self.at = 0.0
        self.segments: list[Segment] = []

    def to(self, name: str, t: float | None, source: str) -> None:
        if t is None:
            return
        t = min(max(t, self.at), self.end)
        self.segments.append(Segment(name, self.at * 1000, t * 1000, source))
        self.at = t

    def rest(self, name: str, source: str) -> None:
        self.to(name, self.end, source)


def _on(anchor: float | None, rec: InstanceRecord | None, event: str) -> float | None:
    if anchor is None or rec is None:
        return None
    t = rec.t(event)
    return None if t is None else anchor + t


def join(tl: Any, p: InstanceRecord | None, d: InstanceRecord | None) -> Flight:
    """Segments for one settled timeline (``tl``: a router
    :class:`~pdctl.sdk.router.timeline.Timeline`, times in seconds since received)."""
    fb = tl.decode_first_byte
    flight = Flight(ttft_ms=None if fb is None else fb * 1000)
    if fb is None:
        return flight
    mode = tl.mode
    disagg = tl.prefill_sent is not None and mode in ("push", "push-sequential", "pull")
    track = _Track(fb)
    if not disagg:
        track.to(ROUTER, tl.decode_sent, "router")
        track.rest(DECODE, "decode")
        flight.complete = True
        return _finish(flight, track, tl)
    ps, ds = tl.prefill_sent, tl.decode_sent
    track.to(ROUTER, min(ps, ds) if ds is not None else ps, "router")
    pushed = mode != "pull" and p is not None and d is not None
    if not pushed:
        track.to(PREFILL_LEG, tl.prefill_done, "router")
        if mode == "pull":
            track.to(ROUTER_TO_DECODE, ds, "router")
            track.rest(DECODE_INCL_READ, "decode")
        else:
            track.rest(DECODE_INCL_WAIT, "decode")
        flight.complete = mode == "pull"
        return _finish(flight, track, tl)
    assert p is not None
    assert d is not None

    def P(e: str) -> float | None:  # on the prefill's clock
        return _on(ps, p, e)

    def D(e: str) -> float | None:  # on the decode's clock
        return _on(ds, d, e)

    ready, reg = p.t(fl.BLOCKS_READY), p.t(fl.REG_ARRIVED)
    if ready is not None and reg is not None:
        flight.order = "registration-first" if reg <= ready else "prefill-first"
        flight.wait_ms = abs(ready - reg) * 1000
    track.to(PREFILL_QUEUE, P(fl.SCHEDULED), "prefill")
    track.to(PREFILL, P(fl.FINISHED) or P(fl.BLOCKS_READY), "prefill")
    if flight.order == "prefill-first":
        if mode == "push-sequential":
            track.to(PREFILL_ANSWER, tl.prefill_done, "router")
            track.to(ROUTER_TO_DECODE, ds, "router")
            track.to(DECODE_ADMISSION, D(fl.REG_SENT), "decode")
            track.to(REGISTRATION, P(fl.REG_ARRIVED), "prefill→decode")
        else:
            track.to(WAIT_REGISTRATION, P(fl.REG_ARRIVED), "prefill")
    posting = P(fl.WRITE_POSTING)
    track.to(HANDOFF, posting, "prefill")
    xfer = p.values.get(fl.XFER_S)
    flight.write_ms = None if xfer is None else xfer * 1000
    post = p.values.get(fl.POST_S)
    flight.post_ms = None if post is None else post * 1000
    flight.bytes = p.values.get(fl.BYTES)
    flight.descriptors = p.values.get(fl.DESCRIPTORS)
    if d.values.get(fl.KV_MISMATCH):
        flight.verified = False
    elif d.values.get(fl.KV_VERIFIED):
        flight.verified = True
    if posting is not None and xfer is not None:
        # a duration from where the hand-off ended: NIXL's time whatever the anchors say
        track.to(WRITE, track.at + xfer, "prefill")
    track.to(NOTIFICATION, D(fl.NOTIFIED), "prefill→decode")
    track.to(PICKUP, D(fl.RECEIVED), "decode")
    track.to(DECODE_SCHEDULE, D(fl.SCHEDULED), "decode")
    track.rest(FIRST_TOKEN if tl.stream else GENERATION, "decode")
    flight.complete = xfer is not None and d.t(fl.RECEIVED) is not None
    return _finish(flight, track, tl)


def _finish(flight: Flight, track: _Track, tl: Any) -> Flight:
    flight.segments = track.segments
    if tl.done is not None and tl.done > track.end:
        flight.segments.append(Segment(STREAMING, track.end * 1000, tl.done * 1000, "router"))
    return flight


def wait_ms(flight: Flight) -> float:
    """The prefill-first wait on this request's critical path."""
    return sum(s.ms for s in flight.segments if s.name in WAIT_GROUP)


FREEZE_AFTER_S = 10.0
"""A request whose records are still incomplete this long after it settled keeps the
segments it has (the instance's ring may have dropped it, or it ran a stock connector)."""


class FlightRecorder:
    """Fills settled timelines' flights from the instances' ``/metrics`` (read only when
    someone asks, one read per instance per ask)."""

    def __init__(self, upstreams: list[Any]) -> None:
        self.upstreams = {u.name: u for u in upstreams}

    async def _records(self, name: str) -> dict[str, InstanceRecord]:
        u = self.upstreams.get(name)
        if u is None:
            return {}
        try:
            r = await u.pool.request("GET", "/metrics", connect_timeout_s=2.0)
            try:
                raw = await r.read()
            finally:
                r.release()
        except Exception:  # an instance that is down has no records to give
            return {}
        if r.status != 200:
            return {}
        samples, _ = parse_text(raw.decode(errors="replace"), (fl.SECONDS, fl.VALUE))
        return records_of(samples)

    async def fill(self, timelines: list[Any], now_s: float) -> None:
        """Join every settled, not yet final timeline (``now_s``: seconds on the
        timelines' own clock, ``time.perf_counter()``)."""
        todo = [t for t in timelines if t.done is not None and not t.flight_final]
        if not todo:
            return
        names = sorted({n for t in todo for n in (t.prefill, t.decode) if n})
        found = await asyncio.gather(*(self._records(n) for n in names))
        got = dict(zip(names, found, strict=True))
        for t in todo:
            p = got.get(t.prefill or "", {}).get(t.id)
            d = got.get(t.decode or "", {}).get(t.id)
            flight = join(t, p, d)
            t.flight = flight
            t.flight_final = flight.complete or now_s - (t.t0 + t.done) > FREEZE_AFTER_S
