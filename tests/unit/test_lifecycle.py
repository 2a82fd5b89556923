"""The connector's lifecycle messages: notification format, the failpoint's value, and
the worker decisions (which lease to release, which receive to fail) on vLLM's real push
worker class with only the state these paths read."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from pdctl.connector import lifecycle as lc


def test_notifications_round_trip_and_ignore_vllm_notifications():
    for kind in (lc.RELEASE, lc.FAILED):
        assert lc.decode(lc.encode(kind, "cmpl-a:b-0-1234abcd")) == (kind, ["cmpl-a:b-0-1234abcd"])
    assert lc.decode(lc.encode(lc.RELEASE, "cmpl-x-0", "", "x")) == (lc.RELEASE, ["cmpl-x-0", "x"])
    assert lc.decode(b"HB:cmpl-1") is None
    assert lc.decode(b"cmpl-1:2") is None
    assert lc.decode(lc.RELEASE.encode() + b":0") is None


def test_failpoint_values():
    assert lc.failpoint_match("fail") == ""
    assert lc.failpoint_match("match:chaos") == "chaos"
    with pytest.raises(ValueError, match="pdctl_failpoint_write"):
        lc.failpoint_match("sometimes")


def worker(**state: Any) -> Any:
    w: Any = object.__new__(lc.LifecycleWorker)
    w._pdctl_life = lc._State(grace_s=1.0)
    w._reqs_to_send = {}
    w._reqs_to_process = set()
    w._sending_transfers = {}
    w._sending_transfers_lock = threading.Lock()
    w._pending_completion_notifs = queue.Queue()
    w._recving_metadata = {}
    w._failed_recv_reqs = queue.Queue()
    w._evict_finished_inbox = queue.Queue()
    w._lease_extension = 30
    w.transfer_topo = object()
    for k, v in state.items():
        setattr(w, k, v)
    return w


def test_release_expires_idle_leases_but_not_one_being_written():
    w = worker(
        _reqs_to_send={
            "cmpl-a-0-1234abcd": 99.0,
            "cmpl-b-0-1234abcd": 99.0,
            "cmpl-c-0-1234abcd": 99.0,
        },
        _sending_transfers={"cmpl-b-0-1234abcd": [7]},
    )
    # D's base id for a; for b only the id both legs were sent with
    w._pdctl_life.release.update({"cmpl-a-0": 1.0, "b": 1.0})
    w._release_leases(now=2.0)
    assert w._reqs_to_send == {
        "cmpl-a-0-1234abcd": 0.0,  # vLLM's reaper frees it this step
        "cmpl-b-0-1234abcd": 99.0,  # its WRITE completes and frees it
        "cmpl-c-0-1234abcd": 99.0,
    }
    assert set(w._pdctl_life.release) == {"b"}  # applied once the WRITE is gone
    w._release_leases(now=2.0 + lc.REMEMBER_S + 1)
    assert w._pdctl_life.release == {}  # never kept forever


def test_release_notification_is_taken_out_before_vllm_reads_the_queue():
    w = worker(
        _reqs_to_send={"cmpl-r-0-aaaaaaaa": 99.0},
        _reqs_to_process={"cmpl-r-0-aaaaaaaa"},
        _reg_send_inbox=queue.Queue(),
        _push_writer_wake=threading.Event(),
        _pending_d_registrations={"cmpl-r-0-bbbbbbbb": {}, "cmpl-s-0-bbbbbbbb": {}},
    )
    w._pending_completion_notifs.put(lc.encode(lc.RELEASE, "cmpl-r-0", "r"))
    w._pending_completion_notifs.put(b"HB:cmpl-r-0-aaaaaaaa")
    assert w._get_new_notifs() == set()  # vLLM handled the heartbeat, not our message
    assert w._pdctl_life.release.keys() == {"cmpl-r-0", "r"}
    assert w._reg_send_inbox.get_nowait() == (lc.DRAIN, {})
    w._unpark_released()  # what the writer thread does with the DRAIN entry
    assert w._pending_d_registrations == {"cmpl-s-0-bbbbbbbb": {}}


def test_failed_notification_fails_a_waiting_receive_at_once():
    meta = SimpleNamespace(local_block_ids=([3, 4],))
    w = worker(_recving_metadata={"cmpl-f-0-cccccccc": meta})
    w._pdctl_life.fail_at["cmpl-f-0-cccccccc"] = 1e18
    w._pending_completion_notifs.put(lc.encode(lc.FAILED, "cmpl-f-0-cccccccc"))
    w._pending_completion_notifs.put(lc.encode(lc.FAILED, "cmpl-gone-0-dddddddd"))
    w._get_new_notifs()
    assert w._failed_recv_reqs.get_nowait() == "cmpl-f-0-cccccccc"
    assert w._failed_recv_reqs.empty()  # an unknown request is not reported
    assert w._pdctl_life.fail_at == {}
