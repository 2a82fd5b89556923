"""Supervision of a running local fleet: exits, dead engines, the restart policy, and the
router's word on each instance.

:class:`Supervisor` is the half of :class:`~pdctl.sdk.fleet.launcher.AsyncFleet` that
runs once instances are started: a watcher per instance process and one monitor task.

* Any exit the supervisor did not ask for is a failure, code 0 included (vLLM's API
  server exits 0 when its engine core dies).
* An instance that was ready and whose ``/health`` then answers 5xx (vLLM keeps HTTP up
  with a dead engine) or stays silent (:class:`~pdctl.sdk.fleet.policy.Liveness`) is
  stopped and counts as failed.
* A failed instance is restarted by its group's policy
  (:class:`~pdctl.sdk.fleet.policy.RestartTracker`): after a backoff, with a fresh engine
  id, until too many restarts in the window make it a crash loop.
* The router's word that it saw an instance fail (a 5xx, an error event, a lost
  connection: :mod:`pdctl.sdk.router.suspects`) makes the supervisor check that
  instance's ``/health`` at once: one 5xx (vLLM's dead engine) is enough to stop and
  restart it, without waiting for the monitor's rounds (:meth:`Supervisor.suspect`).
* The router hears ``down`` the moment an instance fails, is stopped or restarted, and
  ``up`` the moment it is ready again; a router that cannot be reached never stops
  supervision (logged, short timeout).

An instance that fails before it was ever ready is not restarted: start-up errors (a
missing model, a port in use) fail ``up`` at once with the log tail instead of looping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from pdctl.sdk.client import AsyncRouterClient, InstanceEvent
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.events.journal import Journal
from pdctl.sdk.fleet.events import EventKind, FleetEvent, journal_event
from pdctl.sdk.fleet.policy import Liveness, RestartPolicy, RestartTracker
from pdctl.sdk.fleet.readiness import check_ready, health_status
from pdctl.sdk.fleet.state import InstanceRecord, read_exit, tail
from pdctl.sdk.fleetplan import InstancePlan, with_engine_id
from pdctl.sdk.keys import admin_key
from pdctl.sdk.spec import FleetSpec

log = logging.getLogger("pdctl.fleet")

MONITOR_INTERVAL_S = 1.0
NOTIFY_TIMEOUT_S = 2.0
TAIL_LINES = 15


@dataclass
class _Instance:
    plan: InstancePlan
    record: InstanceRecord
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    proc: asyncio.subprocess.Process | None = None
    watcher: asyncio.Task[None] | None = None
    pending: asyncio.Task[None] | None = None
    """A restart the policy has scheduled (state backoff) or is carrying out."""
    backing_off: bool = False
    stopping: bool = False
    ever_ready: bool = False
    killing: asyncio.Task[None] | None = None
    """A stop-and-restart of a dead engine the router's word started."""
    told: str | None = None
    """What the router was last told about this instance ("up" or "down")."""
    why: str = "starting"
    tracker: RestartTracker = field(init=False)
    liveness: Liveness = field(init=False)

    def __post_init__(self) -> None:
        self.tracker = RestartTracker(self.policy)
        self.liveness = Liveness(http_errors_are_fatal=self.plan.role != "router")
        self.record.restart_policy = self.policy.describe()

    async def settle(self) -> None:
        """Leave no restart by policy behind: one still backing off is cancelled, one
        under way is waited for (so an operator's stop or restart acts on its result)."""
        task = self.pending
        if task is not None:
            if self.backing_off:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.pending = None
        self.backing_off = False
        self.record.next_restart_at = None


def router_api_key(spec: FleetSpec) -> str | None:
    """The admin key the router wants on control requests (None: none set, or unreadable)."""
    return admin_key(spec)


class RouterNotifier:
    """Tells the router an instance is up or down; failures are logged, never raised.
    One short connection per call, so one notifier serves any event loop."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._url = url
        self._api_key = api_key
        self._transport = transport
        self.failures = 0

    async def __call__(self, instance: str, event: InstanceEvent) -> bool:
        try:
            async with AsyncRouterClient(
                self._url,
                api_key=self._api_key,
                control_timeout_s=NOTIFY_TIMEOUT_S,
                transport=self._transport,
            ) as router:
                await router.notify(instance, event)
        except PdctlError as e:
            self.failures += 1
            log.warning("could not tell the router %s is %s: %s", instance, event, e)
            return False
        return True


class Supervisor:
    """Watches started instances and applies the restart policy (see the module doc).

    The subclass provides the process plumbing: :meth:`_spawn`, :meth:`_stop_instance`
    and :meth:`_save`.
    """

    _instances: dict[str, _Instance]
    _client: httpx.AsyncClient | None
    _notifier: RouterNotifier | None
    _base_engine_ids: dict[str, str | None]
    _subscribers: list[asyncio.Queue[FleetEvent]]
    _changed: asyncio.Event
    _journal: Journal | None

    # ------------------------------------------------------------------ hooks

    async def _spawn(self, inst: _Instance) -> None:
        raise NotImplementedError

    async def _stop_instance(self, inst: _Instance) -> None:
        raise NotImplementedError

    def _save(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ events

    def _emit(
        self,
        kind: EventKind,
        name: str | None,
        *,
        code: int | None = None,
        message: str = "",
        log_tail: Iterable[str] = (),
    ) -> None:
        """Hand an event to every subscriber of ``events()`` and wake ``wait_ready``."""
        ev = FleetEvent(kind, name, code=code, message=message, log_tail=tuple(log_tail))
        if self._journal is not None:  # kept in the state directory for `pdctl events`
            self._journal.append([journal_event(ev)])
        for q in list(self._subscribers):
            q.put_nowait(ev)
        self._changed.set()

    # ------------------------------------------------------------------ router

    async def _notify(self, inst: _Instance, event: InstanceEvent) -> None:
        if self._notifier is None or inst.plan.role in ("router", "prometheus"):
            return
        if event == "down" and inst.told == "down":
            return  # the router knows already (an early exit, then the watcher)
        inst.told = event
        await self._notifier(inst.record.name, event)

    # ------------------------------------------------------------------ failures

    async def _watch(self, inst: _Instance, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        if inst.proc is not proc:
            return
        ex = read_exit(inst.record.exit_file)
        code = ex[0] if ex else (rc if rc >= 0 else 128 - rc)
        inst.record.exit_code = code
        if inst.stopping:
            inst.record.state = "stopped"
            self._save()
            return
        inst.record.state = "exited"
        why = f"exited with code {code}"
        if code == 0:
            why += " without being asked to (vLLM's API server does when its engine dies)"
        inst.record.last_failure = why
        self._emit(
            "exited",
            inst.record.name,
            code=code,
            message=f"{inst.record.name} {why}",
            log_tail=tail(inst.record.log, TAIL_LINES),
        )
        self._save()
        await self._failed(inst, why)

    async def _failed(self, inst: _Instance, why: str) -> None:
        """``inst`` has failed (its processes are gone): restart it by policy."""
        rec = inst.record
        rec.last_failure = why
        await self._notify(inst, "down")
        if not inst.ever_ready:
            self._save()  # a start-up failure: wait_ready reports it
            return
        decision = inst.tracker.on_failure(time.time())
        if decision.restart:
            rec.state = "backoff"
            rec.next_restart_at = time.time() + decision.delay_s
            self._emit("backoff", rec.name, code=rec.exit_code, message=decision.message)
            inst.backing_off = True
            inst.pending = asyncio.create_task(self._restart_later(inst, decision.delay_s))
        elif inst.policy.mode == "never":
            rec.state = "exited"
        else:
            rec.state = "failed"
            self._emit("gave-up", rec.name, code=rec.exit_code, message=decision.message)
        self._save()

    async def _restart_later(self, inst: _Instance, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        inst.backing_off = False  # from here on, an operator's restart or stop waits for us
        try:
            n = inst.tracker.in_window(time.time())
            msg = f"by policy (restart {n} of {inst.policy.max_restarts} in the window)"
            self._emit("restarting", inst.record.name, message=msg)
            await self._stop_instance(inst)  # whatever the failed instance left behind
            await self._respawn(inst)
        finally:
            inst.pending = None

    async def _respawn(self, inst: _Instance) -> None:
        """Start a stopped instance again, announcing a fresh engine id."""
        rec = inst.record
        rec.restarts += 1
        rec.last_restart_at = time.time()
        rec.next_restart_at = None
        name = rec.name
        base = self._base_engine_ids.setdefault(name, inst.plan.engine_id)
        if base is not None:
            # a fresh engine id, so that peers never reuse the dead engine's NIXL agent
            inst.plan = with_engine_id(inst.plan, f"{base}-r{rec.restarts}")
            rec.engine_id = inst.plan.engine_id
        await self._spawn(inst)
        self._save()

    # ------------------------------------------------------------------ readiness / liveness

    async def _mark_ready(self, inst: _Instance) -> None:
        rec = inst.record
        if rec.state != "starting":
            return
        rec.state = "ready"
        rec.ready_at = time.time()
        inst.ever_ready = True
        inst.liveness.reset(time.monotonic())
        if rec.restarts:
            # the router hears it before anyone can read "ready" in the state file
            await self._notify(inst, "up")
        took = rec.ready_at - (rec.started_at or rec.ready_at)
        self._emit("ready", rec.name, message=f"ready in {took:.1f} s")
        self._save()
        if rec.restarts:
            self._emit("restarted", rec.name, message=f"restart #{rec.restarts}")

    async def _monitor(self) -> None:
        """Readiness of starting instances, liveness of ready ones, once a second."""
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            try:
                await self._monitor_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # supervision must go on whatever one round hit
                log.exception("fleet monitor round failed")

    async def _monitor_once(self) -> None:
        assert self._client is not None
        client = self._client
        insts = [i for i in self._instances.values() if not i.stopping]
        for inst in insts:
            await self._early_exit(inst)
        starting = [i for i in insts if i.record.state == "starting"]
        live = [i for i in insts if i.record.state in ("ready", "unhealthy")]
        ready = await asyncio.gather(
            *(
                check_ready(client, i.plan.url, i.record.served_name, role=i.plan.role)
                for i in starting
            )
        )
        health = await asyncio.gather(
            *(health_status(client, i.plan.url, role=i.plan.role) for i in live)
        )
        for inst, (ok, why) in zip(starting, ready, strict=True):
            inst.why = why
            if ok:
                await self._mark_ready(inst)
        now = time.monotonic()
        for inst, status in zip(live, health, strict=True):
            if inst.stopping or inst.killing is not None:
                continue
            if inst.record.state not in ("ready", "unhealthy"):
                continue
            dead = inst.liveness.observe(status, now)
            if dead is not None:
                await self._kill_dead(inst, dead)

    async def _early_exit(self, inst: _Instance) -> None:
        """The shepherd writes the exit file the moment the server exits, then clears up
        the rest of its group (up to the grace period) before it exits itself: tell the
        router and the state file now rather than then."""
        rec = inst.record
        if rec.state not in ("starting", "ready", "unhealthy"):
            return
        ex = read_exit(rec.exit_file)
        if ex is None or ex[1] < (rec.started_at or 0):
            return
        rec.state = "exited"
        rec.exit_code = ex[0]
        rec.last_failure = f"exited with code {ex[0]}"
        self._save()
        await self._notify(inst, "down")

    async def suspect(self, name: str, why: str) -> bool:
        """The router saw ``name`` fail a request (``why``). Check its ``/health`` now;
        a 5xx (vLLM answers 503 once its EngineCore is dead:
        ``vllm/entrypoints/serve/instrumentator/health.py``) stops it and restarts it by
        policy at once, in the background. The router's word alone never does: an
        instance that answers 200, or nothing yet, is left to the monitor. Returns
        whether the instance was found dead."""
        inst = self._instances.get(name)
        if inst is None or self._client is None or inst.plan.role in ("router", "prometheus"):
            return False
        if inst.stopping or inst.killing is not None or inst.record.state != "ready":
            return False
        status = await health_status(self._client, inst.plan.url, role=inst.plan.role)
        if status is None or status < 500:
            return False
        if inst.stopping or inst.killing is not None or inst.record.state != "ready":
            return False  # the monitor or a watcher got there first
        dead = f"the router saw it fail ({why[:200]}) and /health answered {status}"
        inst.killing = asyncio.create_task(self._kill_dead(inst, dead))
        inst.killing.add_done_callback(lambda _t: setattr(inst, "killing", None))
        return True

    async def _kill_dead(self, inst: _Instance, why: str) -> None:
        """An API server up without an engine: stop it, then treat it as failed."""
        rec = inst.record
        rec.state = "unhealthy"
        self._emit("unhealthy", rec.name, message=f"{why}; stopping it")
        await self._stop_instance(inst)
        inst.stopping = False
        await self._failed(inst, why)
