"""The notification queue pdctl holds (``pdctl.connector.notifq``): converted in place
(the writer's reference stays good), the writer's puts set aside while held and queued
after the refill on release, arrival times kept for the flight recorder; the connector
converts vLLM's queue when it takes over the worker, before vLLM starts the writer."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

# only the distribution may be missing (a skip, a failure under --strict-skips)
pytest.importorskip("vllm", reason="vllm is not installed (pip install 'pdctl[cpu]')")

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from pdctl.connector.notifq import HeldQueue, holdable
from pdctl.connector.push import PdctlPushWorker, PdctlStats


def drain(q: queue.Queue[bytes]) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def test_converted_in_place_keeping_what_it_holds():
    q: queue.Queue[bytes] = queue.Queue()
    q.put(b"a:1")
    held = holdable(q)
    assert held is q
    assert type(q) is HeldQueue
    assert holdable(q) is q  # once
    q.put(b"b:1")
    assert drain(q) == [b"a:1", b"b:1"]


def test_a_put_while_held_waits_for_the_release_after_the_refill():
    q = holdable(queue.Queue())
    writers_ref = q  # what vLLM's writer thread puts into
    q.put(b"a:1")
    q.put(b"b:1")
    assert q.hold() == [b"a:1", b"b:1"]
    assert q.empty()
    t = threading.Thread(target=writers_ref.put, args=(b"c:1",))
    t.start()
    t.join(10)
    assert q.empty()  # set aside, not queued
    q.refill([b"b:1"])
    assert drain(q) == [b"b:1"]  # vLLM's drain reads exactly the refill
    q.release()
    assert drain(q) == [b"c:1"]  # the next step's
    q.hold()
    with pytest.raises(RuntimeError, match="already held"):
        q.hold()


def test_the_release_queues_after_what_vllm_left():
    q = holdable(queue.Queue())
    q.hold()
    q.put(b"late:1")
    q.refill([b"x:1", b"y:1"])
    assert q.get_nowait() == b"x:1"  # vLLM stopped early (an error)
    q.release()
    assert drain(q) == [b"y:1", b"late:1"]


def test_arrival_times_survive_the_hold():
    q = holdable(queue.Queue())
    q.taken = []
    t0 = time.monotonic()
    q.put(b"a:1")
    q.put(b"HB:x")
    t1 = time.monotonic()
    q.hold()
    q.put(b"b:1")  # while held
    t2 = time.monotonic()
    q.release()
    time.sleep(0.01)
    q.hold()
    q.release()
    [(a, ta), (b, tb)] = q.taken  # heartbeats are not noted
    assert (a, b) == (b"a:1", b"b:1")
    assert t0 <= ta <= t1 <= tb <= t2


def test_a_queue_of_another_kind_is_refused_by_name():
    with pytest.raises(TypeError, match="_pending_completion_notifs is a LifoQueue"):
        holdable(queue.LifoQueue())


class Cfg:
    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return default


def test_the_connector_converts_vllms_queue_before_the_writer_starts():
    w: Any = object.__new__(NixlPushConnectorWorker)
    vllms: queue.Queue[bytes] = queue.Queue()
    w._pending_completion_notifs = vllms  # vLLM's __init__; register_kv_caches is later
    w._kv_lease_duration = 30
    w.xfer_stats = PdctlStats()
    w.nixl_wrapper = SimpleNamespace(make_prepped_xfer=lambda *a, **k: None)
    w.tp_rank = 0
    PdctlPushWorker.attach(w, SimpleNamespace(kv_transfer_config=Cfg()))
    assert w._pending_completion_notifs is vllms
    assert type(vllms) is HeldQueue
    assert vllms.taken == []  # the flight recorder is on by default
