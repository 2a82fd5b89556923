"""Start, supervise and stop a local fleet of vLLM instances.

:class:`AsyncFleet` is the supervisor: each instance runs under a *shepherd* process
(:mod:`pdctl.sdk.shepherd`) in its own process group, tied to this process by a lifeline
pipe, so nothing outlives the supervisor even when it is SIGKILLed. State, logs and exit
codes live in the fleet's state directory, and a control socket there lets other shells
restart instances or stop the fleet (:func:`fleet_status`, :func:`remote_down`, …).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from pdctl.sdk.client import AsyncRouterClient
from pdctl.sdk.demo import load_demo_spec
from pdctl.sdk.errors import FleetRunningError, LaunchError
from pdctl.sdk.events.journal import Journal
from pdctl.sdk.events.kinds import CONTROL
from pdctl.sdk.events.model import Event
from pdctl.sdk.fleet import control
from pdctl.sdk.fleet.events import FleetEvent, InstanceStatus
from pdctl.sdk.fleet.policy import RestartPolicy
from pdctl.sdk.fleet.procs import alive, check_engine, kill_group, start_ticks
from pdctl.sdk.fleet.readiness import check_ready
from pdctl.sdk.fleet.remote import (
    DEFAULT_GRACE,
    DEFAULT_READY_TIMEOUT,
    TAIL_LINES,
    cleanup_stale,
    status_of,
)
from pdctl.sdk.fleet.state import (
    FleetRecord,
    InstanceRecord,
    fleet_dir,
    read_state,
    state_file,
    tail,
    write_state,
)
from pdctl.sdk.fleet.supervisor import RouterNotifier, Supervisor, _Instance, router_api_key
from pdctl.sdk.fleetplan import InstancePlan, router_plan
from pdctl.sdk.lint import lint, require_clean
from pdctl.sdk.lint.waiver import waive
from pdctl.sdk.metrics.monitor import FleetMonitor, Snapshot
from pdctl.sdk.shepherd import group_members
from pdctl.sdk.specload import LoadedSpec, SpecLike, load_spec, spec_of
from pdctl.sdk.urls import router_url

POLL_INTERVAL = 0.5


class AsyncFleet(Supervisor):
    """A local fleet planned from a spec, supervised by this process.

    ``async with AsyncFleet(spec) as fleet:`` brings it up (waiting for readiness) and
    always takes it down on the way out. Failed instances are restarted by their group's
    restart policy (:mod:`pdctl.sdk.fleet.supervisor`).
    """

    def __init__(
        self,
        spec: SpecLike,
        *,
        source: str | None = None,
        state_root: Path | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        check_ports: bool = True,
        with_router: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        ignore_lint: Collection[str] = (),
    ) -> None:
        if source is None:
            source = spec.source if isinstance(spec, LoadedSpec) else "<spec>"
        self.spec = spec = spec_of(spec)
        self.source = source
        self.ignore_lint = frozenset(c.upper() for c in ignore_lint)
        """Lint error codes launched past on purpose (``pdctl up --ignore-lint``): each
        waived error is logged as a warning at every check; other errors still refuse."""
        self.plan = require_clean(waive(lint(spec, check_bound_ports=False), self.ignore_lint))
        self.dir = fleet_dir(spec.fleet.name, state_root)
        self._journal: Journal | None = Journal.of(self.dir)
        self.ready_timeout = ready_timeout
        self.grace = grace
        self.check_ports = check_ports
        self.with_router = with_router
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._instances: dict[str, _Instance] = {}
        self._base_engine_ids: dict[str, str | None] = {}
        self._subscribers: list[asyncio.Queue[FleetEvent]] = []
        self._changed = asyncio.Event()
        self._notifier: RouterNotifier | None = None
        self._router: AsyncRouterClient | None = None
        self._metrics: FleetMonitor | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._life_r: int | None = None
        self._life_w: int | None = None
        self._server: asyncio.AbstractServer | None = None
        self._started_at = 0.0
        self._up = False
        self._down_lock = asyncio.Lock()
        self.stopped = asyncio.Event()
        """Set once :meth:`down` has finished (also when asked from another shell)."""

    @classmethod
    def from_file(
        cls, path: str | Path | None = None, overrides: Sequence[str] = (), **kw: Any
    ) -> AsyncFleet:
        """The fleet of a spec file (default ``./pdctl.toml``) with ``PDCTL_`` environment
        variables and ``overrides`` (``KEY=VALUE``) on top; ``kw`` as for the class."""
        loaded = load_spec(path, overrides)
        return cls(loaded.spec, source=loaded.source, **kw)

    @classmethod
    def demo(
        cls, overrides: Sequence[str] = (), *, model: str | Path | None = None, **kw: Any
    ) -> AsyncFleet:
        """The embedded CPU demo fleet (one prefill, one decode, the router); builds the
        tiny model first when ``model`` is not given and it is missing (blocking)."""
        loaded = load_demo_spec(model, overrides)
        return cls(loaded.spec, source=loaded.source, **kw)

    @property
    def router_url(self) -> str:
        """Where this fleet's router listens (``http://HOST:PORT``)."""
        if not self.with_router:
            raise LaunchError("this fleet runs without its router (with_router=False)")
        return router_url(self.spec, self.source)

    @property
    def router(self) -> AsyncRouterClient:
        """A client for this fleet's router (closed when the fleet goes down)."""
        if self._router is None:
            key = router_api_key(self.spec)
            self._router = AsyncRouterClient(
                self.router_url, api_key=key, transport=self._transport
            )
        return self._router

    async def snapshot(self) -> Snapshot:
        """Scrape every instance and the router once: one typed metrics round (windows
        span the calls since the first)."""
        if self._metrics is None:
            self._metrics = FleetMonitor.for_fleet(self.spec, self.plan, transport=self._transport)
        return await self._metrics.poll()

    async def __aenter__(self) -> AsyncFleet:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.down()

    # ------------------------------------------------------------------ events

    def events(self) -> AsyncIterator[FleetEvent]:
        """Every lifecycle event from now on (subscribe before calling :meth:`up`)."""
        q: asyncio.Queue[FleetEvent] = asyncio.Queue()
        self._subscribers.append(q)

        async def gen() -> AsyncIterator[FleetEvent]:
            try:
                while True:
                    ev = await q.get()
                    yield ev
                    if ev.kind == "fleet-stopped":
                        return
            finally:
                with contextlib.suppress(ValueError):
                    self._subscribers.remove(q)

        return gen()

    # ------------------------------------------------------------------ up

    async def up(self, *, wait: bool = True) -> None:
        """Start every instance; with ``wait``, return once all are ready.

        On any failure (an instance exits, the timeout passes, cancellation/Ctrl-C) the
        whole fleet is taken down before the error propagates.
        """
        if self._up:
            raise LaunchError("this fleet object is already up")
        # blocking checks (stale clean-up may wait out a grace period; the check for an
        # installed vLLM starts an interpreter) run off the event loop
        await asyncio.to_thread(self._claim_state_dir)
        report = lint(self.spec, check_bound_ports=self.check_ports)
        require_clean(waive(report, self.ignore_lint, log=True))
        await asyncio.to_thread(check_engine, self.plan.instances[0].argv[0], self.spec)
        self._up = True
        try:
            (self.dir / "logs").mkdir(parents=True, exist_ok=True)
            (self.dir / "run").mkdir(parents=True, exist_ok=True)
            self._life_r, self._life_w = os.pipe()
            self._client = httpx.AsyncClient(transport=self._transport)
            self._started_at = time.time()
            for plan in self._plans():
                policy = RestartPolicy.for_plan(self.spec, plan)
                self._instances[plan.name] = _Instance(plan, self._new_record(plan), policy)
            self._notifier = self._router_notifier()
            self._save()
            self._server = await control.serve(self.dir / "control.sock", self._on_control)
            for inst in self._instances.values():
                await self._spawn(inst)
            self._save()
            self._monitor_task = asyncio.create_task(self._monitor())
            if wait:
                await self.wait_ready()
        except BaseException:
            await asyncio.shield(self.down())
            raise

    def _claim_state_dir(self) -> None:
        rec = read_state(self.dir)
        if rec is None:
            return
        if alive(rec.supervisor_pid, rec.supervisor_ticks):
            raise FleetRunningError(
                f"fleet {rec.fleet!r} is already running (supervisor pid {rec.supervisor_pid},"
                f" spec {rec.source}); see `pdctl status`, or stop it with `pdctl down`"
            )
        cleanup_stale(rec, self.dir, self.grace)

    def _plans(self) -> list[InstancePlan]:
        """The vLLM instances, then the router (when the spec has one and it is wanted)."""
        plans = list(self.plan.instances)
        if self.with_router and self.spec.router is not None:
            spec_file = self.dir / "run" / "spec.json"
            spec_file.write_text(self.spec.model_dump_json())
            argv: tuple[str, ...] = (
                sys.executable,
                "-m",
                "pdctl.sdk.router.server",
                "--spec-json",
                str(spec_file),
            )
            for code in sorted(self.ignore_lint):  # the router lints the spec again
                argv += ("--ignore-lint", code)
            # the router tells the supervisor at once of an engine it saw die
            argv += ("--supervisor-socket", str(self.dir / "control.sock"))
            rp = router_plan(self.spec, argv)
            if rp is not None:
                plans.append(rp)
        if self.spec.observability.prometheus:
            from pdctl.sdk.fleetplan.prometheus import PrometheusFiles, local_prometheus_plan
            from pdctl.sdk.observability.promfiles import write_prometheus_files

            files = PrometheusFiles.under(self.dir)
            pp = local_prometheus_plan(self.spec, files)
            if pp is not None:
                write_prometheus_files(self.spec, self.plan, files)
                plans.append(pp)
        return plans

    def _router_notifier(self) -> RouterNotifier | None:
        if not self.with_router or self.spec.router is None:
            return None
        return RouterNotifier(self.router_url, router_api_key(self.spec), transport=self._transport)

    def _new_record(self, plan: InstancePlan) -> InstanceRecord:
        return InstanceRecord(
            name=plan.name,
            role=plan.role,
            url=plan.url,
            served_name=self.spec.model.effective_served_name,
            http_port=plan.http_port,
            side_channel_ports=list(plan.side_channel_ports),
            engine_id=plan.engine_id,
            log=str(self.dir / "logs" / f"{plan.name}.log"),
            exit_file=str(self.dir / "run" / f"{plan.name}.exit"),
        )

    async def _spawn(self, inst: _Instance) -> None:
        assert self._life_r is not None
        rec = inst.record
        env = {**os.environ, **inst.plan.env}
        cmd = [
            sys.executable,
            "-m",
            "pdctl.sdk.shepherd",
            "--lifeline",
            str(self._life_r),
            "--exit-file",
            rec.exit_file,
            "--grace",
            str(self.grace),
            "--cpus",
            ",".join(str(c) for c in inst.plan.cpu_cores),
            "--",
            *inst.plan.argv,
        ]
        with _open_log(inst) as log:
            inst.proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(self._life_r,),
            )
        inst.stopping = False
        inst.why = "starting"
        rec.shepherd_pid = inst.proc.pid
        rec.shepherd_ticks = start_ticks(inst.proc.pid)
        rec.started_at = time.time()
        rec.ready_at = None
        rec.state = "starting"
        rec.exit_code = None
        inst.watcher = asyncio.create_task(self._watch(inst, inst.proc))
        self._emit("starting", rec.name, message=f"pid {inst.proc.pid}")

    # ------------------------------------------------------------------ readiness

    async def wait_ready(
        self, limit_s: float | None = None, names: Iterable[str] | None = None
    ) -> None:
        """Wait until the named (default: all) instances answer ``/health`` and list the
        model. Raises :class:`LaunchError` with the log tail when one exits first, or
        when ``limit_s`` seconds (default: the fleet's ready timeout) pass."""
        assert self._client is not None, "call up() first"
        targets = [self._instances[n] for n in (names or self._instances)]
        limit = self.ready_timeout if limit_s is None else limit_s
        deadline = time.monotonic() + limit
        while True:
            for inst in targets:
                if inst.record.state in ("exited", "stopped", "backoff", "failed"):
                    raise LaunchError(
                        f"{inst.record.name} exited with code {inst.record.exit_code} during "
                        f"start-up; last log lines ({inst.record.log}):\n"
                        + "\n".join("  " + ln for ln in tail(inst.record.log, TAIL_LINES))
                    )
            pending = [i for i in targets if i.record.state == "starting"]
            if not pending:
                if names is None:
                    self._emit("fleet-ready", None, message=f"{len(targets)} instances ready")
                return
            if time.monotonic() > deadline:
                details = "; ".join(f"{i.record.name}: {i.why}" for i in pending)
                first = pending[0].record
                raise LaunchError(
                    f"not ready after {limit:g} s ({details}); raise the timeout with "
                    f"--timeout if the machine is slow. Last log lines of {first.name}:\n"
                    + "\n".join("  " + ln for ln in tail(first.log, TAIL_LINES))
                )
            results = await asyncio.gather(
                *(
                    check_ready(self._client, i.plan.url, i.record.served_name, role=i.plan.role)
                    for i in pending
                )
            )
            for inst, (ok, why) in zip(pending, results, strict=True):
                inst.why = why
                if ok:
                    await self._mark_ready(inst)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), POLL_INTERVAL)

    # ------------------------------------------------------------------ restart / status

    async def restart(self, name: str) -> None:
        """Stop one instance (SIGTERM, SIGKILL after the grace period), start it again and
        wait until it is ready."""
        inst = self._instances.get(name)
        if inst is None:
            raise LaunchError(f"no instance named {name!r} (have: {', '.join(self._instances)})")
        self._emit("restarting", name)
        await self._notify(inst, "down")
        await inst.settle()
        await self._stop_instance(inst)
        inst.tracker.reset()  # an operator's restart: the crash-loop count starts again
        await self._respawn(inst)
        await self.wait_ready(names=[name])  # "restarted" and the router's "up" come with it

    async def stop(self, name: str) -> None:
        """Stop one instance and leave it stopped (``restart`` starts it again)."""
        inst = self._instances.get(name)
        if inst is None:
            raise LaunchError(f"no instance named {name!r} (have: {', '.join(self._instances)})")
        self._emit("stopping", name)
        await self._notify(inst, "down")
        await inst.settle()
        await self._stop_instance(inst)
        self._save()
        self._emit("stopped", name, code=inst.record.exit_code)

    async def status(self) -> list[InstanceStatus]:
        """A fresh snapshot, probing instances that should be serving."""
        assert self._client is not None, "call up() first"
        insts = list(self._instances.values())
        readiness = await asyncio.gather(
            *(
                check_ready(self._client, i.plan.url, i.record.served_name, role=i.plan.role)
                for i in insts
            )
        )
        return [
            status_of(i.record, i.record.state, ok)
            for i, (ok, _why) in zip(insts, readiness, strict=True)
        ]

    def instance_names(self) -> list[str]:
        return list(self._instances)

    # ------------------------------------------------------------------ down

    async def _stop_instance(self, inst: _Instance) -> None:
        inst.stopping = True
        proc = inst.proc
        if proc is None:
            return
        if proc.returncode is None:
            inst.record.state = "stopping"
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # the shepherd stops its group: TERM, then KILL after grace
            try:
                await asyncio.wait_for(proc.wait(), self.grace + 5)
            except TimeoutError:
                await asyncio.to_thread(kill_group, proc.pid, 0)
                await proc.wait()
        # anything left in the group (e.g. engine processes of a crashed server) goes too
        if group_members(proc.pid):
            await asyncio.to_thread(kill_group, proc.pid, 2)
        if inst.watcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await inst.watcher
        inst.record.state = "stopped"

    async def down(self) -> None:
        """Stop every instance and release the state directory. Idempotent."""
        async with self._down_lock:
            if self.stopped.is_set():
                return
            if self._monitor_task is not None:
                self._monitor_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._monitor_task
            await asyncio.gather(*(i.settle() for i in self._instances.values()))
            for inst in self._instances.values():
                if inst.proc is not None and inst.proc.returncode is None:
                    self._emit("stopping", inst.record.name)
            await asyncio.gather(*(self._stop_instance(i) for i in self._instances.values()))
            if self._server is not None:
                self._server.close()
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / "control.sock").unlink()
            for fd in (self._life_w, self._life_r):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._life_r = self._life_w = None
            if self._client is not None:
                await self._client.aclose()
            if self._router is not None:
                await self._router.aclose()
                self._router = None
            if self._up:
                with contextlib.suppress(FileNotFoundError):
                    state_file(self.dir).unlink()
            for inst in self._instances.values():
                self._emit("stopped", inst.record.name, code=inst.record.exit_code)
            self._emit("fleet-stopped", None)
            self.stopped.set()

    # ------------------------------------------------------------------ state / control

    def _save(self) -> None:
        write_state(
            self.dir,
            FleetRecord(
                fleet=self.spec.fleet.name,
                source=self.source,
                supervisor_pid=os.getpid(),
                supervisor_ticks=start_ticks(os.getpid()),
                control_socket=str(self.dir / "control.sock"),
                started_at=self._started_at,
                instances=[i.record for i in self._instances.values()],
            ),
        )

    async def _on_control(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid()}
        if cmd in ("restart", "stop", "down") and self._journal is not None:
            name = req.get("name")
            by = req.get("by")
            self._journal.append(
                [Event(CONTROL, str(name) if name else None, str(cmd), actor=str(by or "?"))]
            )
        if cmd == "restart":
            await self.restart(str(req.get("name")))
            return {"ok": True}
        if cmd == "stop":
            await self.stop(str(req.get("name")))
            return {"ok": True}
        if cmd == "down":
            await self.down()
            return {"ok": True}
        if cmd == "suspect":  # the router saw an instance fail: check it now
            dead = await self.suspect(str(req.get("name")), str(req.get("why") or "")[:300])
            return {"ok": True, "dead": dead}
        return {"ok": False, "error": f"unknown command {cmd!r}"}


def _open_log(inst: _Instance) -> BinaryIO:
    """Forget the previous exit, open the log for appending and write a start header."""
    rec = inst.record
    with contextlib.suppress(FileNotFoundError):
        Path(rec.exit_file).unlink()
    log = open(rec.log, "ab")  # noqa: SIM115 - the caller closes it
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    log.write(f"=== pdctl: starting {rec.name} at {stamp}\n=== {inst.plan.shell()}\n".encode())
    log.flush()
    return log
