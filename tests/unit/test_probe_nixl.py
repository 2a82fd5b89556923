"""The probe's push engine over real NIXL/UCX (host memory, no GPU needed): agents in
this process for the protocol cases, and one two-process run of the command line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# only the distributions themselves may be missing (a skip, a failure under --strict-skips);
# their internals are plain imports below: a moved module is an error, never a skip
pytest.importorskip("nixl", reason="nixl is not installed (pip install 'pdctl[cpu]')")

from pdctl.connector.probe import match as m
from pdctl.connector.probe.engine import (
    Note,
    RankWriter,
    TargetEngine,
    WriteDone,
)
from pdctl.connector.probe.plan import geometry_for

GEO = geometry_for(bytes_per_token=256, prompt_len=256, block_size=16, regions=2)
"""16 blocks of 2 KiB in each of 2 regions per request."""


class Pair:
    def __init__(self, tp: int, *, timeout_s: float = 10.0, expire_after_s: float = 10.0):
        self.target = TargetEngine(GEO, tp, timeout_s=timeout_s, name=f"t{id(self)}")
        self.ranks = [
            RankWriter(r, tp, GEO, merge=True, expire_after_s=expire_after_s, name=f"i{id(self)}")
            for r in range(tp)
        ]
        self.seen: list[object] = []
        self.target_seen: list[object] = []
        for w in self.ranks:
            self.target.add_peer(w.metadata())
            base, dev = self.target.pool_info()[w.rank]
            w.connect(self.target.metadata(), base, dev)
            w.start()

    def finish(self, rid: str, blocks: tuple[int, ...], seq: int = 1) -> None:
        for w in self.ranks:
            w.finish(m.Finished(rid, blocks), seq)

    def pump_until(self, cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, f"timed out; saw {self.seen + self.target_seen}"
            self.target_seen += self.target.poll(time.monotonic())
            for w in self.ranks:
                while not w.events.empty():
                    self.seen.append(w.events.get_nowait())
            time.sleep(0.001)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.seen + self.target_seen if isinstance(e, kind)]

    def close(self) -> None:
        for w in self.ranks:
            w.close()
        self.target.close()


@pytest.fixture
def pair1() -> Iterator[Pair]:
    p = Pair(1)
    yield p
    p.close()


SRC = tuple(range(16))


def _received(p: Pair, rid: str) -> bool:
    """The target counted every notification and every rank saw its WRITE complete (the
    notification can arrive before the writer polls its handle)."""
    writes = [d for d in p.of(WriteDone) if d.request_id == rid]
    return any(r.request_id == rid for r in p.of(m.Received)) and len(writes) == len(p.ranks)


def test_registration_first(pair1):
    p = pair1
    reg = p.target.register("req-1-0123abcd", verify=True, now=time.monotonic())
    p.pump_until(lambda: bool(p.of(m.Parked)))
    assert p.of(m.Parked) == [m.Parked("registration", "req-1-0123abcd")]
    p.finish("req-1-deadbeef", SRC)
    p.pump_until(lambda: _received(p, reg.request_id))
    [done] = p.of(WriteDone)
    assert (done.first, done.descs, done.nbytes) == ("registration", 2, GEO.request_bytes)
    assert p.target.checksums(reg.request_id) == [done.checksum]


def test_finished_first(pair1):
    p = pair1
    p.finish("req-2-deadbeef", SRC[::-1])
    p.pump_until(lambda: bool(p.of(m.Parked)))
    reg = p.target.register("req-2-0123abcd", verify=True, now=time.monotonic())
    p.pump_until(lambda: _received(p, reg.request_id))
    [done] = p.of(WriteDone)
    assert done.first == "finished"
    assert done.descs == 2 * 16  # reversed source blocks: nothing to merge
    assert p.target.checksums(reg.request_id) == [done.checksum]


def test_duplicate_registration_is_not_written_twice(pair1):
    p = pair1
    p.finish("req-3", SRC)
    p.target.register("req-3", now=time.monotonic())
    p.pump_until(lambda: _received(p, "req-3"))
    p.target.register("req-3", now=time.monotonic())  # the same registration again
    p.pump_until(lambda: bool(p.of(m.Duplicate)))
    assert p.of(m.Duplicate) == [m.Duplicate("registration", "req-3")]
    assert len(p.of(WriteDone)) == 1


def test_unmatched_registration_expires_and_target_reports_missing():
    p = Pair(1, timeout_s=0.3, expire_after_s=0.3)
    try:
        p.target.register("lonely", now=time.monotonic())
        p.pump_until(lambda: bool(p.of(m.Expired)) and bool(p.of(m.Missing)))
        assert p.of(m.Expired)[0].request_id == "lonely"
        assert p.of(m.Missing)[0] == m.Missing("lonely", 0, 1, p.of(m.Missing)[0].age_s)
        p.finish("lonely", SRC)  # too late: parks, never writes
        p.pump_until(lambda: bool(p.of(m.Parked)))
        assert not p.of(WriteDone)
    finally:
        p.close()


def test_two_ranks_each_notify_before_the_request_counts():
    p = Pair(2)
    try:
        reg = p.target.register("req-tp", verify=True, now=time.monotonic())
        p.ranks[0].finish(m.Finished("req-tp", SRC), 7)
        p.pump_until(lambda: len(p.of(WriteDone)) == 1)
        time.sleep(0.05)
        p.pump_until(lambda: True)
        assert not p.of(m.Received)  # one of two notifications is not enough
        p.ranks[1].finish(m.Finished("req-tp", SRC), 7)
        p.pump_until(lambda: _received(p, "req-tp"))
        sent = {d.rank: d.checksum for d in p.of(WriteDone)}
        assert p.target.checksums(reg.request_id) == [sent[0], sent[1]]
        assert sent[0] != sent[1]  # each rank sends its own bytes
    finally:
        p.close()


def test_corrupted_notifications_are_reported_not_waited_on(pair1):
    p = pair1
    w = p.ranks[0]
    p.target.agent.send_notif(w.name, b"PUSH_REG:{not json")
    p.target.register("req-c", now=time.monotonic())
    p.pump_until(lambda: bool(p.of(Note)) and any(isinstance(e, m.Parked) for e in p.seen))
    assert "not JSON" in p.of(Note)[0].detail
    w.agent.send_notif(w.target, b"garbage-without-rank")
    p.pump_until(lambda: bool(p.of(m.Problem)))
    assert p.of(m.Problem)[0].kind == "malformed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # two probe processes over real NIXL/UCX
def test_command_line_runs_both_ends_and_checks_integrity():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdctl.connector.probe",
            "--bytes-per-token",
            "512",
            "--prompt-len",
            "512",
            "--count",
            "3",
            "--warmup",
            "1",
            "--tp",
            "2",
            "--verify",
            "all",
            "--timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["ok"]
    assert r["requests"]["completed"] == 3
    assert r["integrity"] == {"checked": 4, "matched": 4, "mismatched": []}
    assert r["descriptors"]["unmerged"] == 32
    assert r["descriptors"]["merged"] == 1
    assert r["gbps"] > 0
    assert r["transfer_ms"]["p50"] > 0


def test_command_line_says_when_the_target_is_unreachable():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdctl.connector.probe",
            "--connect",
            f"127.0.0.1:{_free_port()}",
            "--bytes-per-token",
            "512",
            "--timeout",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "cannot reach the target" in json.loads(out.stdout)["error"]
    assert "--listen" in out.stderr
