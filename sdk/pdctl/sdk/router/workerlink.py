"""A router worker's side of its channel to the parent (:mod:`pdctl.sdk.router.workers`).

Each worker answers, on its own Unix socket, the parent's ``apply`` (a control change, the
same code path as an HTTP control request: :meth:`~pdctl.sdk.router.instanceset.InstanceSet.apply`)
and ``read`` (its metrics snapshot, recent requests or control state). It asks the parent
for the merged views, for a control change to be carried to every worker, and hands it
its audit entries (the parent is the audit file's one writer). It is the app's
:class:`~pdctl.sdk.router.app.Cluster`.

Start order (:meth:`WorkerLink.start`): its socket first, then ``hello`` to the parent,
which registers it and answers the control changes made so far; the worker applies them
before it binds the public port, so it never serves with an outdated mode, policy or drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.linesock import LineSockError, ask, serve
from pdctl.sdk.router.app import RouterApp
from pdctl.sdk.router.audit import AuditLog

log = logging.getLogger("pdctl.router")

ASK_S = 5.0
"""How long a worker waits for its parent (the parent's fan-out has its own, shorter)."""
AUDIT_QUEUE = 10_000


def worker_socket(folder: Path, index: int) -> Path:
    return folder / f"worker-{index}.sock"


def parent_socket(folder: Path) -> Path:
    return folder / "parent.sock"


class WorkerLink:
    """Worker ``index`` of the router whose parent's channel lives in ``folder``."""

    def __init__(self, app: RouterApp, folder: Path, index: int) -> None:
        self.app, self.folder, self.index = app, folder, index
        self.parent = parent_socket(folder)
        self._server: asyncio.AbstractServer | None = None
        self._audit: asyncio.Queue[dict[str, Any]] = asyncio.Queue(AUDIT_QUEUE)
        self._sender: asyncio.Task[None] | None = None
        self.audit_dropped = 0
        app.cluster = self
        app.guard.audit = AuditLog(None, forward=self._queue_audit)

    async def start(self) -> None:
        """Serve this worker's socket, register with the parent, apply what it says."""
        self._server = await serve(worker_socket(self.folder, self.index), self._handle)
        hello = await ask(
            self.parent, {"op": "hello", "index": self.index, "pid": os.getpid()}, ASK_S
        )
        for setting, req in hello.get("changes", []):
            refused = self.app.apply(setting, req)
            if refused is not None:
                log.warning(
                    "worker %d: cannot apply %s %s: %s", self.index, setting, req, refused[1]
                )
        self._sender = asyncio.create_task(self._send_audit())

    async def stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        if self._server is not None:
            self._server.close()
        worker_socket(self.folder, self.index).unlink(missing_ok=True)

    # ------------------------------------------------------------------ the parent asks

    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "apply":
            refused = self.app.apply(str(req["setting"]), req["req"])
            if refused is not None:
                raise PdctlError(refused[1])
            return {"ok": True}
        if op == "read":
            what = req.get("what")
            if what == "metrics":
                return {"ok": True, "snapshot": self.app.router.registry.snapshot()}
            if what == "requests":
                found = await self.app.recent(
                    int(req["limit"]), req.get("instance"), req.get("outcome")
                )
                return {"ok": True, "requests": found}
            if what == "state":
                return {"ok": True, "state": self.app.control_state()}
        raise PdctlError(f"unknown request {op!r}")

    # ------------------------------------------------------------------ Cluster

    async def _parent(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return await ask(self.parent, req, ASK_S)
        except LineSockError as e:
            raise PdctlError(
                f"router worker {self.index}: its parent did not answer: {e}"
            ) from None

    async def metrics(self) -> bytes:
        return str((await self._parent({"op": "metrics"}))["text"]).encode()

    async def requests(
        self, limit: int, instance: str | None, outcome: str | None
    ) -> list[dict[str, Any]]:
        q = {"op": "requests", "limit": limit, "instance": instance, "outcome": outcome}
        found: list[dict[str, Any]] = (await self._parent(q))["requests"]
        return found

    async def state(self) -> dict[str, Any]:
        state: dict[str, Any] = (await self._parent({"op": "state"}))["state"]
        return state

    async def audit(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = (await self._parent({"op": "audit"}))["entries"]
        return entries

    async def changed(self, setting: str, req: dict[str, Any]) -> dict[str, Any]:
        r = await self._parent({"op": "change", "setting": setting, "req": req, "by": self.index})
        return {k: v for k, v in r.items() if k != "ok"}

    # ------------------------------------------------------------------ audit

    def _queue_audit(self, entry: dict[str, Any]) -> None:
        try:
            self._audit.put_nowait({**entry, "worker": self.index})
        except asyncio.QueueFull:
            self.audit_dropped += 1

    async def _send_audit(self) -> None:
        while True:
            entry = await self._audit.get()
            for _ in range(3):
                try:
                    await ask(self.parent, {"op": "audit_entry", "entry": entry}, ASK_S)
                    break
                except LineSockError as e:
                    log.warning("worker %d: audit entry not delivered: %s", self.index, e)
                    await asyncio.sleep(0.5)
            else:
                self.audit_dropped += 1
