"""The push lifecycle's missing messages: every block freed, failures heard at once.

vLLM's push connector frees KV on the happy path and otherwise waits: for the prefill's
lease (P holds a finished request's KV until D's registration arrives or the lease ends)
and for the decode's watchdog (which drops a stale registration but leaves the request
waiting). pdctl's subclasses add the messages that make both sides let go early. All
transfer code stays vLLM's; these overrides call it and only decide *when* to use the
release paths vLLM already has (the lease reaper on P, the failed-receive path on D).

* **D aborts** (client gone, or the serving layer rejected the request after P took
  it): D's scheduler ships the request to its worker, which sends P a *release*
  notification through vLLM's registration path (handshake included). P expires the
  request's lease at once unless its WRITE is in flight (then the WRITE's completion
  frees it), and drops any parked registration so it never WRITEs into freed blocks.
  D frees the blocks of an aborted request that was awaiting KV after
  ``pdctl_abort_grace_s`` (default 1 s; a WRITE already on the wire lands first).
  Mirrors vLLM #46283 / #21570 (decode-side leaks) and #55470 (WRITE after the lease).
* **P's WRITE fails, or P drops a request D registered for** (its prefill aborted or
  was rejected): P sends D a *failed* notification; D fails the receive at once and
  vLLM's ``kv_load_failure_policy`` answers (error or recompute). P's KV for a failed
  WRITE is released at once too. Mirrors vLLM #50754 (failure notification).
* **D's registration watchdog** (``push_registration_timeout``) now fails the request
  instead of leaving it waiting (vLLM only drops the registration): P died or never
  answered, nothing else will tell D.

Notifications are ``pdctl-release|<id>[|<id>]:0`` (D's base request id and the id both
legs were sent with; P's own id contains one of them) and ``pdctl-failed|<id>:0`` (D's
request id): a stock vLLM peer logs them as an unknown request and ignores them. pdctl
takes them out of vLLM's notification queue before vLLM reads it, with the writer thread
held off (:mod:`pdctl.connector.notifq`).

* **P dies before its WRITE** (killed, crashed): D watches the side channel of every
  prefill it awaits KV from (:mod:`pdctl.connector.peerwatch`, every
  ``pdctl_peer_watch_s``, default 0.5 s; 0 turns it off) and fails the receive once the
  prefill is gone, instead of waiting for ``push_registration_timeout``. Mirrors vLLM
  #50754 / #21570 (decode blindness).
* **P cannot reach D's side channel** (its handshake to D fails): vLLM logs it and keeps
  the KV for the lease; P now releases it at once (D cannot be told: that is the path
  that failed; its watchdog answers).
* **P will refuse D's layout** (vLLM's ``_validate_remote_agent_handshake`` on P asserts
  that a consumer with a larger TP does not replicate its KV heads: P TP1 → D TP4 with 2
  KV heads fails every WRITE handshake): every D rank runs that same check from P's side
  before it registers (:mod:`pdctl.connector.layout`, on vLLM's ``TransferTopology``),
  and instead of registering fails the receive at once (vLLM's
  ``kv_load_failure_policy`` answers) and sends P a release, so neither side holds KV
  for a transfer that cannot happen. Both sides log the layout problem by name.

* **Nothing reaches P over the side channel** (decode cut off from it, a decode dead
  before its release went out): pdctl's router, which saw the request end without decode
  reading its KV, sends P a *release request* over HTTP
  (:mod:`pdctl.connector.pushsched`); P releases those leases at once.

**Every notification leaves from the writer thread.** vLLM's push design keeps
``send_notif`` on its ``nixl-push-writer`` thread: on GPU the defaults apply (NIXL's
progress thread on, ``sync_mode`` unset → ``NIXL_THREAD_SYNC_NONE``, no agent lock), so
a second thread calling into the agent races UCX. pdctl's failure notifications are
decided on other threads too (a failed WRITE seen by the engine thread, a handshake
completing on the handshake executor): :meth:`LifecycleWorker._send_to_engine` sends
at once only on the writer thread and otherwise queues the message in the writer's
inbox (as vLLM queues registrations), where the writer sends it on its next turn.

Every early release on P is counted by reason (``pdctl:push_released_total``), not as an
expired lease. Failpoints for the chaos suite: :mod:`pdctl.connector.failpoints`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import get_base_request_id

from pdctl.connector.failpoints import FAILPOINT_SIDE_CHANNEL as FAILPOINT_SIDE_CHANNEL
from pdctl.connector.failpoints import FAILPOINT_WRITE as FAILPOINT_WRITE
from pdctl.connector.failpoints import FAILPOINT_WRITE_DELAY as FAILPOINT_WRITE_DELAY
from pdctl.connector.failpoints import SideChannelCut, WriteDelay, failing_transfer
from pdctl.connector.failpoints import failpoint_match as failpoint_match
from pdctl.connector.layout import refusal
from pdctl.connector.notifq import NotifWorker
from pdctl.connector.peerwatch import PeerWatch
from pdctl.connector.pushsched import META_ATTR, RELEASE_KEY, PdctlPushScheduler

# why P let go of a finished request's KV before its lease ended (push_released_total)
from pdctl.sdk.metrics.rendezvous import (
    DECODE_ABORTED,
    HANDSHAKE_FAILED,
    ROUTER_RELEASE,
    WRITE_FAILED,
)

__all__ = ["RELEASE_KEY", "LifecycleWorker", "PdctlPushScheduler"]

_log = logging.getLogger("vllm.pdctl.connector")

RELEASE = "pdctl-release|"
FAILED = "pdctl-failed|"
ABORT_GRACE = "pdctl_abort_grace_s"
PEER_WATCH = "pdctl_peer_watch_s"
DRAIN = "pdctl-drain"
"""A writer-inbox entry that only makes the writer look at dropped prefills."""
REMEMBER_S = 60.0
"""How long P remembers a dropped or released id (a late registration is answered)."""


def encode(kind: str, *request_ids: str) -> bytes:
    return (kind + "|".join(r for r in request_ids if r) + ":0").encode()


def decode(notif: bytes) -> tuple[str, list[str]] | None:
    """``(kind, request ids)`` of a lifecycle notification, None for anything else."""
    for kind in (RELEASE, FAILED):
        if notif.startswith(kind.encode()):
            body = notif[len(kind) :].decode("utf-8", "replace")
            ids = [r for r in body.rpartition(":")[0].split("|") if r]
            return (kind, ids) if ids else None
    return None


def _names(key: str, request_id: str) -> bool:
    """Whether ``key`` (an id the peer knows) names ``request_id``: its base id, or a
    dash-delimited part of it (vLLM builds ``cmpl-<X-Request-Id>-0-<random>``)."""
    return get_base_request_id(request_id) == key or f"-{key}-" in f"-{request_id}-"


# ---------------------------------------------------------------------- worker


class _State:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.lock = threading.Lock()
        self.fail_at: dict[str, float] = {}
        """D: aborted request → when to fail its receive (engine thread only)."""
        self.release: dict[str, tuple[float, str]] = {}
        """P: an id D knows the request by (contained in ours) → when the release was
        asked and why (under ``lock``)."""
        self.dropped: dict[str, float] = {}
        """P: base id of a dropped prefill → when (writer thread only)."""
        self.targets: dict[str, tuple[str, str]] = {}
        """P: request → (decode engine, decode request id) of its WRITE (under lock)."""
        self.drops: queue.Queue[str] = queue.Queue()
        """P: dropped prefills, engine thread → writer thread."""
        self.unpark: queue.Queue[str] = queue.Queue()
        """P: ids of released requests whose parked registrations go (→ writer thread)."""
        self.writing = ""
        """P: the request whose WRITE the writer thread is posting."""
        self.delay: WriteDelay | None = None
        self.cut: SideChannelCut | None = None
        """D: the side-channel failpoint (off unless configured)."""
        self.delayed: set[str] = set()
        """P: requests whose WRITE the delay failpoint is holding back (writer thread)."""
        self.unreachable: dict[str, float] = {}
        """D: prefill engine → when a handshake to it failed (handshake callbacks)."""
        self.watch: PeerWatch | None = None
        self.gone: dict[str, float] = {}
        """D: requests failed because their prefill is gone (engine thread)."""
        self.outbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
        """(engine, notification) decided off the writer thread; the writer sends them."""


class LifecycleWorker(NotifWorker):
    """vLLM's push worker with the release and failure messages (see the module)."""

    _pdctl_life: _State

    def _lifecycle_init(self, vllm_config: Any) -> None:
        cfg = vllm_config.kv_transfer_config
        grace = float(cfg.get_from_extra_config(ABORT_GRACE, 1.0))
        life = self._pdctl_life = _State(grace)
        watch_s = float(cfg.get_from_extra_config(PEER_WATCH, 0.5) or 0)
        if watch_s > 0:
            life.watch = PeerWatch(watch_s)
        spec = str(cfg.get_from_extra_config(FAILPOINT_WRITE, "") or "")
        if spec:
            match = failpoint_match(spec)
            _log.warning("pdctl: failpoint %s = %r is on", FAILPOINT_WRITE, spec)
            self.nixl_wrapper.transfer = failing_transfer(
                self.nixl_wrapper.transfer, lambda: life.writing, match
            )
        delay = str(cfg.get_from_extra_config(FAILPOINT_WRITE_DELAY, "") or "")
        if delay:
            life.delay = WriteDelay.parse(delay)
            _log.warning("pdctl: failpoint %s = %r is on", FAILPOINT_WRITE_DELAY, delay)
        cut = str(cfg.get_from_extra_config(FAILPOINT_SIDE_CHANNEL, "") or "")
        if cut:
            life.cut = SideChannelCut.parse(cut)
            _log.warning("pdctl: failpoint %s = %r is on", FAILPOINT_SIDE_CHANNEL, cut)

    # ------------------------------------------------------------------ engine thread

    def start_load_kv(self, metadata: Any) -> None:
        super().start_load_kv(metadata)
        life = getattr(metadata, META_ATTR, None)
        if not life:
            return
        now = time.perf_counter()
        for rid, reg in life["aborted"].items():
            # the release travels on vLLM's registration path (handshake included)
            self._reg_send_inbox.put((rid, reg))
            if reg.get("held"):
                self._pdctl_life.fail_at[rid] = now + self._pdctl_life.grace_s
            else:  # never allocated: forget the empty receive vLLM staged for it
                self._recving_metadata.pop(rid, None)
        for rid in life["expired"]:
            if rid in self._recving_metadata:
                _log.warning("pdctl: no KV for %s before the registration timeout", rid)
                self._failed_recv_reqs.put(rid)
        if life.get("released"):
            self._release_asked(life["released"], ROUTER_RELEASE, now)
        if life["dropped"]:
            for rid in life["dropped"]:
                self._pdctl_life.drops.put(rid)
            self._reg_send_inbox.put((DRAIN, {}))  # the writer answers parked registrations
        self._push_writer_wake.set()

    def _pdctl_notifs(self, notifs: list[bytes]) -> list[bytes]:
        # D's failed and P's release messages are ours; the rest go on to vLLM
        # (pdctl.connector.notifq: the writer thread is held off meanwhile)
        keep: list[bytes] = []
        mine: list[tuple[str, list[str]]] = []
        for notif in notifs:
            parsed = decode(notif)
            (mine.append(parsed) if parsed else keep.append(notif))
        now = time.perf_counter()
        for kind, ids in mine:
            if kind == FAILED:
                rid = ids[0]
                if rid in self._recving_metadata and self._recving_metadata[rid].local_block_ids:
                    _log.warning("pdctl: prefill reports no KV will come for %s", rid)
                    self._failed_recv_reqs.put(rid)
                    self._pdctl_life.fail_at.pop(rid, None)
            else:
                self._release_asked(ids, DECODE_ABORTED, now)
        return super()._pdctl_notifs(keep)

    def _release_asked(self, keys: list[str], reason: str, now: float) -> None:
        """P: free the KV of the requests ``keys`` name (a release from D, or from the
        router) as soon as no WRITE of theirs is in flight (:meth:`_release_leases`)."""
        with self._pdctl_life.lock:
            for key in keys:
                self._pdctl_life.release.setdefault(key, (now, reason))
        for key in keys:  # a parked registration must never be written
            self._pdctl_life.unpark.put(key)
        self._reg_send_inbox.put((DRAIN, {}))
        self._push_writer_wake.set()

    def get_transfer_results(self) -> Any:
        now = time.perf_counter()
        life = self._pdctl_life
        for rid, due in list(life.fail_at.items()):
            if rid not in self._recving_metadata:
                del life.fail_at[rid]  # its WRITE landed meanwhile
            elif due <= now:
                del life.fail_at[rid]
                self._failed_recv_reqs.put(rid)
        self._release_leases(now)
        self._fail_if_prefill_gone(now)
        results = super().get_transfer_results()
        if results.finished_sending:
            with life.lock:
                for rid in results.finished_sending:
                    life.targets.pop(rid, None)
        return results

    def _release_leases(self, now: float) -> None:
        life = self._pdctl_life
        with life.lock:
            if not life.release:
                return
            for base, (since, _) in list(life.release.items()):
                if now - since > REMEMBER_S:
                    del life.release[base]
            wanted = dict(life.release)
        with self._sending_transfers_lock:
            writing = {r for r, h in self._sending_transfers.items() if h}
        for rid in list(self._reqs_to_send):
            keys = [k for k in wanted if _names(k, rid)]
            if keys and rid not in writing:
                self._reqs_to_send[rid] = 0.0  # vLLM's lease reaper frees it this step
                with life.lock:
                    for k in keys:
                        life.release.pop(k, None)
                reason = wanted[keys[0]][1]
                self._lease_released(rid, reason)
                _log.info("pdctl: released the KV of %s (%s)", rid, reason.replace("_", " "))

    def _lease_released(self, request_id: str, reason: str) -> None:
        """Hook: P let go of a finished request's KV early (telemetry overrides it)."""

    def _fail_if_prefill_gone(self, now: float) -> None:
        """D: fail the receives whose prefill's side channel is gone (P died)."""
        life = self._pdctl_life
        if life.watch is None:
            return
        for rid in [r for r in life.gone if r not in self._recving_metadata]:
            del life.gone[rid]
        waiting: dict[str, tuple[str, int]] = {}
        for rid, meta in self._recving_metadata.items():
            remote = getattr(meta, "remote", None)
            if remote is not None and remote.host and remote.port and rid not in life.gone:
                waiting[rid] = (str(remote.host), int(remote.port))
        if not waiting:
            return
        dead = life.watch.dead(set(waiting.values()))
        for rid, addr in waiting.items():
            if addr in dead:
                _log.warning(
                    "pdctl: the prefill at %s:%d is gone; no KV will come for %s", *addr, rid
                )
                life.gone[rid] = now
                life.fail_at.pop(rid, None)
                self._failed_recv_reqs.put(rid)

    # ------------------------------------------------------------------ writer thread

    def _send_registration_to_p(self, req_id: str, reg_data: dict[str, Any]) -> None:
        if req_id == DRAIN:
            self._flush_outbox()
            self._drain_drops()
            self._fail_parked_dropped()
            self._unpark_released()
            return
        cut = self._pdctl_life.cut
        after_s = cut.fails_after_s() if cut is not None else None
        if after_s is not None:
            self._cut_off(req_id, reg_data, after_s)
            return
        if not reg_data.get(RELEASE_KEY) and self._refused_layout(req_id, reg_data):
            return
        failed_at = self._pdctl_life.unreachable.get(reg_data["remote_engine_id"])
        recent = failed_at is not None and time.perf_counter() - failed_at < REMEMBER_S
        if reg_data.get(RELEASE_KEY) and recent:
            # its side channel just failed: another 5 s handshake would only stall every
            # other handshake behind it (P's lease frees the KV)
            _log.info("pdctl: no release for %s: its prefill is unreachable", req_id)
            return
        super()._send_registration_to_p(req_id, reg_data)

    def _refused_layout(self, req_id: str, reg_data: dict[str, Any]) -> bool:
        """D: the prefill will refuse our layout (see the module): fail the receive now
        and release the prefill's KV instead of registering."""
        why = refusal(
            getattr(self, "transfer_topo", None),
            prefill_tp=int(reg_data.get("remote_tp_size") or 1),
            decode_tp=int(reg_data.get("decode_tp_size") or getattr(self, "world_size", 1) or 1),
            has_mamba=bool(getattr(self, "_has_mamba", False)),
        )
        if why is None:
            return False
        # every rank decides alike; one line per request is enough
        say = _log.error if int(getattr(self, "tp_rank", 0) or 0) == 0 else _log.debug
        say("pdctl: no KV can come for %s: %s", req_id, why)
        self._failed_recv_reqs.put(req_id)
        release = {**reg_data, RELEASE_KEY: True, "prefill_request_id": ""}
        super()._send_registration_to_p(req_id, release)
        return True

    def _cut_off(self, req_id: str, reg_data: dict[str, Any], after_s: float) -> None:
        """The side-channel failpoint: this message cannot reach the prefill."""
        if reg_data.get(RELEASE_KEY):
            _log.info("pdctl: failpoint %s: release for %s lost", FAILPOINT_SIDE_CHANNEL, req_id)
            return

        def fail() -> None:  # as vLLM does when a registration's handshake fails
            err = ConnectionError(f"pdctl failpoint {FAILPOINT_SIDE_CHANNEL}")
            self._log_failure(failure_type="push_reg_handshake_failed", req_id=req_id, error=err)
            self._failed_recv_reqs.put(req_id)

        if after_s <= 0:
            fail()
            return
        timer = threading.Timer(after_s, fail)
        timer.daemon = True
        timer.start()

    def _ensure_handshake(self, engine_id: str, *args: Any, **kw: Any) -> Any:
        fut = super()._ensure_handshake(engine_id, *args, **kw)
        if fut is not None:
            fut.add_done_callback(lambda f: self._handshake_result(engine_id, f))
        return fut

    def _handshake_result(self, engine_id: str, fut: Any) -> None:
        if fut.exception() is None:
            self._pdctl_life.unreachable.pop(engine_id, None)
        else:
            self._pdctl_life.unreachable[engine_id] = time.perf_counter()

    def _do_send_reg_notif(self, req_id: str, reg_data: dict[str, Any]) -> None:
        if reg_data.get(RELEASE_KEY):
            msg = encode(RELEASE, get_base_request_id(req_id), reg_data["prefill_request_id"])
            self._send_to_engine(reg_data["remote_engine_id"], msg)
            return
        super()._do_send_reg_notif(req_id, reg_data)

    def _handle_push_reg_notif(self, notif: bytes) -> None:
        self._drain_drops()
        super()._handle_push_reg_notif(notif)
        self._fail_parked_dropped()

    def _do_start_push_kv(self, request_id: str, local_block_ids: Any, reg: dict[str, Any]) -> None:
        life = self._pdctl_life
        if life.delay is not None and local_block_ids:
            if request_id in life.delayed:  # back from the delay (or a handshake after it)
                if request_id not in self._reqs_to_send:
                    life.delayed.discard(request_id)
                    _log.info("pdctl: delayed WRITE of %s dropped (lease released)", request_id)
                    return
            elif life.delay.applies(request_id):
                life.delayed.add(request_id)
                timer = threading.Timer(
                    life.delay.seconds, self._redrive, (request_id, local_block_ids, reg)
                )
                timer.daemon = True
                timer.start()
                return
        with life.lock:
            life.targets[request_id] = (reg["decode_engine_id"], reg["request_id"])
        life.writing = request_id  # for the failpoint (writer thread)
        fut = self._ensure_handshake(
            reg["decode_engine_id"], reg["decode_host"], reg["decode_port"], reg["decode_tp_size"]
        )
        if fut is not None:  # P→D handshake pending: if it fails, free our KV now
            fut.add_done_callback(lambda f: self._handshake_done(f, request_id))
        else:
            life.delayed.discard(request_id)  # the WRITE goes now
        super()._do_start_push_kv(request_id, local_block_ids, reg)

    def _redrive(self, request_id: str, local_block_ids: Any, reg: dict[str, Any]) -> None:
        self._deferred_push_inbox.put((request_id, local_block_ids, reg))
        self._push_writer_wake.set()

    def _handshake_done(self, fut: Any, request_id: str) -> None:
        if fut.exception() is None:
            return
        # vLLM logs push_handshake_failed and keeps the KV for the whole lease
        err = fut.exception()
        if isinstance(err, AssertionError):  # vLLM's handshake validation refused the peer
            _log.error(
                "pdctl: the decode of %s refused at its handshake (%s: vLLM's "
                "_validate_remote_agent_handshake; prefill TP %d, %d KV heads); releasing its "
                "KV",
                request_id,
                str(err) or "assertion failed",
                self.world_size,
                getattr(self.transfer_topo, "total_num_kv_heads", -1),
            )
        else:
            _log.warning("pdctl: no side channel to the decode of %s; releasing its KV", request_id)
        with self._pdctl_life.lock:
            self._pdctl_life.targets.pop(request_id, None)
            self._pdctl_life.release[get_base_request_id(request_id)] = (
                time.perf_counter(),
                HANDSHAKE_FAILED,
            )

    def _drain_drops(self) -> None:
        now = time.perf_counter()
        while not self._pdctl_life.drops.empty():
            rid = self._pdctl_life.drops.get_nowait()
            self._pdctl_life.dropped[get_base_request_id(rid)] = now
        for base, since in list(self._pdctl_life.dropped.items()):
            if now - since > REMEMBER_S:
                del self._pdctl_life.dropped[base]

    def _unpark_released(self) -> None:
        while not self._pdctl_life.unpark.empty():
            key = self._pdctl_life.unpark.get_nowait()
            for reg_id in [r for r in self._pending_d_registrations if _names(key, r)]:
                del self._pending_d_registrations[reg_id]
                self._registration_dropped(reg_id)

    def _fail_parked_dropped(self) -> None:
        dropped = self._pdctl_life.dropped
        for reg_id in [
            r for r in self._pending_d_registrations if get_base_request_id(r) in dropped
        ]:
            reg = self._pending_d_registrations.pop(reg_id)
            self._registration_dropped(reg_id)
            self._notify_decode(reg, FAILED)

    def _registration_dropped(self, reg_id: str) -> None:
        """Hook: a parked registration was let go (telemetry overrides it)."""

    def _notify_decode(self, reg: dict[str, Any], kind: str) -> None:
        """Send ``kind`` for the registration's decode request (handshake first)."""
        engine = reg["decode_engine_id"]
        fut = self._ensure_handshake(
            engine, reg["decode_host"], reg["decode_port"], reg["decode_tp_size"]
        )
        msg = encode(kind, reg["request_id"])
        if fut is None:
            self._send_to_engine(engine, msg)
        else:  # the callback runs on the handshake executor: the message is queued
            fut.add_done_callback(
                lambda f: None if f.exception() else self._send_to_engine(engine, msg)
            )

    def _on_writer_thread(self) -> bool:
        return threading.current_thread() is getattr(self, "_push_writer_thread", None)

    def _send_to_engine(self, engine: str, msg: bytes) -> None:
        """Send ``msg`` to every agent of ``engine``: now on the writer thread, else on
        the writer's next turn (``send_notif`` never leaves the writer thread)."""
        if not self._on_writer_thread():
            self._pdctl_life.outbox.put((engine, msg))
            self._reg_send_inbox.put((DRAIN, {}))
            self._push_writer_wake.set()
            return
        self._send_now(engine, msg)

    def _flush_outbox(self) -> None:
        """Writer thread: send the notifications other threads queued."""
        while True:
            try:
                engine, msg = self._pdctl_life.outbox.get_nowait()
            except queue.Empty:
                return
            self._send_now(engine, msg)

    def _send_now(self, engine: str, msg: bytes) -> None:
        with self._handshake_lock:
            agents = dict(self._remote_agents.get(engine) or {})
        for agent in agents.values():
            try:
                self.nixl_wrapper.send_notif(agent, notif_msg=msg)
            except Exception as e:  # the peer is gone: its own timeouts apply
                _log.warning("pdctl: could not tell engine %s (%s): %s", engine, msg[:40], e)

    def _handle_failed_transfer(
        self,
        req_id: str,
        handle: int | None,
        failed_req_ids: set[str] | None = None,
        record_failed_transfer: bool = True,
    ) -> bool:
        kept = super()._handle_failed_transfer(
            req_id, handle, failed_req_ids, record_failed_transfer
        )
        with self._pdctl_life.lock:
            target = self._pdctl_life.targets.pop(req_id, None)
            if target is not None:  # P: our WRITE failed; free our KV, tell D now
                self._pdctl_life.release[get_base_request_id(req_id)] = (
                    time.perf_counter(),
                    WRITE_FAILED,
                )
        if target is not None:
            self._send_to_engine(target[0], encode(FAILED, target[1]))
        return kept
