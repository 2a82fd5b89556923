"""The Ray backend on a real two-node Ray cluster started on this machine: prefill on the
head (custom resource ``node_a``), decode on the worker (``node_b``), exact routed
outputs with real KV moved, then the worker node killed and decode reported DOWN.

The cluster lives in two sessions of its own (one per node) under a temp dir, so the test
can kill exactly one node's processes; it is always stopped, and nothing of it, nor any
vLLM server of the fleet, may be left running afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.backends.base import BackendStatus
from pdctl.sdk.backends.ray import RayBackend
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.paths import demo_spec_text
from pdctl.sdk.specload import load_spec
from pdctl.sdk.urls import http_url
from tests.conftest import free_ports
from tests.e2e.conftest import demo_spec, processes_mentioning
from tests.e2e.test_e2e_router import KV, PROMPTS, body

pytestmark = pytest.mark.e2e

NAME = "e2e-ray"
RAY = str(Path(sys.executable).parent / "ray")
START_TIMEOUT_S = 180
DEADLINE_S = 180.0
"""How long the cluster may take to notice a dead node (a deadline, not a measurement)."""


@dataclass
class Cluster:
    address: str
    temp_dir: str
    sessions: dict[str, int]
    """node name → session id of the processes of that node."""


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def kill_session(sid: int) -> None:
    """SIGKILL every process of one session (one node's raylet, agents and workers)."""
    for pid in _session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ray_start(args: list[str], log: Path) -> int:
    """``ray start`` in a new session (its daemons stay in it); returns the session id."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [RAY, "start", "--disable-usage-stats", "--num-cpus", "1", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        rc = proc.wait(START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        raise
    assert rc == 0, f"ray start failed ({rc}): {log.read_text()[-2000:]}"
    return proc.pid


def _node_ports(n: int) -> list[str]:
    names = [
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
    ][:n]
    return [x for name, port in zip(names, free_ports(n), strict=True) for x in (name, str(port))]


@pytest.fixture(scope="module")
def cluster(state_root: Path) -> Iterator[Cluster]:
    """A head with ``node_a`` and a worker with ``node_b``; always stopped."""
    temp_dir = tempfile.mkdtemp(prefix="pdray-", dir="/tmp")
    log = Path(temp_dir) / "ray-start.log"
    gcs, client, grpc = free_ports(3)
    address = f"127.0.0.1:{gcs}"
    c = Cluster(address, temp_dir, {})
    common = ["--object-store-memory", str(200 * 1024 * 1024)]
    try:
        c.sessions["head"] = _ray_start(
            [
                "--head",
                "--port",
                str(gcs),
                "--resources",
                json.dumps({"node_a": 1}),
                "--include-dashboard=false",
                "--temp-dir",
                temp_dir,
                "--ray-client-server-port",
                str(client),
                "--dashboard-agent-grpc-port",
                str(grpc),
                *common,
                *_node_ports(5),
            ],
            log,
        )
        c.sessions["worker"] = _ray_start(
            [
                "--address",
                address,
                "--resources",
                json.dumps({"node_b": 1}),
                *common,
                *_node_ports(5),
            ],
            log,
        )
        yield c
    finally:
        _stop_cluster(c)


def _stop_cluster(c: Cluster) -> None:
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()
    for sid in c.sessions.values():
        kill_session(sid)
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=60, check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and processes_mentioning(c.temp_dir):
        time.sleep(0.5)
    left = processes_mentioning(c.temp_dir)
    shutil.rmtree(c.temp_dir, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"


@pytest.fixture(scope="module")
def backend(tiny_model: Path, cluster: Cluster) -> Iterator[RayBackend]:
    _spec, overrides = demo_spec(tiny_model, NAME)
    overrides += [
        "backend.kind=ray",
        f"backend.ray.address={cluster.address}",
        f"backend.ray.namespace=pdctl-{NAME}",
        "backend.ray.groups.prefill.resources.node_a=1",
        "backend.ray.groups.decode.resources.node_b=1",
        # the router is bound to its node's address: without an admin key it would be
        # refused (PD045); this module is about placement, test_e2e_security about keys
        "router.insecure_control=true",
    ]
    spec = load_spec("<demo>", overrides, text=demo_spec_text()).spec
    b = RayBackend(spec, ready_timeout=300, grace=5)
    ports = [str(i.http_port) for i in b.endpoints().instances]
    try:
        asyncio.run(b.up())
        yield b
    finally:
        print(asyncio.run(b.down()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _servers(ports):
            time.sleep(0.5)
        assert not _servers(ports), f"vLLM processes left behind: {_servers(ports)}"


def _servers(ports: list[str]) -> list[str]:
    return [p for port in ports for p in processes_mentioning(f"--port {port} ")]


def _status(b: RayBackend) -> BackendStatus:
    return asyncio.run(b.status())


def test_instances_run_on_the_nodes_with_their_resources(backend: RayBackend):
    # The backend's own wait, not one status: a single status can catch an instance's
    # 2-second readiness probe timing out on a loaded machine right after up() saw it
    # ready. wait_ready raises LaunchError, naming who is not ready, after its limit.
    st = asyncio.run(backend.wait_ready(limit_s=60))
    assert st.all_ready, st.as_dict()
    rec = backend.record()
    assert rec is not None
    nodes = {n.node_id: n for n in backend.cluster.nodes()}
    assert "node_a" in nodes[rec.nodes["prefill-0"]].resources
    assert "node_b" in nodes[rec.nodes["decode-0"]].resources
    assert rec.nodes["prefill-0"] != rec.nodes["decode-0"]
    plan = backend.endpoints()
    for inst in plan.instances:  # servers bind and advertise their node's address
        ip = nodes[rec.nodes[inst.name]].ip
        assert inst.host == ip
        assert inst.side_channel_host == ip


def test_routes_exact_outputs_with_kv_moved_between_nodes(backend: RayBackend):
    plan = backend.endpoints()
    p, d = (i.url for i in plan.instances)
    assert plan.router is not None
    router = http_url(plan.router.host, plan.router.port)

    def counters() -> tuple[float, float]:
        pm = parse(httpx.get(p + "/metrics").text)
        dm = parse(httpx.get(d + "/metrics").text)
        return total(pm, "vllm:nixl_bytes_transferred_sum") or 0.0, total(dm, *KV) or 0.0

    b0, t0 = counters()
    with httpx.Client(timeout=120) as c:
        for prompt in PROMPTS:
            alone = c.post(d + "/v1/completions", json=body(prompt))
            routed = c.post(router + "/v1/completions", json=body(prompt))
            assert routed.status_code == 200, routed.text
            assert routed.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
    b1, t1 = counters()
    assert b1 > b0, "no KV bytes moved through NIXL"
    assert t1 - t0 >= len(PROMPTS), "decode took no prompt tokens from KV transfer"


def test_worker_node_death_reports_decode_down(backend: RayBackend, cluster: Cluster):
    plan = backend.endpoints()
    decode = plan.by_name("decode-0")
    monitor = FleetMonitor.for_fleet(backend.resolved(), plan, timeout_s=2.0)
    assert asyncio.run(monitor.poll()).instance("decode-0").health == "UP"

    kill_session(cluster.sessions.pop("worker"))

    deadline = time.monotonic() + DEADLINE_S
    while True:
        st = {i.name: i for i in _status(backend).instances}
        if st["decode-0"].state == "gone" or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert st["decode-0"].state == "gone", st["decode-0"]
    assert "died" in st["decode-0"].log_tail[-1], st["decode-0"].log_tail
    assert st["prefill-0"].state == "ready", st["prefill-0"]
    assert asyncio.run(monitor.poll()).instance("decode-0").health in ("DOWN", "STALE")
    # the decode actor's end closed its shepherd's lifeline: no server is left on the node
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _servers([str(decode.http_port)]):
        time.sleep(0.5)
    assert not _servers([str(decode.http_port)])
