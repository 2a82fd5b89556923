"""pdctl's KV connectors for vLLM: the push connector with live rendezvous telemetry.

Select it with ``--kv-transfer-config '{"kv_connector": "PdctlPushConnector",
"kv_connector_module_path": "pdctl.connector.push", ...}'`` (pdctl's renderer does this
by default in push mode; ``fleet.connector = "stock"`` selects vLLM's own).

:class:`PdctlPushConnector` *is* vLLM's ``NixlPushConnector``: construction, matching,
WRITEs and notifications are vLLM's code, unchanged. It adds two things:

* **Telemetry.** The push worker is given a subclass whose overrides observe vLLM's
  decisions (a registration or finished prefill was matched or parked, WRITEs
  completed, a lease released a request, a decode registration was sent or answered)
  and feed :class:`~pdctl.connector.book.RendezvousBook`. The book's events travel in
  vLLM's own KV-connector stats (one extra key) to the API server, where
  :class:`PdctlPromMetrics` publishes the ``pdctl:`` series on ``/metrics``. Telemetry
  never raises into vLLM: a failing hook logs once and turns itself off.
* **Small-machine knobs** (``kv_connector_extra_config``): ``pdctl_nixl_progress_thread``
  (default true) — false creates the NIXL agent without UCX's busy-polling progress
  thread (transfers still progress: the connector polls when it checks transfer state
  and drains notifications); ``pdctl_reserve_kv_core`` (default true) — false keeps the
  worker on the cores it was given instead of vLLM re-pinning it to the last core of
  each NUMA node on the CPU platform. :class:`PdctlPullConnector` offers the same knobs
  for pull mode (no rendezvous there).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
    NixlBaseConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
    NixlPromMetrics,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import get_base_request_id

from pdctl.connector.amx import allow_amx
from pdctl.connector.book import RendezvousBook, fold
from pdctl.connector.compat import PULL_CONNECTOR, vllm_class
from pdctl.connector.events import FLIGHT_HOOKS, FlightConnector, FlightWorker, flight_ring
from pdctl.connector.kvverify import ASK_KEY, KvVerifier
from pdctl.connector.lifecycle import LifecycleWorker
from pdctl.connector.notifq import holdable
from pdctl.connector.pushsched import RELEASE_KEY, PdctlPushScheduler
from pdctl.sdk.metrics import flight as fl
from pdctl.sdk.metrics import rendezvous as rv

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector
else:  # nixl/connector.py in vLLM 0.32/0.33, nixl/pull_connector.py in vLLM main
    NixlPullConnector = vllm_class("NixlPullConnector", PULL_CONNECTOR)

# a child of "vllm" so messages land in the instance log in vLLM's format
_log = logging.getLogger("vllm.pdctl.connector")

EVENTS_KEY = "pdctl_rendezvous"
"""The key of the book's events inside vLLM's NIXL stats payload."""
PROGRESS_THREAD = "pdctl_nixl_progress_thread"
RESERVE_KV_CORE = "pdctl_reserve_kv_core"
SYNC_MODE = "pdctl_nixl_sync_mode"
SYNC_MODES = ("strict", "rw", "none")
"""Values of :data:`SYNC_MODE`: NIXL's agent thread-sync modes (``NIXL_THREAD_SYNC_*``)."""


# ---------------------------------------------------------------------- CPU knobs


def _extra(vllm_config: Any, key: str, default: bool) -> bool:
    cfg = getattr(vllm_config, "kv_transfer_config", None)
    if cfg is None:
        return default
    value = cfg.get_from_extra_config(key, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return bool(value)


def _sync_mode(vllm_config: Any, config_cls: Any) -> Any:
    """The agent's thread-sync mode when the progress thread is off.

    vLLM calls into one agent from three threads (the push writer, the engine loop when
    it checks transfers and sends heartbeats, the handshake executor). NIXL's Python
    wrapper picks ``NIXL_THREAD_SYNC_NONE`` unless its listen thread is on, and its UCX
    backend then creates a single-threaded UCX worker unless a progress thread runs: with
    both off nothing serialises those calls and UCX's endpoint state gets corrupted
    (prefill segfaulted in ``uct_tcp_ep_am_zcopy`` under load). ``strict`` (the default)
    makes the agent serialise every call; ``rw`` a readers-writer lock plus a
    multi-threaded UCX worker; ``none`` reproduces the crash-prone setting (A/B only).
    """
    cfg = getattr(vllm_config, "kv_transfer_config", None)
    raw = cfg.get_from_extra_config(SYNC_MODE, "strict") if cfg is not None else "strict"
    name = str(raw).strip().lower()
    if name not in SYNC_MODES:
        raise ValueError(
            f"kv_connector_extra_config.{SYNC_MODE} = {raw!r}: use one of "
            f"{', '.join(SYNC_MODES)} (strict is the safe default)"
        )
    enum: Any = getattr(sys.modules[config_cls.__module__], "nixl_thread_sync_t", None)
    if enum is None:  # an older NIXL without sync modes: keep its default
        return None
    return enum[f"NIXL_THREAD_SYNC_{name.upper()}"]


@contextlib.contextmanager
def _cpu_knobs(vllm_config: Any, role: Any) -> Iterator[None]:
    """Apply the knobs while vLLM constructs the connector worker, and only then (the
    scheduler-side connector creates no NIXL agent)."""
    if role != KVConnectorRole.WORKER:
        yield
        return
    if allow_amx():
        _log.info("pdctl: this worker may use AMX tiles (granted before vLLM's AMX kernels)")
    module: Any = sys.modules[NixlBaseConnectorWorker.__module__]
    original: Any = getattr(module, "nixl_agent_config", None)
    no_thread = not _extra(vllm_config, PROGRESS_THREAD, True) and original is not None
    keep_cores = not _extra(vllm_config, RESERVE_KV_CORE, True)
    cores = os.sched_getaffinity(0) if keep_cores else None
    if no_thread:
        sync = _sync_mode(vllm_config, original)
        extra = {} if sync is None else {"sync_mode": sync}
        module.nixl_agent_config = functools.partial(original, enable_prog_thread=False, **extra)
    try:
        yield
    finally:
        if no_thread:
            module.nixl_agent_config = original
            _log.info(
                "pdctl: NIXL agent created without its progress thread (sync mode %s)",
                getattr(sync, "name", sync),
            )
        if cores is not None and os.sched_getaffinity(0) != cores:
            os.sched_setaffinity(0, cores)
            _log.info("pdctl: kept the worker on cores %s (no KV core reservation)", sorted(cores))


# ---------------------------------------------------------------------- stats path


class PdctlStats(NixlKVConnectorStats):
    """vLLM's NIXL stats plus the rendezvous book's events under :data:`EVENTS_KEY`."""

    def reset(self) -> None:
        super().reset()  # type: ignore[no-untyped-call]
        self.data[EVENTS_KEY] = []

    def _events(self) -> list[Any]:
        events: list[Any] = self.data.setdefault(EVENTS_KEY, [])
        return events

    def record_transfer(self, res: Any) -> None:
        super().record_transfer(res)
        total = getattr(res, "totalBytes", None)
        if isinstance(total, (int, float)) and total > 0:
            self._events().append(["c", rv.BYTES_PUSHED, "", float(total)])

    def add_events(self, events: list[list[object]]) -> None:
        self._events().extend(events)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self._events()  # payloads from msgpack may lack the key
        return super().aggregate(other)

    def is_empty(self) -> bool:
        return super().is_empty() and not self.data.get(EVENTS_KEY)


def _labelled(metric: Any, engine_values: list[object], label: str) -> Any:
    return metric.labels(*engine_values, label) if label else metric.labels(*engine_values)


class PdctlPromMetrics(NixlPromMetrics):
    """vLLM's NIXL series plus the ``pdctl:`` rendezvous series."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._flight = flight_ring(vllm_config)
        self._pdctl: dict[str, Any] = {}
        gauge: Any = self._gauge_cls
        counter: Any = self._counter_cls
        histogram: Any = self._histogram_cls
        for m in rv.METRICS:
            names = [*labelnames, *m.labels]
            if m.kind == "gauge":
                metric = gauge(
                    name=m.name,
                    documentation=m.help,
                    multiprocess_mode="mostrecent",
                    labelnames=names,
                )
            elif m.kind == "counter":
                metric = counter(name=m.name, documentation=m.help, labelnames=names)
            else:
                metric = histogram(
                    name=m.name,
                    documentation=m.help,
                    buckets=list(rv.WAIT_BUCKETS),
                    labelnames=names,
                )
            self._pdctl[m.name] = metric
            # every series with its known label values exists at 0 from the start
            for values in per_engine_labelvalues.values():
                for combo in itertools.product(*m.values):
                    metric.labels(*values, *combo)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        super().observe(transfer_stats_data, engine_idx)
        self._flight.feed(transfer_stats_data.get(EVENTS_KEY))
        values = self.per_engine_labelvalues.get(engine_idx)
        if values is None:
            return
        for kind, name, label, value in fold(transfer_stats_data.get(EVENTS_KEY) or []):
            child = _labelled(self._pdctl[name], values, label)
            if kind == "c":
                child.inc(value)
            elif kind == "h":
                child.observe(value)
            else:
                child.set(value)


# ---------------------------------------------------------------------- worker hooks


class _Telemetry:
    """The book plus its lock; each hook reports through :meth:`record`, which never
    lets an error escape into vLLM."""

    def __init__(self, worker: Any, expire_after_s: float) -> None:
        self.book = RendezvousBook(expire_after_s=expire_after_s)
        self.lock = threading.Lock()
        self.enabled = int(getattr(worker, "tp_rank", 0) or 0) == 0
        self._failed = False

    def record(self, fn: Any, *args: Any) -> None:
        if not self.enabled or self._failed:
            return
        try:
            with self.lock:
                fn(*args)
        except Exception:
            self._failed = True
            _log.exception("pdctl: rendezvous telemetry disabled after an error")

    def drain(self) -> list[list[object]]:
        if not self.enabled or self._failed:
            return []
        with self.lock:
            return self.book.drain(time.monotonic())


class PdctlPushWorker(FlightWorker, LifecycleWorker):
    """vLLM's push worker with observation hooks (rendezvous telemetry, the flight
    recorder) and the lifecycle messages of :mod:`pdctl.connector.lifecycle`, installed
    on a constructed worker by :meth:`attach`. The flight hooks come first in the MRO:
    they only observe, then call on."""

    _pdctl: _Telemetry
    _pdctl_kv: KvVerifier

    @classmethod
    def attach(cls, worker: NixlPushConnectorWorker, vllm_config: Any) -> None:
        lease = float(getattr(worker, "_kv_lease_duration", 0) or 0)
        # before register_kv_caches starts vLLM's writer thread: the queue it puts into
        holdable(worker._pending_completion_notifs)
        worker.__class__ = cls
        assert isinstance(worker, PdctlPushWorker)
        worker._pdctl = _Telemetry(worker, expire_after_s=max(60.0, 4 * lease))
        stats = PdctlStats()
        stats.aggregate(worker.xfer_stats)
        worker.xfer_stats = stats
        worker.attach_flight(vllm_config)
        worker._lifecycle_init(vllm_config)
        worker._pdctl_kv = KvVerifier(worker, vllm_config.kv_transfer_config, worker._kv_checked)
        worker.nixl_wrapper.make_prepped_xfer = worker._pdctl_kv.tag(
            worker.nixl_wrapper.make_prepped_xfer
        )

    # registration arrived on the prefill (writer thread)
    def _pop_matching_finished_blocks(self, request_id: str) -> Any:
        found = super()._pop_matching_finished_blocks(request_id)
        self._pdctl.record(
            self._pdctl.book.registration,
            request_id,
            time.monotonic(),
            found[0] if found is not None else None,
        )
        return found

    # a prefill finished (writer thread)
    def _pop_matching_registration(self, request_id: str) -> Any:
        found = super()._pop_matching_registration(request_id)
        matched = found.get("request_id") if isinstance(found, dict) else None
        if found is not None and not isinstance(matched, str):
            matched = request_id
        self._pdctl.record(self._pdctl.book.prefill, request_id, time.monotonic(), matched)
        return found

    # a decode registration left (writer thread)
    def _do_send_reg_notif(self, req_id: str, reg_data: dict[str, Any]) -> None:
        if not reg_data.get(RELEASE_KEY):
            # the digest check samples it (or not)
            self._pdctl_kv.ask(req_id, reg_data, get_base_request_id(req_id))
        super()._do_send_reg_notif(req_id, reg_data)
        if reg_data.get(RELEASE_KEY):
            return
        self._pdctl.record(self._pdctl.book.registration_sent, req_id, time.monotonic())

    def _registration_dropped(self, reg_id: str) -> None:
        self._pdctl.record(self._pdctl.book.registration_dropped, reg_id)

    # ------------------------------------------------------------------ KV digests
    # (pdctl.connector.kvverify: the prefill digests what each WRITE sends, the decode
    # checks it before vLLM hears the receive is done)

    def _kv_checked(self, result: str, request_id: str) -> None:
        self._pdctl.record(self._pdctl.book.kv_verified, result)
        name = {"ok": fl.KV_VERIFIED, "mismatch": fl.KV_MISMATCH}.get(result)
        if name is not None:  # the request's flight shows it (the router joins it)
            self._flight.guard(self._flight.add, request_id, name, 1.0)

    def _do_start_push_kv(self, request_id: str, local_block_ids: Any, reg: dict[str, Any]) -> None:
        self._pdctl_kv.asked = bool(reg.get(ASK_KEY))
        try:
            super()._do_start_push_kv(request_id, local_block_ids, reg)
        finally:
            self._pdctl_kv.asked = False

    def _xfer_blocks(
        self,
        read_spec: Any,
        dst_engine_id: str,
        request_id: str,
        remote_request_id: str,
        local_xfer_side_handle: int,
        remote_xfer_side_handle: int,
    ) -> Any:
        with self._pdctl_kv.writing(request_id, dst_engine_id):
            return super()._xfer_blocks(
                read_spec=read_spec,
                dst_engine_id=dst_engine_id,
                request_id=request_id,
                remote_request_id=remote_request_id,
                local_xfer_side_handle=local_xfer_side_handle,
                remote_xfer_side_handle=remote_xfer_side_handle,
            )

    def _apply_prefix_caching(self, *args: Any, **kw: Any) -> Any:
        remote, local = super()._apply_prefix_caching(*args, **kw)
        return self._pdctl_kv.written(remote, local)

    def _pdctl_notifs(self, notifs: list[bytes]) -> list[bytes]:
        # the digests come off before the lifecycle's and vLLM's turns (pdctl.connector.notifq)
        return super()._pdctl_notifs(self._pdctl_kv.strip(notifs))

    def _get_new_notifs(self) -> set[str]:
        done = super()._get_new_notifs()
        if self._pdctl_kv.corrupt is not None:  # a test's failpoint (lint PD042)
            self._pdctl_kv.spoil(self._recving_transfers, self._recving_metadata)
        if self._pdctl_kv.asked_ids:
            for rid in self._pdctl_kv.check(self._recving_transfers, self._recving_metadata):
                self._recving_transfers.pop(rid, None)  # vLLM must not report it received
                self._failed_recv_reqs.put(rid)
        return done

    # the connector let go of a prefill's KV early (engine thread)
    def _lease_released(self, request_id: str, reason: str) -> None:
        self._pdctl.record(
            self._pdctl.book.released_by_connector, request_id, reason, time.monotonic()
        )

    # engine main thread, every step
    def get_transfer_results(self) -> Any:
        results = super().get_transfer_results()
        now = time.monotonic()
        book = self._pdctl.book
        for rid in results.finished_sending or ():
            self._pdctl.record(book.finished_sending, rid, now)
        for rid in results.finished_recving or ():
            self._pdctl.record(book.received, rid, now)
        for rid in getattr(results, "failed_recving", None) or ():
            self._pdctl.record(book.receive_failed, rid)
        return results

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        events = self._pdctl.drain()
        if events and isinstance(self.xfer_stats, PdctlStats):
            self.xfer_stats.add_events(events)
        return super().get_kv_connector_stats()


_HOOKS = (
    "_pop_matching_finished_blocks",
    "_send_registration_to_p",
    "_handle_push_reg_notif",
    "_do_start_push_kv",
    "_xfer_blocks",
    "_apply_prefix_caching",
    "_get_new_notifs",
    "_handle_failed_transfer",
    "_ensure_handshake",
    "start_load_kv",
    "_pop_matching_registration",
    "_do_send_reg_notif",
    "get_transfer_results",
    "get_kv_connector_stats",
)


def _hooks_fit() -> bool:
    """Whether this vLLM's push worker still has every method the hooks wrap."""
    hooks = (*_HOOKS, *FLIGHT_HOOKS)
    missing = [h for h in hooks if not callable(getattr(NixlPushConnectorWorker, h, None))]
    if missing:
        _log.warning(
            "pdctl: this vLLM's push worker lacks %s; rendezvous telemetry is off "
            "(transfers are unaffected)",
            ", ".join(missing),
        )
    return not missing


# ---------------------------------------------------------------------- connectors


class PdctlPushConnector(FlightConnector):
    """vLLM's push connector with rendezvous telemetry and the small-machine knobs."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        with _cpu_knobs(vllm_config, role):
            super().__init__(vllm_config, role, kv_cache_config)
        worker = self.connector_worker
        if type(worker) is NixlPushConnectorWorker and _hooks_fit():
            PdctlPushWorker.attach(worker, vllm_config)
        if type(self.connector_scheduler) is NixlPushConnectorScheduler:
            PdctlPushScheduler.attach(self.connector_scheduler)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return PdctlStats(data=data) if data is not None else PdctlStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> PdctlPromMetrics:
        return PdctlPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


class PdctlPullConnector(NixlPullConnector):
    """vLLM's pull connector with the small-machine knobs (no push rendezvous)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        with _cpu_knobs(vllm_config, role):
            super().__init__(vllm_config, role, kv_cache_config)
