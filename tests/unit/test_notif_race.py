"""The decode's notifications against vLLM's writer thread: a notification the writer
puts while pdctl's pass is under way (after pdctl took the queue's items, before vLLM's
``_get_new_notifs`` drains it) still passes pdctl first, on the next engine step; under
two threads and thousands of notifications none is lost, doubled or reordered. pdctl's
real worker class (vLLM's push worker with every pdctl hook) with only the state these
paths read, vLLM's own queue and ``_get_new_notifs``, a real writer thread."""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

# only the distributions themselves may be missing (a skip, a failure under --strict-skips);
# their internals are plain imports below: a moved module is an error, never a skip
pytest.importorskip("vllm", reason="vllm is not installed (pip install 'pdctl[cpu]')")
pytest.importorskip("torch", reason="torch is not installed (pip install 'pdctl[cpu]')")

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from pdctl.connector import kvdigest
from pdctl.connector import lifecycle as lc
from pdctl.connector.flightbook import FlightBook
from pdctl.connector.kvverify import KvVerifier
from pdctl.connector.push import PdctlPushWorker


class Cfg:
    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return default


def decode_worker(awaiting: list[str]) -> Any:
    """A decode's push worker (TP 1) awaiting one WRITE for each of ``awaiting``."""
    w: Any = object.__new__(PdctlPushWorker)
    w._pdctl_life = lc._State(grace_s=1.0)
    w._pdctl_kv = KvVerifier(SimpleNamespace(world_size=1), Cfg(), lambda _r, _i: None)
    w._flight = FlightBook(0)
    w._pending_completion_notifs = queue.Queue()  # as vLLM's __init__ creates it
    w._recving_metadata = {
        rid: SimpleNamespace(pp_size=1, local_block_ids=([3, 4],)) for rid in awaiting
    }
    w._recving_transfers = {}
    w._failed_recv_reqs = queue.Queue()
    w._reqs_to_send = {}
    w._reqs_to_process = set()
    w.consumer_notification_counts_by_req = collections.defaultdict(int)
    w.world_size = 1
    w.transfer_topo = object()
    w._lease_extension = 30
    w.xfer_stats = SimpleNamespace(record_notification_after_expiry=lambda: None)
    return w


class Writer:
    """vLLM's ``nixl-push-writer``: puts one notification into the worker's queue (read
    from the worker each time, as vLLM's writer loop does) when :meth:`in_window` asks."""

    def __init__(self, w: Any, notif: bytes) -> None:
        self.window = threading.Event()
        self.put = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(w, notif), daemon=True)
        self.thread.start()

    def _run(self, w: Any, notif: bytes) -> None:
        assert self.window.wait(10)
        w._pending_completion_notifs.put(notif)
        self.put.set()

    def in_window(self) -> None:
        self.window.set()
        assert self.put.wait(10), "the writer thread could not put its notification"
        self.thread.join(10)


RID = "cmpl-race-0-1234abcd"
TAGGED = kvdigest.encode([(3, 0xA1), (4, 0xB2)], f"{RID}:1".encode())
FAILED = lc.encode(lc.FAILED, RID)


@pytest.mark.parametrize("notif", [TAGGED, FAILED], ids=["digest-tagged", "pdctl-failed"])
def test_a_notification_put_between_pdctls_drain_and_vllms_passes_pdctl_first(
    monkeypatch: pytest.MonkeyPatch, notif: bytes
) -> None:
    w = decode_worker([RID])
    writer = Writer(w, notif)
    vllm_drain = NixlPushConnectorWorker._get_new_notifs
    calls = []

    def window_then_vllm(self: Any) -> set[str]:
        # pdctl's pass has taken the queue's items: vLLM's drain is next
        calls.append(1)
        if len(calls) == 1:
            writer.in_window()
        return vllm_drain(self)

    monkeypatch.setattr(NixlPushConnectorWorker, "_get_new_notifs", window_then_vllm)
    w._pending_completion_notifs.put(b"HB:cmpl-other-0")  # a step with something to take
    assert w._get_new_notifs() == set()
    # nothing of it reached vLLM this step; the next engine step takes it
    assert RID not in w._recving_transfers
    assert w._failed_recv_reqs.empty()
    w._get_new_notifs()
    if notif == TAGGED:  # digests kept for the check, vLLM counted the WRITE
        assert w._pdctl_kv.expected[RID] == {3: 0xA1, 4: 0xB2}
        assert RID in w._recving_transfers
    else:  # the receive failed at once
        assert w._failed_recv_reqs.get_nowait() == RID
    assert w._pending_completion_notifs.empty()


def test_two_threads_lose_double_or_reorder_no_notification(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 4000
    sent: list[bytes] = []
    for i in range(n):
        body = f"cmpl-{i}-0-1234abcd:1".encode()
        sent.append(
            [
                body,
                kvdigest.encode([(i, i + 1)], body),
                lc.encode(lc.FAILED, f"cmpl-{i}-0-1234abcd"),
                f"HB:cmpl-{i}-0".encode(),
            ][i % 4]
        )
    failing = [f"cmpl-{i}-0-1234abcd" for i in range(2, n, 4)]
    w = decode_worker(failing)
    seen: list[bytes] = []  # what vLLM's drain read, in order

    def vllm_drain(self: Any) -> set[str]:  # vLLM's loop: get_nowait until empty
        while True:
            try:
                seen.append(self._pending_completion_notifs.get_nowait())
            except queue.Empty:
                return set()

    monkeypatch.setattr(NixlPushConnectorWorker, "_get_new_notifs", vllm_drain)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads as often as the interpreter can
    try:
        go = threading.Event()

        def write() -> None:
            go.wait(10)
            for i, notif in enumerate(sent):
                w._pending_completion_notifs.put(notif)
                if i % 16 == 15:
                    time.sleep(0)  # let the engine thread in

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        steps = 0
        while writer.is_alive():
            w._get_new_notifs()
            steps += 1
            go.set()
        writer.join()
    finally:
        sys.setswitchinterval(interval)
    w._get_new_notifs()  # what the writer put during the last step
    assert w._pending_completion_notifs.empty()
    plain = [t.plain if (t := kvdigest.parse(x)) else x for x in sent]
    assert seen == [x for x in plain if lc.decode(x) is None]
    failed = []
    while not w._failed_recv_reqs.empty():
        failed.append(w._failed_recv_reqs.get_nowait())
    assert failed == failing
    assert w._pdctl_kv.expected == {f"cmpl-{i}-0-1234abcd": {i: i + 1} for i in range(1, n, 4)}
    assert steps > 1
