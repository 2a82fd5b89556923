"""Per-request flight events: when each step of the push protocol happened, per request.

The rendezvous book (:mod:`pdctl.connector.book`) counts; this module timestamps. Each
hook notes ``(request, event, time.monotonic())`` on the instance where it happens (the
schema is :mod:`pdctl.sdk.metrics.flight`):

* scheduler side (:class:`FlightConnector`): arrival (vLLM's own stamp), admission
  (blocks allocated), first scheduled step, finish;
* push worker (:class:`FlightWorker`): finished blocks and registrations reaching the
  writer thread, WRITEs posted and completed (with NIXL's telemetry per request:
  transfer and post time, bytes, descriptors), registrations sent, WRITE notifications
  arriving at the writer and picked up by the engine.

Delivery: the events join the rendezvous events in vLLM's KV-connector stats payload
(kind ``"f"``, which the rendezvous fold ignores), reach the API server with vLLM's own
stats, and :class:`FlightRing` keeps the most recent ``pdctl_flight_records`` requests
(default 256) and publishes them on the instance's ``/metrics`` as offsets from each
request's arrival. Every time is read from this host's monotonic clock (system-wide, so
the scheduler, workers and API server agree); nothing compares two hosts' clocks.
Hooks never raise into vLLM: an error logs once and turns the recorder off.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from pdctl.connector import kvdigest
from pdctl.connector.compat import PUSH_CONNECTOR, vllm_class
from pdctl.connector.flightbook import FlightBook, FlightRing, records_setting
from pdctl.connector.notifq import HeldQueue, holdable
from pdctl.sdk.metrics import flight as fl

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPushConnector
else:  # nixl/connector.py in vLLM 0.32/0.33, nixl/push_connector.py in vLLM main
    NixlPushConnector = vllm_class("NixlPushConnector", PUSH_CONNECTOR)

_log = logging.getLogger("vllm.pdctl.connector")


def _ship(stats: KVConnectorStats | None, events: list[list[object]]) -> None:
    add = getattr(stats, "add_events", None)
    if events and callable(add):
        add(events)


# ---------------------------------------------------------------------- scheduler


def _arrival_mono(arrival_wall: float) -> float:
    """vLLM stamps arrival with the wall clock; move it onto the monotonic clock (same
    host, one reading of each)."""
    return time.monotonic() - max(0.0, time.time() - arrival_wall)


class FlightConnector(NixlPushConnector):
    """Scheduler-side flight hooks; the worker side is :class:`FlightWorker`."""

    _flight: FlightBook

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        cap = records_setting(vllm_config) if self.connector_scheduler is not None else 0
        self._flight = FlightBook(cap)

    def _note_arrival(self, request: Any) -> None:
        arrival = getattr(request, "arrival_time", None)
        if isinstance(arrival, (int, float)):
            self._flight.mark(request.request_id, fl.ARRIVED, _arrival_mono(float(arrival)))

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        self._flight.guard(self._note_arrival, request)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        self._flight.guard(self._flight.mark, request.request_id, fl.ADMITTED)
        return super().update_state_after_alloc(request, blocks, num_external_tokens)

    def _note_scheduled(self, scheduler_output: Any) -> None:
        now = time.monotonic()
        for rid in getattr(scheduler_output, "num_scheduled_tokens", None) or {}:
            self._flight.mark(rid, fl.SCHEDULED, now)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        self._flight.guard(self._note_scheduled, scheduler_output)
        return super().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: Any) -> Any:
        self._flight.guard(self._flight.mark, request.request_id, fl.FINISHED)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> Any:
        self._flight.guard(self._flight.mark, request.request_id, fl.FINISHED)
        return super().request_finished_all_groups(request, block_ids)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.connector_scheduler is None:
            return super().get_kv_connector_stats()
        events = self._flight.drain()
        if not events:
            return None
        stats = self.build_kv_connector_stats()
        _ship(stats, events)
        return stats


# ---------------------------------------------------------------------- worker


def _plain(notif: bytes) -> bytes:
    """vLLM's notification without the digests the KV check puts in front of it."""
    parsed = kvdigest.decode(notif)
    return notif if parsed is None else parsed[1]


class FlightWorker(NixlPushConnectorWorker):
    """Push-worker flight hooks (installed with the rendezvous hooks; they only observe
    and call vLLM's own methods)."""

    _flight: FlightBook

    def attach_flight(self, vllm_config: Any) -> None:
        enabled = int(getattr(self, "tp_rank", 0) or 0) == 0
        self._flight = FlightBook(records_setting(vllm_config) if enabled else 0)
        q = getattr(self, "_pending_completion_notifs", None)
        if self._flight.on and isinstance(q, queue.Queue):
            holdable(q).taken = []  # the queue notes when each notification was put

    # prefill: a decode registration reached the writer
    def _pop_matching_finished_blocks(self, request_id: str) -> Any:
        self._flight.guard(self._flight.mark, request_id, fl.REG_ARRIVED)
        return super()._pop_matching_finished_blocks(request_id)

    # prefill: finished blocks reached the writer
    def _pop_matching_registration(self, request_id: str) -> Any:
        self._flight.guard(self._flight.mark, request_id, fl.BLOCKS_READY)
        return super()._pop_matching_registration(request_id)

    # prefill: the WRITEs of one request are posted here (possibly after a handshake)
    def _xfer_blocks_for_req(self, req_id: str, meta: Any) -> Any:
        self._flight.guard(self._flight.mark, req_id, fl.WRITE_POSTING)
        try:
            return super()._xfer_blocks_for_req(req_id=req_id, meta=meta)
        finally:
            self._flight.guard(self._flight.mark, req_id, fl.WRITE_POSTED)

    # both: poll one request at a time so NIXL's telemetry can be attributed to it
    def _pop_done_transfers(self, transfers: dict[str, list[int]]) -> tuple[set[str], set[str]]:
        if not self._flight.on or not transfers:
            return super()._pop_done_transfers(transfers)
        done: set[str] = set()
        failed: set[str] = set()
        data: dict[str, list[Any]] = getattr(self.xfer_stats, "data", {})
        for req_id in list(transfers):
            one = {req_id: transfers[req_id]}
            before = len(data.get("transfer_duration") or ())
            d, f = super()._pop_done_transfers(one)
            done |= d
            failed |= f
            if req_id in one:
                transfers[req_id] = one[req_id]
            else:
                del transfers[req_id]
            self._flight.guard(self._attribute, req_id, data, before)
        return done, failed

    def _attribute(self, req_id: str, data: dict[str, list[Any]], before: int) -> None:
        for key, name in (
            ("transfer_duration", fl.XFER_S),
            ("post_duration", fl.POST_S),
            ("bytes_transferred", fl.BYTES),
            ("num_descriptors", fl.DESCRIPTORS),
        ):
            new = (data.get(key) or [])[before:]
            if new:
                self._flight.add(req_id, name, float(sum(new)))

    # decode: a registration left for the prefill
    def _do_send_reg_notif(self, req_id: str, reg_data: dict[str, Any]) -> None:
        super()._do_send_reg_notif(req_id, reg_data)
        self._flight.guard(self._flight.mark, req_id, fl.REG_SENT)

    # decode: WRITE notifications the writer thread received and the engine picked up
    def _get_new_notifs(self) -> set[str]:
        out: set[str] = super()._get_new_notifs()
        q = self._pending_completion_notifs
        if isinstance(q, HeldQueue) and q.taken:
            taken, q.taken = q.taken, []
            # pdctl's pass took them (pdctl.connector.notifq); a request's notifications
            # of one call count once, at the first one's arrival
            first: dict[bytes, float] = {}
            for item, t in taken:
                first.setdefault(_plain(item), t)
            self._flight.guard(self._note_notifs, list(first.items()))
        return out

    def _note_notifs(self, taken: list[tuple[bytes, float]]) -> None:
        for item, t in taken:
            rid = item.decode("utf-8", "replace").rsplit(":", 1)[0]
            self._flight.mark(rid, fl.NOTIFIED, t)
            self._flight.add(rid, fl.NOTIFICATIONS, 1.0)

    def _note_results(self, results: Any) -> None:
        now = time.monotonic()
        for rid in results.finished_sending or ():
            self._flight.mark(rid, fl.WRITE_DONE, now)
        for rid in results.finished_recving or ():
            self._flight.mark(rid, fl.RECEIVED, now)

    def get_transfer_results(self) -> Any:
        results = super().get_transfer_results()
        self._flight.guard(self._note_results, results)
        return results

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        _ship(self.xfer_stats, self._flight.drain())
        return super().get_kv_connector_stats()


FLIGHT_HOOKS = (
    "_pop_matching_finished_blocks",
    "_pop_matching_registration",
    "_xfer_blocks_for_req",
    "_pop_done_transfers",
    "_do_send_reg_notif",
    "_get_new_notifs",
    "get_transfer_results",
    "get_kv_connector_stats",
)


# ---------------------------------------------------------------------- API server


_RING: FlightRing | None = None


def flight_ring(vllm_config: Any) -> FlightRing:
    """This process's ring, registered once with prometheus_client's default registry
    (the one vLLM serves on ``/metrics`` with a single API server)."""
    global _RING
    if _RING is None:
        _RING = FlightRing(records_setting(vllm_config))
        if _RING.capacity > 0:
            from prometheus_client import REGISTRY

            REGISTRY.register(_RING)
    return _RING
