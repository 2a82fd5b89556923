"""The two ends of a probe run, joined by the control channel.

The target (``serve_target``) plays vLLM's decode: per request it allocates destination
blocks, sends a registration to every initiator rank and counts their completion
notifications. The initiator (``run_initiator``) plays prefill: one :class:`RankWriter`
per TP rank, a schedule of requests (closed loop, or ``rate`` per second), the arrival
order of registration vs finished blocks, and the figures.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from pdctl.connector.probe import match as m
from pdctl.connector.probe.control import Control, ProbeError, b64, unb64
from pdctl.connector.probe.engine import (
    Note,
    RankWriter,
    TargetEngine,
    WriteDone,
    WriteFailed,
)
from pdctl.connector.probe.plan import Geometry, RingAllocator
from pdctl.connector.probe.records import ProbeConfig, ProbeRequest
from pdctl.connector.probe.report import summarize

Progress = Callable[[dict[str, Any]], None]


def _geometry(d: dict[str, Any]) -> Geometry:
    return Geometry(**{k: int(d[k]) for k in Geometry.__dataclass_fields__})


# ---------------------------------------------------------------------------- target


def serve_target(
    host: str,
    port: int,
    *,
    ucx_params: dict[str, str],
    accept_timeout_s: float,
    on_listening: Callable[[int], None],
) -> dict[str, Any]:
    """Serve one initiator, then return a small summary of what the target saw."""
    with socket.create_server((host, port)) as srv:
        on_listening(int(srv.getsockname()[1]))
        srv.settimeout(accept_timeout_s)
        try:
            sock, addr = srv.accept()
        except TimeoutError:
            raise ProbeError(
                f"no initiator connected within {accept_timeout_s:g} s; start the other end "
                f"with --connect {host}:{srv.getsockname()[1]}"
            ) from None
    ctl = Control(sock, f"initiator {addr[0]}")
    try:
        return _target_loop(ctl, ucx_params)
    finally:
        ctl.close()


def _target_loop(ctl: Control, ucx_params: dict[str, str]) -> dict[str, Any]:
    hello = ctl.recv(30.0, "hello")
    timeout_s = float(hello["timeout_s"])
    poll_s = float(hello["poll_us"]) / 1e6
    try:
        target = TargetEngine(
            _geometry(hello["geometry"]),
            int(hello["tp"]),
            device=hello["device"],
            ucx_params=ucx_params,
            timeout_s=timeout_s,
        )
    except Exception as e:
        ctl.send({"type": "error", "error": f"target: {e}"})
        raise
    seen: dict[str, int] = {"received": 0, "problems": 0, "missing": 0}
    try:
        for md in hello["ranks"]:
            target.add_peer(unb64(md))
        ctl.send({"type": "ready", "metadata": b64(target.metadata()), "pools": target.pool_info()})
        while True:
            msg = ctl.poll(poll_s)
            now = time.monotonic()
            if msg is not None:
                if msg.get("type") == "bye":
                    ctl.send({"type": "summary", **seen})
                    return seen
                if msg.get("type") == "request":
                    reg = target.register(str(msg["id"]), verify=bool(msg["verify"]), now=now)
                    ctl.send({"type": "registered", "id": reg.request_id, "blocks": reg.block_ids})
            for ev in target.poll(time.monotonic()):
                ctl.send(_target_event(target, ev, seen))
    finally:
        target.close()


def _target_event(
    target: TargetEngine, ev: m.Received | m.Problem | m.Missing, seen: dict[str, int]
) -> dict[str, Any]:
    if isinstance(ev, m.Received):
        seen["received"] += 1
        checks = target.checksums(ev.request_id)
        target.forget(ev.request_id)
        return {"type": "received", "id": ev.request_id, "elapsed_s": ev.elapsed_s, "crc": checks}
    if isinstance(ev, m.Missing):
        seen["missing"] += 1
        target.forget(ev.request_id)
        return {
            "type": "missing",
            "id": ev.request_id,
            "error": f"target got {ev.got} of {ev.expected} completion notification(s) in "
            f"{ev.age_s:.1f} s",
        }
    seen["problems"] += 1
    return {"type": "problem", "id": ev.request_id, "kind": ev.kind, "error": ev.detail}


# ------------------------------------------------------------------------- initiator


def run_initiator(
    ctl: Control, cfg: ProbeConfig, *, progress: Progress | None = None
) -> dict[str, Any]:
    ranks = [
        RankWriter(
            r,
            cfg.tp,
            cfg.geometry,
            merge=cfg.merge,
            device=cfg.device,
            ucx_params=cfg.ucx_params,
            expire_after_s=cfg.timeout_s,
            xfer_timeout_s=cfg.timeout_s,
            poll_s=cfg.poll_us / 1e6,
        )
        for r in range(cfg.tp)
    ]
    try:
        return _Driver(ctl, cfg, ranks, progress).run()
    finally:
        for w in ranks:
            w.close()


class _Driver:
    def __init__(
        self, ctl: Control, cfg: ProbeConfig, ranks: list[RankWriter], progress: Progress | None
    ) -> None:
        self.ctl, self.cfg, self.ranks = ctl, cfg, ranks
        self.progress = progress or (lambda _e: None)
        self.open: dict[str, ProbeRequest] = {}
        self.closed: list[ProbeRequest] = []
        self.notes: list[str] = []
        self.parked: set[tuple[str, str, int]] = set()
        self.alloc = RingAllocator(cfg.geometry.pool_blocks)

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.ctl.send(
            {
                "type": "hello",
                "geometry": cfg.geometry.as_dict(),
                "tp": cfg.tp,
                "device": cfg.device,
                "timeout_s": cfg.timeout_s,
                "poll_us": cfg.poll_us,
                "ranks": [b64(w.metadata()) for w in self.ranks],
            }
        )
        ready = self.ctl.recv(cfg.timeout_s, "ready")
        md = unb64(ready["metadata"])
        for w, (base, dev) in zip(self.ranks, ready["pools"], strict=True):
            w.connect(md, int(base), int(dev))
            w.start()
        total = cfg.warmup + cfg.count
        t_measure: float | None = None
        for i in range(total):
            if i == cfg.warmup:
                self._drain_all()
                t_measure = time.perf_counter()
            self._wait_for_slot(t_measure, i - cfg.warmup)
            self._start(i)
        self._drain_all()
        end = max((r.finished_at or 0.0) for r in self.closed) if self.closed else 0.0
        self.ctl.send({"type": "bye"})
        try:
            target = self.ctl.recv(5.0, "summary")
        except ProbeError as e:
            target = {"error": str(e)}
        window = (end - t_measure) if t_measure is not None and end > t_measure else None
        return summarize(cfg, self.closed, window, self.notes, target)

    # ------------------------------------------------------------------ scheduling

    def _wait_for_slot(self, t_measure: float | None, j: int) -> None:
        cfg = self.cfg
        if cfg.rate and t_measure is not None and j >= 0:
            due = t_measure + j / cfg.rate
            while time.perf_counter() < due:
                self._pump(min(0.002, max(0.0, due - time.perf_counter())))
        while len(self.open) >= cfg.inflight:
            self._pump(0.0005)

    def _start(self, i: int) -> None:
        cfg = self.cfg
        n = i - cfg.warmup
        stem = f"probe-{i:06d}"
        req = ProbeRequest(
            index=n,
            target_id=f"{stem}-{secrets.token_hex(4)}",
            source_id=f"{stem}-{secrets.token_hex(4)}",
            blocks=tuple(self.alloc.allocate(cfg.geometry.blocks_per_request)),
            verify=cfg.verify == "all" or (cfg.verify == "warmup" and n < 0),
        )
        req.started = time.perf_counter()
        self.open[req.target_id] = req
        if cfg.order == "finished-first":
            self._finish(req, i)
            self._await_parked(req, "finished", req.source_id)
            self._register(req)
        elif cfg.order == "registration-first":
            self._register(req)
            self._await_parked(req, "registration", req.target_id)
            self._finish(req, i)
        else:
            self._register(req)
            self._finish(req, i)

    def _register(self, req: ProbeRequest) -> None:
        self.ctl.send({"type": "request", "id": req.target_id, "verify": req.verify})

    def _finish(self, req: ProbeRequest, seq: int) -> None:
        for w in self.ranks:
            w.finish(m.Finished(req.source_id, req.blocks), seq)

    def _await_parked(self, req: ProbeRequest, kind: str, rid: str) -> None:
        deadline = time.perf_counter() + self.cfg.timeout_s
        while not all((kind, rid, w.rank) in self.parked for w in self.ranks):
            if req.errors or time.perf_counter() > deadline:
                self._fail(req, f"no rank parked the {kind} within {self.cfg.timeout_s:g} s")
                return
            self._pump(0.0005)

    # ------------------------------------------------------------------ events

    def _drain_all(self) -> None:
        while self.open:
            self._pump(0.0005)
            now = time.perf_counter()
            for req in list(self.open.values()):
                if now - req.started > self.cfg.timeout_s * 1.5:
                    self._fail(req, f"no completion within {self.cfg.timeout_s * 1.5:g} s")

    def _pump(self, wait_s: float) -> None:
        msg = self.ctl.poll(wait_s)
        while msg is not None:
            self._on_control(msg)
            msg = self.ctl.poll(0.0)
        for w in self.ranks:
            while not w.events.empty():
                self._on_rank(w.events.get_nowait(), w.rank)

    def _on_control(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        req = self.open.get(str(msg.get("id")))
        if kind == "error":
            raise ProbeError(str(msg.get("error")))
        if req is None:
            if kind in ("problem", "missing"):
                self.notes.append(f"target: {msg.get('error')}")
            return
        if kind == "registered":
            req.dst_blocks = tuple(int(b) for b in msg["blocks"])
        elif kind == "received":
            req.received = msg
        elif kind in ("missing", "problem"):
            self._fail(req, f"target: {msg.get('error')}")
        self._maybe_close(req)

    def _on_rank(self, ev: object, rank: int) -> None:
        if isinstance(ev, m.Parked):
            self.parked.add((ev.kind, ev.request_id, rank))
            return
        if isinstance(ev, WriteDone):
            req = self.open.get(ev.request_id)
            if req is not None:
                req.done[ev.rank] = ev
                self._maybe_close(req)
            return
        if isinstance(ev, WriteFailed):
            req = self.open.get(ev.request_id)
            if req is not None:
                self._fail(req, f"rank {ev.rank}: {ev.error}")
                return
            self.notes.append(f"rank {ev.rank}: {ev.error}")
            return
        if isinstance(ev, Note):
            self.notes.append(f"rank {ev.rank}: {ev.detail}")
            return
        if isinstance(ev, m.Expired):
            self.notes.append(f"{ev.kind} {ev.request_id} expired after {ev.age_s:.1f} s")
            for req in list(self.open.values()):
                if ev.request_id in (req.target_id, req.source_id):
                    self._fail(req, f"its {ev.kind} expired unmatched after {ev.age_s:.1f} s")
            return
        self.notes.append(f"rank {rank}: {type(ev).__name__} {ev}")

    def _fail(self, req: ProbeRequest, error: str) -> None:
        req.errors.append(error)
        self._maybe_close(req)

    def _maybe_close(self, req: ProbeRequest) -> None:
        if req.target_id in self.open and req.closed(self.cfg.tp):
            req.finished_at = time.perf_counter()
            del self.open[req.target_id]
            self.closed.append(req)
            self.progress(
                {
                    "event": "request",
                    "done": len([r for r in self.closed if not r.warmup]),
                    "total": self.cfg.count,
                    "warmup": req.warmup,
                    "ok": not req.errors,
                }
            )
