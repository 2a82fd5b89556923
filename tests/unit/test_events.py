"""Fleet events: the registry of kinds, the journal (append, garbage, rotation, follow),
what a watcher derives from its polls, and the reader's dedupe and filters."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.events import KINDS, Event, EventFilter, EventSource, Journal, kind, kind_of
from pdctl.sdk.events import kinds as K
from pdctl.sdk.events.derive import Observation, Routed, changes, from_requests
from pdctl.sdk.fleet.events import FleetEvent, journal_event
from pdctl.sdk.router.audit import AuditLog


def test_every_supervisor_kind_is_registered_and_a_new_kind_is_one_line():
    from typing import get_args

    from pdctl.sdk.fleet.events import EventKind

    for name in get_args(EventKind):
        assert KINDS[name].source == "supervisor"
    for k in KINDS.values():
        assert k.severity in K.SEVERITIES
        assert k.meaning
    name = kind("test-shed", "router", "warning", "a request was shed")
    try:
        assert kind_of(name).source == "router"
        assert Event(name, "r1").severity == "warning"
        with pytest.raises(ValueError, match="registered twice"):
            kind("test-shed", "router", "error", "something else")
    finally:
        del KINDS[name]
    # a kind written by a newer pdctl still reads, as unknown
    assert Event("from-the-future", None).source == "?"


def test_journal_appends_reads_in_time_order_and_skips_garbage(tmp_path: Path):
    j = Journal.of(tmp_path)
    assert j.read() == []
    j.append([Event("ready", "decode-0", at=20.0), Event("exited", "decode-0", at=10.0)])
    with open(j.path, "a") as f:
        f.write('not json\n{"kind": 3}\n[1]\n{"kind": "ready"}\n')
    j.append([Event("restarted", "decode-0", at=30.0, data={"n": 1})])
    got = Journal.of(tmp_path).read()
    assert [(e.kind, e.at) for e in got] == [("exited", 10.0), ("ready", 20.0), ("restarted", 30.0)]
    assert got[-1].data == {"n": 1}
    j2 = Journal.of(tmp_path)
    j2.read()
    assert j2.skipped == 4
    line = json.loads(j.path.read_text().splitlines()[0])
    assert line["source"] == "supervisor"  # readable without pdctl
    assert (j.path.stat().st_mode & 0o777) == 0o600


def test_journal_follows_only_whole_lines_and_across_a_rotation(tmp_path: Path):
    w = Journal(tmp_path / "events.jsonl", max_bytes=300)
    r = Journal(tmp_path / "events.jsonl")
    r.read()
    w.append([Event("starting", "p", at=1.0)])
    assert [e.kind for e in r.new()] == ["starting"]
    assert r.new() == []
    with open(w.path, "a") as f:  # a line being written: not yet
        f.write('{"kind": "ready", "at": 2')
    assert r.new() == []
    with open(w.path, "a") as f:
        f.write(".0}\n")
    assert [e.kind for e in r.new()] == ["ready"]
    for n in range(10):  # past max_bytes the file moves to events.1.jsonl
        w.append([Event("health", f"i{n}", "UP → DOWN", at=10.0 + n)])
    assert w.old.exists()
    assert w.path.stat().st_size < 300 + 200
    kept = Journal(w.path).read()
    assert [e.subject for e in kept if e.kind == "health"][-1] == "i9"
    assert len(kept) >= 3


def test_journal_that_cannot_be_written_never_raises(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    j = Journal(blocker / "sub" / "events.jsonl")  # a file where a directory should be
    assert j.append([Event("ready", "x")]) == 0


def test_lifecycle_events_keep_code_and_log_tail():
    ev = journal_event(FleetEvent("exited", "decode-0", at=5.0, code=-9, message="killed",
                                  log_tail=("a", "b")))  # fmt: skip
    assert (ev.kind, ev.subject, ev.message, ev.at) == ("exited", "decode-0", "killed", 5.0)
    assert ev.data == {"code": -9, "log_tail": ["a", "b"]}
    assert ev.severity == "error"


def obs(at: float, **kw) -> Observation:
    return Observation(at, **kw)


def test_changes_raise_and_clear_alerts_once_with_their_start_time():
    a = {("PA006", "decode-0"): ("decode-0 is DOWN", 100.0)}
    first = changes(None, obs(101.0, alerts=a))
    assert [(e.kind, e.subject, e.at) for e in first] == [("alert-raised", "decode-0", 100.0)]
    assert first[0].message.startswith("PA006 ")
    assert changes(obs(101.0, alerts=a), obs(102.0, alerts=a)) == []
    cleared = changes(obs(102.0, alerts=a), obs(103.0))
    assert [(e.kind, e.at) for e in cleared] == [("alert-cleared", 103.0)]
    assert cleared[0].key != first[0].key


def test_changes_name_health_rotation_breaker_drain_and_mode():
    up, down = Routed(True, "closed", False), Routed(False, "open", True)
    prev = obs(1.0, health={"d": "UP"}, routed={"d": up}, mode="push")
    cur = obs(2.0, health={"d": "DOWN", "new": "UP"}, routed={"d": down, "n": up}, mode="colocated")
    got = {e.kind: e for e in changes(prev, cur)}
    assert set(got) == {"health", "routed", "breaker", "drain", "mode"}
    assert got["health"].message == "UP → DOWN"
    assert got["breaker"].message == "breaker closed → open"
    assert got["drain"].message == "drained"
    assert got["mode"].message == "mode push → colocated"
    assert all(e.at == 2.0 for e in got.values())
    assert changes(None, cur) == []  # a first look is no change


REQ = {
    "id": "r1",
    "received": 1000.0,
    "outcome": "error",
    "error": "decode decode-0 failed mid-answer",
    "prefill": "prefill-0",
    "decode": "decode-0",
    "done_ms": 250.0,
    "retries": 1,
    "migrations": [{"from": "decode-0", "to": "decode-1", "at_ms": 120.0, "why": "died"}],
    "notes": ["200.0 ms: asked prefill prefill-0 to free the request's KV"],
    "status": 502,
}


def test_requests_give_retries_migrations_releases_and_failures_at_their_time():
    got = {e.kind: e for e in from_requests([REQ])}
    assert set(got) == {"retry", "migration", "kv-release", "request-failed"}
    assert got["migration"].at == pytest.approx(1000.12)
    assert "decode-0 → decode-1: died" in got["migration"].message
    assert got["kv-release"].at == pytest.approx(1000.25)
    assert "failed mid-answer" in got["kv-release"].message  # the reason
    assert got["request-failed"].data == {"status": 502}
    assert len({e.key for e in got.values()}) == 4
    ok = {**REQ, "outcome": "ok", "retries": 0, "migrations": [], "notes": []}
    assert from_requests([ok]) == []
    assert from_requests([{**REQ, "outcome": "running"}]) == []
    garbage: list[Any] = [
        {},
        {"id": 3},
        {"id": "x", "received": "t"},
        {**REQ, "migrations": [1, None]},
    ]
    assert {e.kind for e in from_requests(garbage)} == {"retry", "kv-release", "request-failed"}


def test_source_records_each_key_once_across_watchers_and_restarts(tmp_path: Path):
    a, b = EventSource(tmp_path), EventSource(tmp_path)
    assert len(a.observe(None, None, [REQ])) == 4
    assert b.observe(None, None, [REQ]) == []  # the other watcher journaled them
    a2 = EventSource(tmp_path)  # a UI restarted: the events are there, not duplicated
    assert len(a2.history()) == 4
    assert a2.observe(None, None, [REQ]) == []
    assert len(EventSource(tmp_path).history()) == 4


def test_read_only_source_shows_what_it_derives_without_writing(tmp_path: Path):
    ro = EventSource(tmp_path, writable=False)
    ro.history()
    assert len(ro.observe(None, None, [REQ])) == 4
    assert not (tmp_path / "events.jsonl").exists()
    assert {e.kind for e in ro.new()} == {"retry", "migration", "kv-release", "request-failed"}
    assert ro.new() == []


def test_control_actions_name_who_asked(tmp_path: Path):
    s = EventSource(tmp_path)
    s.control("drain", "decode-0", by="ops@host via pdctl ui")
    (e,) = s.history(EventFilter(kinds=("control",)))
    assert (e.subject, e.message, e.actor, e.source) == (
        "decode-0",
        "drain",
        "ops@host via pdctl ui",
        "operator",
    )


def test_filters_and_their_errors():
    evs = [
        Event("ready", "d", at=1.0),
        Event("exited", "d", at=2.0),
        Event("alert-raised", "p", at=3.0),
    ]
    assert [e.kind for e in evs if EventFilter(sources=("monitor",)).matches(e)] == ["alert-raised"]
    assert [e.kind for e in evs if EventFilter(subjects=("d",), since=1.5).matches(e)] == ["exited"]
    assert [e.kind for e in evs if EventFilter(min_severity="warning").matches(e)] == [
        "exited",
        "alert-raised",
    ]
    with pytest.raises(ValueError, match="unknown event kind 'exit'; kinds: "):
        EventFilter(kinds=("exit",)).check()
    with pytest.raises(ValueError, match="unknown source 'bob'"):
        EventFilter(sources=("bob",)).check()
    with pytest.raises(ValueError, match="unknown severity"):
        EventFilter(min_severity="loud").check()


async def test_follow_yields_what_another_process_appends(tmp_path: Path):
    s = EventSource(tmp_path)
    Journal.of(tmp_path).append([Event("ready", "old", at=1.0)])
    s.history()
    got: list[Event] = []

    async def read() -> None:
        async for e in s.follow(interval_s=0.01):
            got.append(e)
            if len(got) == 2:
                return

    task = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    Journal.of(tmp_path).append([Event("exited", "d", at=2.0), Event("restarted", "d", at=3.0)])
    await asyncio.wait_for(task, 5)
    assert [e.kind for e in got] == ["exited", "restarted"]


def _router_audit(tmp_path: Path) -> AuditLog:
    """The router's own audit writer, at the local fleet's default place."""
    return AuditLog(tmp_path / "run" / "router-audit.jsonl", max_bytes=10_000, backups=1)


def test_the_routers_audit_log_reads_as_events_with_the_keys_name(tmp_path: Path) -> None:
    log = _router_audit(tmp_path)
    log.record(who="-", action="POST /v1/pdctl/drain", peer="10.0.0.9:4000", result=401,
               detail={"reason": "wrong_key"})  # fmt: skip
    log.record(who="ops", tenant="ops", action="POST /v1/pdctl/drain", peer="127.0.0.1:5000",
               result=200, detail={"request": {"instance": "decode-0", "drain": True}})  # fmt: skip
    with (tmp_path / "run" / "router-audit.jsonl").open("a") as f:
        f.write('{"torn": \n[1,2]\n')
    src = EventSource(tmp_path)
    refused, done = src.history()
    assert (refused.kind, refused.source, refused.severity) == ("auth-failure", "router", "warning")
    assert refused.actor == "no key"
    assert "10.0.0.9:4000: 401 (wrong_key)" in refused.message
    assert (done.kind, done.subject, done.actor) == ("audited", "decode-0", "ops via the router")
    assert "drain=True" in done.message
    assert src.audit is not None
    assert src.audit.skipped == 2
    # followed: a line the router appends later is new, once
    log.record(who="web", tenant="web", action="POST /v1/pdctl/mode", peer="p", result=403,
               detail={"reason": "role"})  # fmt: skip
    (e,) = src.new(EventFilter(kinds=("auth-failure",)))
    assert e.actor == "web via the router"
    assert src.new() == []
    # across the router's rotation (router-audit.jsonl.1) the history keeps both files
    for _ in range(100):
        log.record(who="ops", action="POST /v1/pdctl/mode", peer="p", result=200)
    assert (tmp_path / "run" / "router-audit.jsonl.1").is_file()
    assert len(EventSource(tmp_path).history()) > 3
    log.close()
