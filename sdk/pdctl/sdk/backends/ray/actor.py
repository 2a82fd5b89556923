"""The Ray actor behind one instance: it runs on the instance's node and supervises it.

The actor renders its instance from the resolved spec *on the node* (so the interpreter
and ``~`` in the model path are the node's), then starts it under pdctl's shepherd
exactly as the local launcher does: its own process group, CPU pinning, and a lifeline
pipe whose write end only this actor holds. Whatever ends the actor — ``pdctl down``,
``ray.kill``, ``ray stop``, its worker or its whole node dying — closes the lifeline, and
the shepherd stops every process of the instance: no vLLM process outlives its actor.

Plain Python: the backend wraps :class:`InstanceProcess` with ``ray.remote``; Ray is
imported only inside the methods that ask it something.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.fleet.probe import probe_ready
from pdctl.sdk.fleet.procs import kill_group
from pdctl.sdk.fleet.state import read_exit, state_root, tail
from pdctl.sdk.modelinfo import looks_like_local_path
from pdctl.sdk.render import InstancePlan, render_fleet, router_plan
from pdctl.sdk.shepherd import group_members
from pdctl.sdk.spec import FleetSpec

TAIL_LINES = 15
PROBE_TIMEOUT_S = 2.0


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
    return render_fleet(spec).by_name(name)


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
        self.stopping = False
        self._life_w: int | None = None

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
        return self.info()

    def exit_code(self) -> int | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        ex = read_exit(str(self.exit_file))
        rc = self.proc.returncode
        return ex[0] if ex else (rc if rc >= 0 else 128 - rc)

    def info(self) -> dict[str, Any]:
        """State as the node sees it: running instances are probed on their own address."""
        code = self.exit_code()
        state = "starting"
        why = ""
        if self.proc is None:
            state = "starting"
        elif code is not None:
            state = "stopped" if self.stopping else "exited"
        elif self.stopping:
            state = "stopping"
        elif self.plan is not None:
            ok, why = self._probe(self.plan)
            if ok:
                self.ready_at = self.ready_at or time.time()
                state = "ready"
            elif self.ready_at is not None:
                state = "unhealthy"
        return {
            "state": state,
            "why": why,
            "pid": self.proc.pid if self.proc is not None else None,
            "exit_code": code,
            "started_at": self.started_at,
            "log": f"{self.record.node_ip}:{self.log}",
            "log_tail": tail(str(self.log), TAIL_LINES) if code is not None else [],
        }

    def _probe(self, plan: InstancePlan) -> tuple[bool, str]:
        """The launcher's readiness probe, on a loop of its own (Ray may run actor
        methods on a thread that already has one)."""

        async def probe() -> tuple[bool, str]:
            async with httpx.AsyncClient() as client:
                served = self.spec.model.effective_served_name
                return await probe_ready(client, plan.url, served, PROBE_TIMEOUT_S)

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, probe()).result(timeout=PROBE_TIMEOUT_S * 3)

    def stop(self) -> dict[str, Any]:
        """SIGTERM to the shepherd (it stops the group, SIGKILL after the grace period);
        whatever is left after that goes too. Returns the final :meth:`info`."""
        self.stopping = True
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
        if self._life_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._life_w)
            self._life_w = None
        return self.info()
