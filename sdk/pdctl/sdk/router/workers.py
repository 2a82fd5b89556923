"""A router of several processes: ``router.workers = N`` workers share the port
(``SO_REUSEPORT``: the kernel spreads new connections over them), each a complete router;
this module is their parent. It serves nothing itself. It

* starts the N workers (``python -m pdctl.sdk.router.server ... --worker-of DIR
  --worker-index I``) and restarts one that dies (backing off when one dies at once again
  and again; N such deaths in a row before any registers: it stops and exits 2);
* is the one order of control changes: a worker that took ``POST /v1/pdctl/mode``,
  ``policy``, ``drain`` or ``instance`` applies it, then asks the parent, which applies it to
  every registered worker (over their Unix sockets, :mod:`.workerlink`) and answers once
  every one has it (a worker that does not answer within :data:`APPLY_S` is killed and
  restarted: it takes every change at its start, before it serves); the HTTP answer says
  ``change: {version, applied, of, restarted}``. A starting worker registers under the same lock, so
  no change can fall between its start and its registration;
* merges ``/metrics``, ``/v1/pdctl/requests`` and ``/v1/pdctl/state`` from every worker
  (:mod:`.merge`). A dead worker's last counters and histograms are kept (folded into
  ``retired``), so a summed counter never goes down when a worker is replaced;
* writes the audit log (the workers hand it their entries: one writer, one entry per
  action, the worker that took it named);
* on SIGTERM/SIGINT tells every worker to stop (each finishes what it serves) and waits
  for them; workers also stop when the parent dies (``PR_SET_PDEATHSIG`` on Linux, and a
  watch on their parent's pid).

The channel is a private folder (mode 0700) of Unix sockets (mode 0600): only the
router's own user can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.linesock import ask, serve
from pdctl.sdk.router.audit import AuditLog
from pdctl.sdk.router.merge import merge_metrics, merge_requests, merge_state
from pdctl.sdk.router.promreg import Snapshot, expose_snapshot
from pdctl.sdk.router.running import run
from pdctl.sdk.router.workerlink import parent_socket, worker_socket

APPLY_S = 2.0
"""How long the parent waits for a worker to apply a change or answer a read."""
STOP_S = 60.0
"""How long the parent waits for its workers to finish after SIGTERM, then kills them."""
QUICK_DEATH_S = 5.0


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota
    (``cpu_max``: a container's CPU limit, rounded up), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    return max(1, n)


@dataclass
class _Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    registered: bool = False
    last: Snapshot = field(default_factory=list)


class WorkerPool:
    """The parent of ``n`` workers run as ``argv`` plus their index."""

    def __init__(self, argv: Sequence[str], n: int, audit: AuditLog) -> None:
        self.argv, self.n, self.audit = list(argv), n, audit
        self.folder = Path(tempfile.mkdtemp(prefix="pdctl-router-"))  # mode 0700
        self.workers = [_Worker(i) for i in range(n)]
        self.changes: dict[str, tuple[str, dict[str, Any]]] = {}
        """The control changes so far, one per setting (and instance): a new worker's."""
        self.version = 0
        self.restarts = 0
        self.retired: Snapshot = []
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._deaths_unregistered = 0
        self.exit_code = 0

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        """Run the workers until SIGTERM/SIGINT (or until they cannot start); the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        server = await serve(parent_socket(self.folder), self._handle)
        try:
            watchers = [asyncio.create_task(self._keep(w)) for w in self.workers]
            await self._stopping.wait()
            await self._stop_all()
            for t in watchers:
                t.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            server.close()
            for p in self.folder.iterdir():
                p.unlink(missing_ok=True)
            self.folder.rmdir()
        return self.exit_code

    async def _spawn(self, w: _Worker) -> None:
        w.registered, w.started = False, time.monotonic()
        w.proc = await asyncio.create_subprocess_exec(
            *self.argv, "--worker-of", str(self.folder), "--worker-index", str(w.index)
        )

    async def _keep(self, w: _Worker) -> None:
        """Run worker ``w``, restarting it whenever it dies (until the router stops)."""
        quick = 0
        while not self._stopping.is_set():
            await self._spawn(w)
            assert w.proc is not None
            code = await w.proc.wait()
            if not w.registered:
                self._deaths_unregistered += 1
            w.registered = False
            self.retired = merge_metrics([self.retired, _cumulative(w.last)])
            w.last = []
            if self._stopping.is_set():
                return
            lived = time.monotonic() - w.started
            quick = quick + 1 if lived < QUICK_DEATH_S else 0
            self.restarts += 1
            _say(f"worker {w.index} (pid {w.proc.pid}) exited with {code}; restarting")
            if self._deaths_unregistered >= self.n * 2:
                _say("workers die before they start; stopping (see their errors above)")
                self.exit_code = 2
                self._stopping.set()
                return
            await asyncio.sleep(min(10.0, 0.2 * 2**quick) if quick else 0.1)

    async def _stop_all(self) -> None:
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_S):
                await asyncio.gather(*(p.wait() for p in procs))
        except TimeoutError:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            await asyncio.gather(*(p.wait() for p in procs))

    def _kill(self, w: _Worker) -> None:
        if w.proc is not None and w.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()

    # ------------------------------------------------------------------ the channel

    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "hello":
            async with self._lock:
                w = self.workers[int(req["index"])]
                w.registered = True
                self._deaths_unregistered = 0
                return {"ok": True, "changes": list(self.changes.values()), "version": self.version}
        if op == "change":
            return await self.change(str(req["setting"]), req["req"])
        if op == "metrics":
            return {"ok": True, "text": expose_snapshot(await self.metrics()).decode()}
        if op == "requests":
            limit = int(req["limit"])
            q = {"what": "requests", "limit": limit}
            q |= {k: req.get(k) for k in ("instance", "outcome")}
            found = [r["requests"] for r in await self._read(q)]
            return {"ok": True, "requests": merge_requests(found, limit)}
        if op == "state":
            states = [r["state"] for r in await self._read({"what": "state"})]
            if not states:
                raise PdctlError("no router worker answered")
            return {"ok": True, "state": {**merge_state(states), "workers": len(states)}}
        if op == "audit":
            return {"ok": True, "entries": list(self.audit.recent)[::-1]}
        if op == "audit_entry":
            self.audit.append(dict(req["entry"]))
            return {"ok": True}
        raise PdctlError(f"unknown request {op!r}")

    async def change(self, setting: str, req: dict[str, Any]) -> dict[str, Any]:
        """Apply a control change to every registered worker; answer when all have it."""
        async with self._lock:
            if setting != "instance":  # up/down is a moment's word, not a setting to keep
                key = f"{setting}:{req.get('instance')}" if setting == "drain" else setting
                if setting == "admission" and key in self.changes:  # each names some fields
                    req = {**self.changes[key][1], **req}
                self.changes[key] = (setting, req)
            self.version += 1
            live = [w for w in self.workers if w.registered]
            msg = {"op": "apply", "setting": setting, "req": req}
            results = await asyncio.gather(
                *(ask(worker_socket(self.folder, w.index), msg, APPLY_S) for w in live),
                return_exceptions=True,
            )
            restarted = []
            for w, r in zip(live, results, strict=True):
                if isinstance(r, BaseException):
                    # it cannot have the change: replace it (a new worker takes every change
                    # before it serves), so no worker serves without it after this answer
                    _say(f"worker {w.index} did not apply {setting} ({r}); restarting it")
                    w.registered = False
                    self._kill(w)
                    restarted.append(w.index)
            applied = len(live) - len(restarted)
            return {
                "ok": True,
                "version": self.version,
                "applied": applied,
                "of": self.n,
                "restarted": restarted,
            }

    async def _read(self, q: dict[str, Any]) -> list[dict[str, Any]]:
        live = [w for w in self.workers if w.registered]
        msg = {"op": "read", **q}
        results = await asyncio.gather(
            *(ask(worker_socket(self.folder, w.index), msg, APPLY_S) for w in live),
            return_exceptions=True,
        )
        return [r for r in results if isinstance(r, dict)]

    async def metrics(self) -> Snapshot:
        """Every worker's metrics merged (a silent worker: its last known), the retired
        workers' counts, and the parent's own."""
        live = [(w, w.proc) for w in self.workers if w.registered]
        msg = {"op": "read", "what": "metrics"}
        results = await asyncio.gather(
            *(ask(worker_socket(self.folder, w.index), msg, APPLY_S) for w, _ in live),
            return_exceptions=True,
        )
        for (w, proc), r in zip(live, results, strict=True):
            # not from a process that died meanwhile (its counts are already retired)
            if not isinstance(r, BaseException) and w.registered and w.proc is proc:
                w.last = r["snapshot"]
        merged = merge_metrics([*(w.last for w in self.workers if w.last), self.retired])
        return [*merged, *self._own()]

    def _own(self) -> Snapshot:
        serving = sum(w.registered for w in self.workers)
        return [
            {
                "name": "pdctl_router_workers",
                "help": "Router worker processes serving (router.workers asked for).",
                "type": "gauge",
                "labels": ["state"],
                "samples": [[["serving"], float(serving)], [["configured"], float(self.n)]],
            },
            {
                "name": "pdctl_router_worker_restarts_total",
                "help": "Router workers restarted by their parent after dying.",
                "type": "counter",
                "labels": [],
                "samples": [[[], float(self.restarts)]],
            },
        ]


def _cumulative(snap: Snapshot) -> Snapshot:
    """The counters and histograms of a snapshot (what a dead worker leaves behind)."""
    return [f for f in snap if f["type"] != "gauge"]


def _say(text: str) -> None:
    print(f"pdctl router: {text}", file=sys.stderr, flush=True)


def run_workers(argv: Sequence[str], n: int, audit: AuditLog) -> int:
    """Run ``n`` workers of the router started as ``argv`` until SIGTERM; the exit code."""
    return run(WorkerPool(argv, n, audit).run())
