"""The push rendezvous series exported by pdctl's connector, and their reader.

vLLM exports nothing about the push rendezvous itself: a decode instance *registers* its
destination blocks with the prefill (a NIXL notification), the prefill *finishes* the
prompt, and whichever of the two arrives second triggers the WRITE. pdctl's connector
(``pdctl.connector.push``) counts that protocol and publishes it through vLLM's
KV-connector stats path, so the series sit on each instance's own ``/metrics`` next to
vLLM's. This module is the contract between the two sides: the connector imports the
names from here (it is dependency-free), the SDK reads them back with
:func:`rendezvous_of`.

Prometheus appends ``_total`` to counters and ``_bucket``/``_sum``/``_count`` to
histograms; :data:`METRICS` lists the base names.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.sdk.metrics.derive import Latency, Scrape, counter_delta, latency_of

PREFIX = "pdctl:"

# prefill side (the WRITE initiator in push mode)
REGISTRATIONS_WAITING = PREFIX + "push_registrations_waiting"
PREFILLS_WAITING = PREFIX + "push_prefills_waiting"
WRITES_IN_FLIGHT = PREFIX + "push_writes_in_flight"
MATCHES = PREFIX + "push_matches"
MATCH_WAIT = PREFIX + "push_match_wait_seconds"
MATCH_TO_DONE = PREFIX + "push_match_to_write_done_seconds"
BYTES_PUSHED = PREFIX + "push_bytes"
EXPIRED = PREFIX + "push_expired"
RELEASED = PREFIX + "push_released"
DUPLICATES = PREFIX + "push_duplicate_ids"
# decode side (the WRITE target)
REGISTRATIONS_SENT = PREFIX + "push_registrations_sent"
AWAITING_NOTIFICATIONS = PREFIX + "push_awaiting_notifications"
REGISTRATION_TO_NOTIFIED = PREFIX + "push_registration_to_notified_seconds"
RECEIVE_FAILURES = PREFIX + "push_receive_failures"
KV_VERIFY = PREFIX + "kv_verify"
"""Sampled requests whose received KV was checked against the prefill's digests."""

ORDER_LABEL = "order"
REGISTRATION_FIRST = "registration_first"
PREFILL_FIRST = "prefill_first"
SIDE_LABEL = "side"  # on EXPIRED: which entry expired unmatched
SIDE_REGISTRATION = "registration"
SIDE_PREFILL = "prefill"
SIDE_WRITE = "write"
REASON_LABEL = "reason"  # on RELEASED: why the connector let go of the KV early
DECODE_ABORTED = "decode_aborted"
WRITE_FAILED = "write_failed"
HANDSHAKE_FAILED = "handshake_failed"
ROUTER_RELEASE = "router_release"
RESULT_LABEL = "result"  # on KV_VERIFY
KV_VERIFY_RESULTS = ("ok", "mismatch", "missing", "unsupported")
"""Every ``result`` of :data:`KV_VERIFY` (exported at 0 from the start)."""

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Bucket bounds (seconds) of every pdctl histogram: 1 ms to 30 s."""


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # gauge | counter | histogram
    side: str  # prefill | decode | both
    help: str
    labels: tuple[str, ...] = ()
    values: tuple[tuple[str, ...], ...] = ()
    """Every value each label takes (one tuple per label): the connector exports each
    combination at 0 from start-up, so dashboards and alerts see 0 before the first
    event, not "no data"."""


METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        REGISTRATIONS_WAITING,
        "gauge",
        "prefill",
        "Decode registrations received whose prefill has not finished yet.",
    ),
    MetricDef(
        PREFILLS_WAITING,
        "gauge",
        "prefill",
        "Finished prefills whose decode registration has not arrived yet (their KV "
        "blocks are held under the lease meanwhile).",
    ),
    MetricDef(
        WRITES_IN_FLIGHT,
        "gauge",
        "prefill",
        "Matched requests whose NIXL WRITEs have not completed.",
    ),
    MetricDef(
        MATCHES,
        "counter",
        "prefill",
        "Registration/prefill matches, by which side arrived first.",
        (ORDER_LABEL,),
        ((REGISTRATION_FIRST, PREFILL_FIRST),),
    ),
    MetricDef(
        MATCH_WAIT,
        "histogram",
        "prefill",
        "Seconds from the first arrival (registration or finished prefill) to the match.",
    ),
    MetricDef(
        MATCH_TO_DONE,
        "histogram",
        "prefill",
        "Seconds from the match to the completion of the request's WRITEs.",
    ),
    MetricDef(BYTES_PUSHED, "counter", "prefill", "KV bytes pushed by NIXL WRITEs."),
    MetricDef(
        EXPIRED,
        "counter",
        "prefill",
        "Entries dropped unmatched: a finished prefill whose lease ran out before any "
        "registration (side=prefill), or a registration whose prefill never finished "
        "(side=registration), or matched WRITEs that never completed (side=write).",
        (SIDE_LABEL,),
        ((SIDE_REGISTRATION, SIDE_PREFILL, SIDE_WRITE),),
    ),
    MetricDef(
        RELEASED,
        "counter",
        "prefill",
        "Finished prefills whose KV the connector released before the lease ended, by "
        "reason: decode_aborted (the decode let go), write_failed (the WRITE failed), "
        "handshake_failed (no side channel to the decode), router_release (the router saw "
        "the request end without decode reading it). Not expiries: vLLM counts "
        "them in vllm:nixl_num_kv_expired_reqs_total too (its lease reaper frees them).",
        (REASON_LABEL,),
        ((DECODE_ABORTED, WRITE_FAILED, HANDSHAKE_FAILED, ROUTER_RELEASE),),
    ),
    MetricDef(
        DUPLICATES,
        "counter",
        "both",
        "Registrations or finished prefills arriving for an id that was already waiting "
        "(a retried or duplicated request id).",
    ),
    MetricDef(
        REGISTRATIONS_SENT,
        "counter",
        "decode",
        "Registrations this decode sent to a prefill.",
    ),
    MetricDef(
        AWAITING_NOTIFICATIONS,
        "gauge",
        "decode",
        "Registered requests still waiting for the prefill's WRITE notifications.",
    ),
    MetricDef(
        REGISTRATION_TO_NOTIFIED,
        "histogram",
        "decode",
        "Seconds from sending the registration to receiving the last expected WRITE notification.",
    ),
    MetricDef(
        RECEIVE_FAILURES,
        "counter",
        "decode",
        "Registered requests that failed to receive their KV (handshake or transfer "
        "failure, timeout).",
    ),
    MetricDef(
        KV_VERIFY,
        "counter",
        "decode",
        "Sampled requests whose received KV was checked against the prefill's per-block "
        "digests (pdctl_kv_verify_rate), by result: ok, mismatch (the KV that arrived is "
        "not the KV that was sent; the receive failed), missing (the prefill sent no "
        "digest), unsupported (a layout the check does not cover).",
        (RESULT_LABEL,),
        (KV_VERIFY_RESULTS,),
    ),
)


@dataclass(frozen=True)
class Rendezvous:
    """One instance's rendezvous figures; totals since start, ``*_window`` over the
    monitor's window, latencies over the window."""

    side: str  # prefill | decode
    registrations_waiting: float | None = None
    prefills_waiting: float | None = None
    writes_in_flight: float | None = None
    matches_registration_first: float = 0.0
    matches_prefill_first: float = 0.0
    matches_window: float = 0.0
    registration_first_ratio: float | None = None
    """Share of the window's matches where the registration arrived first (None: none)."""
    match_wait: Latency = Latency()
    match_to_write_done: Latency = Latency()
    bytes_pushed: float | None = None
    expired: float = 0.0
    expired_window: float = 0.0
    released: float = 0.0
    released_window: float = 0.0
    """Early releases by the connector over the window (vLLM counts them as expired
    leases too)."""
    duplicates: float = 0.0
    registrations_sent: float | None = None
    awaiting_notifications: float | None = None
    registration_to_notified: Latency = Latency()
    receive_failures: float = 0.0
    receive_failures_window: float = 0.0
    kv_verify: dict[str, float] | None = None
    """Decode: verified requests by result since start (None: not exported)."""
    kv_mismatch_window: float = 0.0


def present(scrape: Scrape) -> bool:
    """Whether a payload carries the connector's series at all."""
    return any(name.startswith(PREFIX) for name in scrape.names())


def rendezvous_of(new: Scrape, old: Scrape | None, role: str) -> Rendezvous | None:
    """The rendezvous figures of one target from its newest and oldest scrape in the
    window; ``None`` when the connector's series are absent (stock connector)."""
    if not present(new):
        return None

    def window(base: str) -> Latency:
        return latency_of(new, old, base)

    def delta(name: str, match: dict[str, str] | None = None) -> float:
        now = new.total(name, match)
        before = (old.total(name, match) or 0.0) if old is not None else 0.0
        return counter_delta(now, before) or 0.0

    reg_first = {ORDER_LABEL: REGISTRATION_FIRST}
    pre_first = {ORDER_LABEL: PREFILL_FIRST}
    m_reg, m_pre = delta(MATCHES + "_total", reg_first), delta(MATCHES + "_total", pre_first)
    side = "decode" if role == "decode" else "prefill"
    return Rendezvous(
        side=side,
        registrations_waiting=new.total(REGISTRATIONS_WAITING),
        prefills_waiting=new.total(PREFILLS_WAITING),
        writes_in_flight=new.total(WRITES_IN_FLIGHT),
        matches_registration_first=new.total(MATCHES + "_total", reg_first) or 0.0,
        matches_prefill_first=new.total(MATCHES + "_total", pre_first) or 0.0,
        matches_window=m_reg + m_pre,
        registration_first_ratio=(m_reg / (m_reg + m_pre)) if (m_reg + m_pre) > 0 else None,
        match_wait=window(MATCH_WAIT),
        match_to_write_done=window(MATCH_TO_DONE),
        bytes_pushed=new.total(BYTES_PUSHED + "_total"),
        expired=new.total(EXPIRED + "_total") or 0.0,
        expired_window=delta(EXPIRED + "_total"),
        released=new.total(RELEASED + "_total") or 0.0,
        released_window=delta(RELEASED + "_total"),
        duplicates=new.total(DUPLICATES + "_total") or 0.0,
        registrations_sent=new.total(REGISTRATIONS_SENT + "_total"),
        awaiting_notifications=new.total(AWAITING_NOTIFICATIONS),
        registration_to_notified=window(REGISTRATION_TO_NOTIFIED),
        receive_failures=new.total(RECEIVE_FAILURES + "_total") or 0.0,
        receive_failures_window=delta(RECEIVE_FAILURES + "_total"),
        kv_verify=_by_result(new),
        kv_mismatch_window=delta(KV_VERIFY + "_total", {RESULT_LABEL: "mismatch"}),
    )


def _by_result(scrape: Scrape) -> dict[str, float] | None:
    out = {
        r: v
        for r in KV_VERIFY_RESULTS
        if (v := scrape.total(KV_VERIFY + "_total", {RESULT_LABEL: r})) is not None
    }
    return out or None
