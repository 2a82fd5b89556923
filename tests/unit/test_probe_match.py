"""Probe rendezvous (pure): either arrival order, base ids, retries, duplicates, expiry,
multi-rank notification counting; the wire formats; UCX lane parsing."""

from __future__ import annotations

import pytest

from pdctl.connector.probe import match as m
from pdctl.connector.probe.protocol import (
    ProtocolError,
    Registration,
    completion_notif,
    decode_registration,
    encode_registration,
    parse_completion,
)
from pdctl.connector.probe.ucxlog import write_transports


def reg(rid: str, blocks=(1, 2)) -> Registration:
    return Registration(rid, "d0", 1, tuple(blocks))


def fin(rid: str, blocks=(5, 6)) -> m.Finished:
    return m.Finished(rid, tuple(blocks))


def test_registration_first_then_finished_writes():
    mt = m.Matcher()
    assert mt.on_registration(reg("a"), 1.0) == [m.Parked("registration", "a")]
    [w] = mt.on_finished(fin("a"), 1.5)
    assert isinstance(w, m.Write)
    assert (w.first, w.waited_s, w.registration.block_ids) == ("registration", 0.5, (1, 2))
    assert not mt.registrations
    assert not mt.finished


def test_finished_first_then_registration_writes():
    mt = m.Matcher()
    assert mt.on_finished(fin("a"), 2.0) == [m.Parked("finished", "a")]
    [w] = mt.on_registration(reg("a"), 2.25)
    assert isinstance(w, m.Write)
    assert (w.first, w.waited_s, w.finished.block_ids) == ("finished", 0.25, (5, 6))


def test_ids_match_on_base_id_when_suffixes_differ():
    mt = m.Matcher()
    mt.on_registration(reg("cmpl-7-0123abcd"), 0)
    [w] = mt.on_finished(fin("cmpl-7-ffffeeee"), 0)
    assert isinstance(w, m.Write)
    assert w.registration.request_id == "cmpl-7-0123abcd"
    assert mt.on_finished(fin("cmpl-8-ffffeeee"), 0) == [m.Parked("finished", "cmpl-8-ffffeeee")]


def test_retried_registration_replaces_the_parked_one():
    mt = m.Matcher()
    mt.on_registration(reg("r-00000001", (1,)), 0)
    assert mt.on_registration(reg("r-00000002", (9,)), 1) == [
        m.Replaced("registration", "r-00000002", "r-00000001")
    ]
    [w] = mt.on_finished(fin("r", (3,)), 2)
    assert isinstance(w, m.Write)
    assert w.registration.block_ids == (9,)


def test_duplicates_after_a_write_are_ignored_until_forgotten():
    mt = m.Matcher(remember_s=10)
    mt.on_registration(reg("a"), 0)
    mt.on_finished(fin("a"), 0)
    assert mt.on_registration(reg("a"), 1) == [m.Duplicate("registration", "a")]
    assert mt.on_finished(fin("a"), 1) == [m.Duplicate("finished", "a")]
    mt.expire(20)
    assert mt.on_registration(reg("a"), 21) == [m.Parked("registration", "a")]


def test_unmatched_entries_expire_and_never_match_later():
    mt = m.Matcher(expire_after_s=5)
    mt.on_registration(reg("a"), 0)
    mt.on_finished(fin("b"), 3)
    assert mt.expire(4) == []
    assert mt.expire(6) == [m.Expired("registration", "a", 6)]
    assert mt.expire(9) == [m.Expired("finished", "b", 6)]
    assert mt.on_finished(fin("a"), 10) == [m.Parked("finished", "a")]


def test_counter_waits_for_every_rank():
    c = m.NotifCounter()
    c.expect("x", 3, 0.0)
    assert c.on_notif("p0", completion_notif("x", 3), 0.1) is None
    assert c.on_notif("p1", completion_notif("x", 3), 0.2) is None
    assert c.on_notif("p2", completion_notif("x", 3), 0.4) == m.Received("x", 0.4)
    assert not c.waiting


def test_counter_does_not_count_a_rank_twice():
    c = m.NotifCounter()
    c.expect("x", 2, 0.0)
    c.on_notif("p0", b"x:2", 0.1)
    p = c.on_notif("p0", b"x:2", 0.2)
    assert isinstance(p, m.Problem)
    assert p.kind == "repeated"
    assert c.waiting["x"].senders == {"p0"}


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        (b"no-colon", "malformed"),
        (b"x:zero", "malformed"),
        (b"\xff\xfe:1", "malformed"),
        (b"x:4", "tp_mismatch"),
        (b"y:2", "unexpected"),
    ],
)
def test_counter_reports_bad_notifications(msg, kind):
    c = m.NotifCounter()
    c.expect("x", 2, 0.0)
    p = c.on_notif("p0", msg, 0.1)
    assert isinstance(p, m.Problem)
    assert p.kind == kind
    assert c.waiting["x"].senders == set()


def test_missing_notifications_time_out_and_late_ones_are_explained():
    c = m.NotifCounter(timeout_s=1.0)
    c.expect("x", 2, 0.0)
    c.on_notif("p0", b"x:2", 0.5)
    assert c.expire(0.9) == []
    assert c.expire(1.5) == [m.Missing("x", 1, 2, 1.5)]
    late = c.on_notif("p1", b"x:2", 2.0)
    assert isinstance(late, m.Problem)
    assert "expired" in late.detail


def test_registration_round_trip_and_errors():
    r = Registration("req-1", "eng", 2, (3, 4, 5), verify=True)
    assert decode_registration(encode_registration(r)) == r
    for bad in (
        b"PUSH_REG:{",
        b"PUSH_REG:[]",
        b'PUSH_REG:{"engine_id":"e"}',
        b"other",
        b'PUSH_REG:{"request_id":"a","engine_id":"e","tp_size":1,"block_ids":[-1]}',
    ):
        with pytest.raises(ProtocolError):
            decode_registration(bad)
    assert parse_completion(b"cmpl-a:b:4") == ("cmpl-a:b", 4)


PROTO_INFO = """\
[1.0] [vm:1:0]   +--------+-------------+------------------+
[1.0] [vm:1:0]   | A self cfg#0                               |
[1.0] [vm:1:0]   | remote memory write by ucp_put* from host memory to host |
[1.0] [vm:1:0]   | 0..inf | zero-copy   | posix/memory     |
[1.0] [vm:1:0]   +--------+-------------+------------------+
[1.1] [vm:1:0]   | A intra-node cfg#1                          |
[1.1] [vm:1:0]   | remote memory write by ucp_put* from host memory to host |
[1.1] [vm:1:0]   | Range  | Description | Config             |
[1.1] [vm:1:0]   | 0..8k  | short       | tcp/lo             |
[1.1] [vm:1:0]   | 8k..inf| zero-copy   | cma/memory         |
[1.1] [vm:1:0]   | A intra-node cfg#1                          |
[1.1] [vm:1:0]   | active message by ucp_am_send* from host memory |
[1.1] [vm:1:0]   | 0..inf | short       | tcp/eth0           |
"""


def test_write_lanes_come_from_peer_write_tables_only():
    assert write_transports(PROTO_INFO.splitlines()) == ["cma/memory", "tcp/lo"]
    self_only = PROTO_INFO.splitlines()[:5]
    assert write_transports(self_only) == ["posix/memory"]
    assert write_transports(["nothing here"]) == []
