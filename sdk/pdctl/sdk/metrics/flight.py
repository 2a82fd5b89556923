"""Per-request flight events: the contract between pdctl's connector and the SDK.

pdctl's push connector (``pdctl.connector.events``) notes, for each request, when each
step of the push protocol happened on its instance, on that instance's own monotonic
clock: the request arrived, was admitted, first scheduled, finished its prefill; the
decode registration was sent or arrived; the WRITEs were posted and completed (with
NIXL's own transfer time, bytes and descriptors); the WRITE notifications arrived and
were picked up. The events ride in vLLM's KV-connector stats payload (the path the
rendezvous series use) to the API server, which keeps a bounded ring of recent requests
and publishes it on the instance's own ``/metrics`` (no new port):

* ``pdctl:flight_seconds{request_id, event}`` — seconds from the request's arrival on
  this instance to ``event`` (one instance's clock, never compared with another's);
* ``pdctl:flight_value{request_id, field}`` — amounts (bytes, descriptors, NIXL's
  transfer and post time in seconds, notification count).

``request_id`` is the router's id (``pdctl-<hex>``, sent as ``X-Request-Id``, which vLLM
keeps inside its own request ids), so the router can join a prefill's and a decode's
records. This module is dependency-free; the connector imports the names from here and
the SDK reads them back with :func:`records_of`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pdctl.sdk.metrics.promtext import Sample

SECONDS = "pdctl:flight_seconds"
VALUE = "pdctl:flight_value"

# times (first occurrence kept), both roles
ARRIVED = "arrived"
"""vLLM's own arrival stamp (the API server took the request); the zero of the record."""
ADMITTED = "admitted"
"""The scheduler allocated the request's blocks."""
SCHEDULED = "scheduled"
"""The request was first given tokens to compute (prefill start; decode's first step)."""
FINISHED = "finished"
"""The scheduler finished the request (prefill: its one token is out)."""
# prefill side (writer thread unless noted)
BLOCKS_READY = "blocks_ready"
"""The finished prefill's blocks reached the push writer (matched or parked)."""
REG_ARRIVED = "registration_arrived"
"""Decode's registration reached the push writer (matched or parked)."""
WRITE_POSTING = "write_posting"
"""The WRITEs of the matched pair started being posted."""
WRITE_POSTED = "write_posted"
WRITE_DONE = "write_done"
"""The engine saw every WRITE of the request complete (main thread, once per step)."""
# decode side
REG_SENT = "registration_sent"
NOTIFIED = "notified"
"""The last WRITE notification reached decode's push writer."""
RECEIVED = "received"
"""Decode's engine picked up the notifications: the KV is in (main thread)."""

TIMES = (
    ARRIVED,
    ADMITTED,
    SCHEDULED,
    FINISHED,
    BLOCKS_READY,
    REG_ARRIVED,
    WRITE_POSTING,
    WRITE_POSTED,
    WRITE_DONE,
    REG_SENT,
    NOTIFIED,
    RECEIVED,
)
LAST_WINS = frozenset({NOTIFIED, WRITE_DONE, RECEIVED})
"""Times where a later event replaces an earlier one (the last of several WRITEs)."""

# amounts (summed)
BYTES = "bytes"
DESCRIPTORS = "descriptors"
XFER_S = "xfer_seconds"
"""NIXL's own transfer time (telemetry ``xferDuration``), summed over the request's
WRITE handles."""
POST_S = "post_seconds"
NOTIFICATIONS = "notifications"
KV_VERIFIED = "kv_verified"
"""Decode: 1 when the request's KV passed the connector's digest check (sampled only)."""
KV_MISMATCH = "kv_mismatch"
"""Decode: 1 when it failed the check (the receive was failed)."""
SUMS = (BYTES, DESCRIPTORS, XFER_S, POST_S, NOTIFICATIONS, KV_VERIFIED, KV_MISMATCH)

KIND = "f"
"""The kind of a flight event inside the connector's stats event list:
``["f", request_id, name, value]`` (value: a monotonic time for :data:`TIMES`, an
amount for :data:`SUMS`)."""

DEFAULT_RECORDS = 256
"""Requests each instance keeps (``kv_connector_extra_config.pdctl_flight_records``;
0 turns the recorder off)."""

_RID_RE = re.compile(r"pdctl-[0-9a-f]{32}")


def flight_key(vllm_request_id: str) -> str:
    """The router's id inside a vLLM request id (vLLM wraps ``X-Request-Id`` as
    ``cmpl-<id>-<n>-<suffix>``); the vLLM id itself when no router id is in it."""
    m = _RID_RE.search(vllm_request_id)
    return m.group(0) if m else vllm_request_id


@dataclass
class InstanceRecord:
    """One request as one instance saw it: seconds since its arrival there."""

    request_id: str
    times: dict[str, float] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)

    def t(self, event: str) -> float | None:
        return self.times.get(event)


def records_of(samples: Iterable[Sample]) -> dict[str, InstanceRecord]:
    """The flight records in one instance's ``/metrics`` samples, by router id."""
    out: dict[str, InstanceRecord] = {}
    for s in samples:
        if s.name == SECONDS:
            rid, event = s.label("request_id"), s.label("event")
            if rid and event:
                out.setdefault(rid, InstanceRecord(rid)).times[event] = s.value
        elif s.name == VALUE:
            rid, name = s.label("request_id"), s.label("field")
            if rid and name:
                out.setdefault(rid, InstanceRecord(rid)).values[name] = s.value
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def segment_stats(requests: Iterable[dict[str, object]]) -> dict[str, dict[str, float]]:
    """Per-segment p50/p99 (ms) over router ``/v1/pdctl/requests`` entries that have
    segments; a request without a given segment counts it as 0 ms, so the p50s of a
    group of requests compare like for like. ``ttft`` is the router-measured TTFT."""
    rows: list[dict[str, float]] = []
    for r in requests:
        segs = r.get("segments")
        ttft = r.get("ttft_ms")
        if not isinstance(segs, list) or not segs or not isinstance(ttft, (int, float)):
            continue
        row: dict[str, float] = {"ttft": float(ttft)}
        for s in segs:
            if isinstance(s, dict):
                name = str(s.get("name"))
                row[name] = row.get(name, 0.0) + float(s["end_ms"]) - float(s["start_ms"])
        rows.append(row)
    names = {k for row in rows for k in row}
    return {
        k: {
            "p50_ms": round(_pct(vals, 0.5), 3),
            "p99_ms": round(_pct(vals, 0.99), 3),
            "requests": float(len(vals)),
        }
        for k in sorted(names)
        for vals in [[row.get(k, 0.0) for row in rows]]
    }
