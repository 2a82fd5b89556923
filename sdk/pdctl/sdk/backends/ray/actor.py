"""The Ray actor behind one instance: it runs on the instance's node and supervises it.

The actor plans its instance from the resolved spec *on the node* (so the interpreter
and ``~`` in the model path are the node's), then starts it under pdctl's shepherd
exactly as the local launcher does: its own process group, CPU pinning, and a lifeline
pipe whose write end only this actor holds. Whatever ends the actor — ``pdctl down``,
``ray.kill``, ``ray stop``, its worker or its whole node dying — closes the lifeline, and
the shepherd stops every process of the instance: no vLLM process outlives its actor.

The actor also applies the group's restart policy, by the same rules as the local
supervisor (:mod:`pdctl.sdk.fleet.policy`): a thread watches the instance, counts any exit
it did not ask for (code 0 included) and a ready API server whose engine died as a
failure, restarts it after the backoff with a fresh engine id, gives up on a crash loop,
and tells the router ``down``/``up``. Ray itself never restarts the actor (see
:meth:`~pdctl.sdk.backends.ray.cluster.RayCluster.create`).

Plain Python: the backend wraps :class:`InstanceProcess` with ``ray.remote``; Ray is
imported only inside the methods that ask it something.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.client import InstanceEvent
from pdctl.sdk.fleet.policy import Liveness, RestartPolicy, RestartTracker
from pdctl.sdk.fleet.procs import kill_group
from pdctl.sdk.fleet.readiness import check_ready, health_status
from pdctl.sdk.fleet.state import read_exit, state_root, tail
from pdctl.sdk.fleet.supervisor import RouterNotifier, router_api_key
from pdctl.sdk.fleetplan import InstancePlan, build_plan, router_plan, with_engine_id
from pdctl.sdk.modelinfo import looks_like_local_path
from pdctl.sdk.shepherd import group_members
from pdctl.sdk.spec import FleetSpec

TAIL_LINES = 15
CHECK_TIMEOUT_S = 2.0
MISSES_TO_UNHEALTHY = 2
"""Readiness checks missed in a row before an instance that was ready shows unhealthy."""
WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class ActorRecord:
    """What an instance's actor is told, and tells anyone who asks (``pdctl status``
    from another shell reads the fleet's resolved spec back from any live actor)."""

    fleet: str
    name: str
    spec_json: str
    """The resolved spec (hosts are node addresses)."""
    node_id: str
    node_ip: str
    grace: float
    nodes: dict[str, str]
    """Every instance of the fleet → the Ray node id it was placed on."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def instance_plan(spec: FleetSpec, name: str, spec_file: Path | None = None) -> InstancePlan:
    """The launch plan of instance ``name`` (``router``: the router over ``spec_file``)."""
    if name == "router":
        argv = (sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(spec_file))
        plan = router_plan(spec, argv)
        if plan is None:
            raise ValueError("the spec has no [router]")
        return plan
    return build_plan(spec).by_name(name)


def gpu_env(platform: str) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES from the GPUs Ray gave this actor (GPU platform only)."""
    if platform != "gpu":
        return {}
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ids)}


class InstanceProcess:
    """One instance under a shepherd, on this node. Methods return plain dicts."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = ActorRecord(**record)
        self.spec = FleetSpec.model_validate_json(self.record.spec_json)
        self.dir = state_root() / "ray" / self.record.fleet
        self.log = self.dir / f"{self.record.name}.log"
        self.exit_file = self.dir / f"{self.record.name}.exit"
        self.proc: subprocess.Popen[bytes] | None = None
        self.plan: InstancePlan | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self._misses = 0
        """Readiness checks missed in a row by :meth:`info`."""
        self.stopping = False
        self._life_w: int | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._watcher: threading.Thread | None = None
        self.restarts = 0
        self.last_restart_at: float | None = None
        self.next_restart_at: float | None = None
        self.last_failure: str | None = None
        self._live = False
        """The watcher has seen this process ready (its liveness is being watched)."""
        self._ever_ready = self._told_up = False
        self.gave_up = False
        """The restart policy gave up (a crash loop): state failed."""
        self.policy = RestartPolicy()
        self.tracker = RestartTracker(self.policy)
        self.liveness = Liveness()

    def describe(self) -> dict[str, Any]:
        return self.record.as_dict()

    def start(self) -> dict[str, Any]:
        """Start the instance; ``{"error": …}`` when it cannot be (the model is missing)."""
        if self.proc is not None:
            return self.info()
        self.dir.mkdir(parents=True, exist_ok=True)
        spec_file = self.dir / f"{self.record.name}.spec.json"
        spec_file.write_text(self.record.spec_json)
        self.plan = plan = instance_plan(self.spec, self.record.name, spec_file)
        path = self.spec.model.path
        local = plan.role != "router" and looks_like_local_path(path)
        if local and not Path(os.path.expanduser(path)).exists():
            return {"error": f"model.path {path} does not exist on node {self.record.node_ip}"}
        self.policy = RestartPolicy.for_plan(self.spec, plan)
        self.tracker = RestartTracker(self.policy)
        self.liveness = Liveness(http_errors_are_fatal=plan.role != "router")
        self._spawn(plan)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        return self.info()

    def _spawn(self, plan: InstancePlan) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.exit_file.unlink()
        life_r, self._life_w = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "pdctl.sdk.shepherd",
            "--lifeline",
            str(life_r),
            "--exit-file",
            str(self.exit_file),
            "--grace",
            str(self.record.grace),
            "--cpus",
            ",".join(str(c) for c in plan.cpu_cores),
            "--",
            *plan.argv,
        ]
        env = {**os.environ, **plan.env, **gpu_env(self.spec.fleet.platform)}
        with open(self.log, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            header = f"=== pdctl (ray): starting {plan.name} at {stamp}\n=== {plan.shell()}\n"
            log.write(header.encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(life_r,),
            )
        os.close(life_r)  # the shepherd holds its own copy; EOF comes when we go
        self.started_at = time.time()
        self.ready_at = None
        self._live = self._told_up = False

    def exit_code(self) -> int | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        ex = read_exit(str(self.exit_file))
        rc = self.proc.returncode
        return ex[0] if ex else (rc if rc >= 0 else 128 - rc)

    def info(self) -> dict[str, Any]:
        """State as the node sees it: running instances are checked on their own address."""
        code = self.exit_code()
        state = "starting"
        why = ""
        if self.proc is None:
            state = "starting"
        elif self.gave_up:
            state = "failed"
        elif self.next_restart_at is not None:
            state = "backoff"
        elif code is not None:
            state = "stopped" if self.stopping else "exited"
        elif self.stopping:
            state = "stopping"
        elif self.plan is not None:
            ok, why = self._check_ready(self.plan)
            self._misses = 0 if ok else self._misses + 1
            if ok:
                self._seen_ready()
                state = "ready"
            elif self.ready_at is not None:
                # one check that missed its 2 s (a busy CPU server) is not a verdict
                state = "unhealthy" if self._misses >= MISSES_TO_UNHEALTHY else "ready"
        return {
            "state": state,
            "why": why,
            "pid": self.proc.pid if self.proc is not None else None,
            "exit_code": code,
            "started_at": self.started_at,
            "log": f"{self.record.node_ip}:{self.log}",
            "log_tail": tail(str(self.log), TAIL_LINES) if code is not None else [],
            "restarts": self.restarts,
            "restart_policy": self.policy.describe(),
            "last_restart_at": self.last_restart_at,
            "next_restart_at": self.next_restart_at,
            "last_failure": self.last_failure,
        }

    def _check_ready(self, plan: InstancePlan) -> tuple[bool, str]:
        """The launcher's readiness check, on a loop of its own (Ray may run actor
        methods on a thread that already has one)."""

        async def check() -> tuple[bool, str]:
            async with httpx.AsyncClient() as client:
                served = self.spec.model.effective_served_name
                return await check_ready(client, plan.url, served, CHECK_TIMEOUT_S)

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, check()).result(timeout=CHECK_TIMEOUT_S * 3)

    def stop(self) -> dict[str, Any]:
        """SIGTERM to the shepherd (it stops the group, SIGKILL after the grace period);
        whatever is left after that goes too. Returns the final :meth:`info`."""
        self.stopping = True
        self._stop.set()
        with self._lock:
            self._stop_group()
        if self._life_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._life_w)
            self._life_w = None
        return self.info()

    def _stop_group(self) -> None:
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    proc.wait(self.record.grace + 5)
                except subprocess.TimeoutExpired:
                    kill_group(proc.pid, 0)
                    proc.wait(5)
            if group_members(proc.pid):
                kill_group(proc.pid, 2)

    # ------------------------------------------------------------------ restart policy

    def _watch(self) -> None:
        """The restart policy's thread: until :meth:`stop`, once a second."""
        while not self._stop.wait(WATCH_INTERVAL_S):
            try:
                self._watch_once()
            except Exception as e:  # supervision goes on whatever one round hit
                self.last_failure = f"watcher: {type(e).__name__}: {e}"

    def _watch_once(self) -> None:
        plan = self.plan
        if plan is None or self.gave_up or self.stopping:
            return
        code = self.exit_code()
        if code is not None:
            why = f"exited with code {code}"
            self._failed(why + (" without being asked to" if code == 0 else ""))
            return
        if not self._live:
            if not self._check_ready(plan)[0]:
                return
            self._seen_ready()
        if self.restarts and not self._told_up:
            self._told_up = True
            self._notify("up")
        dead = self.liveness.observe(self._health(plan), time.monotonic())
        if dead is not None:
            with self._lock:
                self._stop_group()  # an API server up without an engine: stop it
            self._failed(dead)

    def _seen_ready(self) -> None:
        if not self._live:
            self._live = self._ever_ready = True
            self.ready_at = self.ready_at or time.time()
            self.liveness.reset(time.monotonic())

    def _failed(self, why: str) -> None:
        self.last_failure = why
        self._notify("down")
        if not self._ever_ready:
            self._stop.set()  # a start-up failure: reported as exited, never looped
            return
        decision = self.tracker.on_failure(time.time())
        if not decision.restart:
            self.gave_up = True
            self.last_failure = f"{why}; {decision.message}"
            return
        self.next_restart_at = time.time() + decision.delay_s
        if self._stop.wait(decision.delay_s):
            return
        with self._lock:
            if self.stopping:
                return
            self._stop_group()
            self.restarts += 1
            self.last_restart_at = time.time()
            self.next_restart_at = None
            assert self.plan is not None
            base = instance_plan(self.spec, self.record.name).engine_id
            if base is not None:  # a fresh engine id: peers must not reuse the dead agent
                self.plan = with_engine_id(self.plan, f"{base}-r{self.restarts}")
            self._spawn(self.plan)

    def _health(self, plan: InstancePlan) -> int | None:
        async def check() -> int | None:
            async with httpx.AsyncClient() as client:
                return await health_status(client, plan.url, CHECK_TIMEOUT_S)

        return asyncio.run(check())

    def _notify(self, event: InstanceEvent) -> None:
        """Tell the router (when the fleet has one, and this is not it)."""
        router = router_plan(self.spec, ())
        if router is None or self.plan is None or self.plan.role == "router":
            return
        notifier = RouterNotifier(router.url, router_api_key(self.spec))
        asyncio.run(notifier(self.record.name, event))
