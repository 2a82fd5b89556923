"""The connector's lifecycle messages: notification format, the failpoint's value, and
the worker decisions (which lease to release, which receive to fail) on vLLM's real push
worker class with only the state these paths read."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

# only the distributions themselves may be missing (a skip, a failure under --strict-skips);
# their internals are plain imports below: a moved module is an error, never a skip
pytest.importorskip("vllm", reason="vllm is not installed (pip install 'pdctl[cpu]')")

from pdctl.connector import lifecycle as lc
from pdctl.connector.failpoints import WriteDelay
from pdctl.sdk.metrics import rendezvous as rv


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
    aborted = (1.0, rv.DECODE_ABORTED)
    w._pdctl_life.release.update({"cmpl-a-0": aborted, "b": aborted})
    released: list[tuple[str, str]] = []
    w._lease_released = lambda rid, reason: released.append((rid, reason))
    w._release_leases(now=2.0)
    assert w._reqs_to_send == {
        "cmpl-a-0-1234abcd": 0.0,  # vLLM's reaper frees it this step
        "cmpl-b-0-1234abcd": 99.0,  # its WRITE completes and frees it
        "cmpl-c-0-1234abcd": 99.0,
    }
    assert set(w._pdctl_life.release) == {"b"}  # applied once the WRITE is gone
    assert released == [("cmpl-a-0-1234abcd", rv.DECODE_ABORTED)]  # counted, by reason
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


def test_a_gone_prefill_fails_its_waiting_receives_once():
    gone, alive = ("127.0.0.1", 5600), ("127.0.0.1", 5601)

    def meta(addr: tuple[str, int]) -> Any:
        return SimpleNamespace(remote=SimpleNamespace(host=addr[0], port=addr[1]))

    w = worker(
        _recving_metadata={"cmpl-a-0-1": meta(gone), "cmpl-b-0-1": meta(alive)},
    )
    asked: list[set[tuple[str, int]]] = []

    class Watch:
        def dead(self, addrs: set[tuple[str, int]]) -> set[tuple[str, int]]:
            asked.append(set(addrs))
            return {gone}

    w._pdctl_life.watch = Watch()
    w._pdctl_life.fail_at["cmpl-a-0-1"] = 1e18
    w._fail_if_prefill_gone(now=1.0)
    assert asked == [{gone, alive}]
    assert w._failed_recv_reqs.get_nowait() == "cmpl-a-0-1"
    assert w._failed_recv_reqs.empty()
    assert w._pdctl_life.fail_at == {}
    w._fail_if_prefill_gone(now=2.0)  # still listed by vLLM this step: not failed twice
    assert w._failed_recv_reqs.empty()
    del w._recving_metadata["cmpl-a-0-1"]
    w._fail_if_prefill_gone(now=3.0)
    assert w._pdctl_life.gone == {}  # forgotten once vLLM dropped it


def test_no_watch_no_probe():
    w = worker(_recving_metadata={"cmpl-a-0-1": SimpleNamespace(remote=None)})
    w._fail_if_prefill_gone(now=1.0)  # watch off (pdctl_peer_watch_s = 0)
    assert w._failed_recv_reqs.empty()


def test_delayed_write_is_held_then_dropped_when_its_lease_was_released():
    w = worker(_deferred_push_inbox=queue.Queue(), _push_writer_wake=threading.Event())
    w._pdctl_life.delay = WriteDelay(seconds=0.01)
    rid, reg = "cmpl-d-0-1234abcd", {"decode_engine_id": "d", "request_id": "cmpl-d-0-x"}
    w._do_start_push_kv(rid, ([1, 2],), reg)  # held back: no WRITE yet
    assert rid in w._pdctl_life.delayed
    assert w._deferred_push_inbox.get(timeout=5) == (rid, ([1, 2],), reg)
    assert w._push_writer_wake.is_set()
    w._do_start_push_kv(rid, ([1, 2],), reg)  # redriven, but its lease is gone
    assert w._pdctl_life.delayed == set()
    assert w._pdctl_life.targets == {}  # no WRITE was started


def test_a_delayed_write_waiting_for_its_handshake_is_not_delayed_twice():
    from concurrent.futures import Future

    handshake: Future[Any] = Future()
    rid = "cmpl-e-0-1234abcd"
    reg: dict[str, Any] = {"decode_engine_id": "d", "request_id": "cmpl-e-0-x", "decode_host": "h"}
    reg.update(decode_port=1, decode_tp_size=1, local_block_ids=[5])
    w = worker(
        _reqs_to_send={rid: 99.0},
        _deferred_push_inbox=queue.Queue(),
        _push_writer_wake=threading.Event(),
        _ensure_handshake=lambda *a, **kw: handshake,  # first contact with this decode
    )
    w._pdctl_life.delay = WriteDelay(seconds=0.01)
    w._do_start_push_kv(rid, ([1],), reg)  # held back
    w._deferred_push_inbox.get(timeout=5)
    w._do_start_push_kv(rid, ([1],), reg)  # back: vLLM defers it until the handshake
    assert w._pdctl_life.targets == {rid: ("d", "cmpl-e-0-x")}
    assert rid in w._pdctl_life.delayed  # so that its return is not held back again
    w._deferred_push_inbox.put(None)
    assert w._deferred_push_inbox.get(timeout=1) is None  # no second timer fired
    handshake.set_exception(TimeoutError("no side channel"))
    assert w._pdctl_life.release["cmpl-e-0"][1] == rv.HANDSHAKE_FAILED


def test_handshake_failure_releases_the_kv_at_once():
    w = worker()
    w._pdctl_life.targets["cmpl-h-0-1234abcd"] = ("d", "cmpl-h-0-x")
    fut: Any = SimpleNamespace(exception=lambda: None)
    w._handshake_done(fut, "cmpl-h-0-1234abcd")
    assert w._pdctl_life.release == {}  # it succeeded
    fut = SimpleNamespace(exception=lambda: TimeoutError("side channel"))
    w._handshake_done(fut, "cmpl-h-0-1234abcd")
    assert w._pdctl_life.targets == {}
    (key, (_, reason)), *_ = w._pdctl_life.release.items()
    assert (key, reason) == ("cmpl-h-0", rv.HANDSHAKE_FAILED)


def test_no_release_is_sent_to_a_prefill_whose_side_channel_just_failed():
    w = worker(_reg_send_inbox=queue.Queue())
    sent: list[str] = []
    w._do_send_reg_notif = lambda rid, reg: sent.append(rid)
    fut: Any = SimpleNamespace(exception=lambda: TimeoutError("no answer"))
    w._handshake_result("p-gone", fut)
    release = {"remote_engine_id": "p-gone", lc.RELEASE_KEY: True}
    w._send_registration_to_p("cmpl-a-0-1", release)  # would stall the executor 5 s
    assert sent == []
    w._handshake_result("p-gone", SimpleNamespace(exception=lambda: None))
    assert w._pdctl_life.unreachable == {}  # reachable again: releases go as before


def test_a_release_request_from_the_router_reaches_the_worker_and_frees_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
        NixlPushConnectorWorker,
    )

    from pdctl.connector import pushsched
    from pdctl.sdk import pd

    assert pd.RELEASE_PARAM == pushsched.RELEASE_PARAM  # the two sides of one contract
    s: Any = object.__new__(pushsched.PdctlPushScheduler)
    s._pdctl_aborted, s._pdctl_dropped, s._pdctl_released = {}, set(), set()
    rid = "pdctl-0123456789abcdef"
    params = {pd.RELEASE_PARAM: [rid, "0", 7]}  # short and non-string ids are ignored
    req = SimpleNamespace(kv_transfer_params=params, prompt_token_ids=[0], request_id="x")
    assert s.get_num_new_matched_tokens(req, 0) == (0, False)  # an ordinary request
    assert s._pdctl_released == {rid}
    assert params == {}  # taken once, even if vLLM asks again
    s.get_num_new_matched_tokens(req, 0)
    assert s._pdctl_released == {rid}

    held, other = f"cmpl-{rid}-0-1234abcd", "cmpl-pdctl-ffff-0-1234abcd"
    w = worker(
        _reqs_to_send={held: 99.0, other: 99.0},
        _reg_send_inbox=queue.Queue(),
        _push_writer_wake=threading.Event(),
        _pending_d_registrations={f"cmpl-{rid}-0-bbbbbbbb": {}},
    )
    released: list[tuple[str, str]] = []
    w._lease_released = lambda r, reason: released.append((r, reason))
    meta = SimpleNamespace(
        **{pushsched.META_ATTR: {"aborted": {}, "dropped": [], "expired": [], "released": [rid]}}
    )
    monkeypatch.setattr(NixlPushConnectorWorker, "start_load_kv", lambda self, m: None)
    w.start_load_kv(meta)
    assert w._push_writer_wake.is_set()
    w._release_leases(now=time.perf_counter())
    assert w._reqs_to_send == {held: 0.0, other: 99.0}
    assert released == [(held, rv.ROUTER_RELEASE)]
    w._unpark_released()  # a parked registration for it is never written
    assert w._pending_d_registrations == {}


def test_a_cut_side_channel_fails_registrations_and_loses_releases(tmp_path: Any) -> None:
    from pdctl.connector.failpoints import SideChannelCut

    switch = tmp_path / "cut"
    w = worker(_reg_send_inbox=queue.Queue())
    w._pdctl_life.cut = SideChannelCut.parse(f"refused:while:{switch}")
    failures: list[str] = []
    w._log_failure = lambda failure_type, req_id, error: failures.append(failure_type)
    sent: list[str] = []
    w._do_send_reg_notif = lambda rid, reg: sent.append(rid)
    w._ensure_handshake = lambda *a, **kw: None  # handshaken: messages would go at once
    reg = {"remote_engine_id": "p", "remote_host": "h", "remote_port": 1, "remote_tp_size": 1}
    release = {**reg, lc.RELEASE_KEY: True}
    switch.write_text("refused\n")
    w._send_registration_to_p("cmpl-a-0-1", reg)
    w._send_registration_to_p("cmpl-b-0-1", release)
    assert w._failed_recv_reqs.get_nowait() == "cmpl-a-0-1"  # failed as vLLM fails it
    assert failures == ["push_reg_handshake_failed"]
    assert sent == []  # the release went nowhere
    assert w._failed_recv_reqs.empty()
    switch.unlink()
    w._send_registration_to_p("cmpl-c-0-1", reg)  # the switch is off: as usual
    assert sent == ["cmpl-c-0-1"]


class _RecordingAgent:
    """NIXL agent stand-in: records which thread each call comes from."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, str]] = []
        self.got = threading.Event()

    def send_notif(self, agent: str, notif_msg: bytes) -> None:
        self.sent.append((agent, notif_msg, threading.current_thread().name))
        self.got.set()

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}


@pytest.fixture
def writer_worker() -> Any:
    """A worker whose real vLLM writer loop runs on its own thread, as in vLLM."""
    agent = _RecordingAgent()
    w = worker(
        nixl_wrapper=agent,
        _handshake_lock=threading.Lock(),
        _remote_agents={"decode-engine": {(0, 0): "agent-d0"}},
        _reg_send_inbox=queue.Queue(),
        _deferred_push_inbox=queue.Queue(),
        _finished_blocks_inbox=queue.Queue(),
        _push_finished_blocks={},
        _pending_d_registrations={},
        _push_writer_wake=threading.Event(),
        _push_writer_stop=threading.Event(),
        xfer_stats=SimpleNamespace(record_failed_transfer=lambda: None),
        _TRANSFER_MODE="push",
    )
    w._push_writer_thread = threading.Thread(
        target=w._push_writer_loop, name="nixl-push-writer", daemon=True
    )
    w._push_writer_thread.start()
    yield w
    w._push_writer_stop.set()
    w._push_writer_wake.set()
    w._push_writer_thread.join(timeout=5)


def _sent(w: Any) -> list[tuple[str, bytes, str]]:
    assert w.nixl_wrapper.got.wait(timeout=5), "no notification was sent"
    sent: list[tuple[str, bytes, str]] = w.nixl_wrapper.sent
    return sent


def test_a_failed_write_seen_by_the_engine_thread_is_told_from_the_writer(writer_worker: Any):
    w = writer_worker
    w._pdctl_life.targets["cmpl-w-0-aaaaaaaa"] = ("decode-engine", "cmpl-w-0-bbbbbbbb")
    # the engine thread (here: the test's) sees the WRITE fail in get_transfer_results
    assert w._handle_failed_transfer("cmpl-w-0-aaaaaaaa", None) is True
    assert _sent(w) == [("agent-d0", lc.encode(lc.FAILED, "cmpl-w-0-bbbbbbbb"), "nixl-push-writer")]
    assert w._pdctl_life.release["cmpl-w-0"][1] == rv.WRITE_FAILED


def test_a_failure_sent_after_a_handshake_leaves_from_the_writer(writer_worker: Any):
    from concurrent.futures import Future

    w = writer_worker
    fut: Future[Any] = Future()
    w._ensure_handshake = lambda *a, **k: fut
    reg = {
        "decode_engine_id": "decode-engine",
        "decode_host": "127.0.0.1",
        "decode_port": 1,
        "decode_tp_size": 1,
        "request_id": "cmpl-h-0-cccccccc",
    }
    w._notify_decode(reg, lc.FAILED)
    assert w.nixl_wrapper.sent == []  # waits for the handshake
    done = threading.Thread(target=fut.set_result, args=(({}, 0.0),), name="nixl-handshake")
    done.start()  # the handshake executor completes it: its callbacks run there
    done.join()
    assert _sent(w) == [("agent-d0", lc.encode(lc.FAILED, "cmpl-h-0-cccccccc"), "nixl-push-writer")]


def test_on_the_writer_thread_the_notification_goes_at_once(writer_worker: Any):
    w = writer_worker
    w._pdctl_life.cut = None
    w._pdctl_life.unreachable = {}
    w._ensure_handshake = lambda *a, **k: None  # handshake done already
    reg = {
        lc.RELEASE_KEY: True,
        "remote_engine_id": "decode-engine",
        "remote_host": "127.0.0.1",
        "remote_port": 1,
        "remote_tp_size": 1,
        "prefill_request_id": "r-0",
    }
    # D's release of an aborted request, on vLLM's registration path
    w._reg_send_inbox.put(("cmpl-r-0-dddddddd", reg))
    w._push_writer_wake.set()
    msg = lc.encode(lc.RELEASE, "cmpl-r-0", "r-0")
    assert _sent(w) == [("agent-d0", msg, "nixl-push-writer")]
    assert w._pdctl_life.outbox.empty()


def test_decode_refuses_a_layout_its_prefill_will_refuse_and_releases_the_kv():
    from vllm.distributed.kv_transfer.kv_connector.utils import TransferTopology

    agent = _RecordingAgent()

    def topo(tp: int) -> Any:  # decode's own, 2 KV heads (the tiny model)
        return TransferTopology(
            tp_rank=0,
            tp_size=tp,
            block_size=32,
            engine_id="decode-engine",
            is_mla=False,
            is_mamba=False,
            total_num_kv_heads=2,
            attn_backends=[],
        )

    w = worker(
        nixl_wrapper=agent,
        transfer_topo=topo(4),
        world_size=4,
        _handshake_lock=threading.Lock(),
        _remote_agents={"prefill-engine": {(0, 0): "agent-p0"}},
        _reg_send_inbox=queue.Queue(),
        _push_writer_wake=threading.Event(),
        _push_writer_thread=threading.current_thread(),  # as if on the writer
    )
    w._ensure_handshake = lambda *a, **k: None
    reg = {
        "request_id": "cmpl-l-0-eeeeeeee",
        "remote_engine_id": "prefill-engine",
        "remote_host": "127.0.0.1",
        "remote_port": 1,
        "remote_tp_size": 1,
        "decode_tp_size": 4,
    }
    w._send_registration_to_p("cmpl-l-0-eeeeeeee", reg)
    assert w._failed_recv_reqs.get_nowait() == "cmpl-l-0-eeeeeeee"  # fails at once
    # no registration: a release, so the prefill frees its KV now
    assert agent.sent == [("agent-p0", lc.encode(lc.RELEASE, "cmpl-l-0"), "MainThread")]
    # a layout the prefill accepts registers as before
    sent: list[str] = []
    w._do_send_reg_notif = lambda rid, rd: sent.append(rid)
    w._send_registration_to_p("cmpl-m-0-ffffffff", {**reg, "decode_tp_size": 2})
    w.transfer_topo = topo(2)
    w._send_registration_to_p("cmpl-n-0-ffffffff", {**reg, "decode_tp_size": 2})
    assert sent == ["cmpl-m-0-ffffffff", "cmpl-n-0-ffffffff"]
    assert w._failed_recv_reqs.empty()
