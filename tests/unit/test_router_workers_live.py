"""``router.workers = 2`` for real on loopback: the router server as a parent process and
two workers sharing the port, in front of pdctl's mock prefill and decode (processes too).
Both workers serve; a control change reaches both before it is answered; ``/metrics`` is
one merged view; a killed worker is replaced (with the changes made so far) and the
counters do not go back; SIGTERM stops everything, and a parent killed outright takes
its workers with it: nothing is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.freeports import free_port
from pdctl.sdk.linesock import ask
from pdctl.sdk.spec import FleetSpec

pytestmark = pytest.mark.slow

BODY = {"model": "tiny", "prompt": "hello there", "max_tokens": 4}


def spec_for(p: int, d: int, port: int, workers: int) -> FleetSpec:
    return FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": p, "devices": [0]}],
        decode=[{"http_port": d, "devices": [1]}],
        router={"port": port, "workers": workers},
    )


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out.extend(int(c) for c in task.read_text().split())
    return out


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_for(cond: Any, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {limit_s} s: {what}")


@dataclass
class Router:
    proc: subprocess.Popen[bytes]
    url: str

    def workers(self) -> dict[int, tuple[int, Path]]:
        """worker index -> (pid, its channel socket)."""
        out = {}
        for pid in children(self.proc.pid):
            argv = cmdline(pid)
            if "--worker-of" in argv:
                folder = Path(argv[argv.index("--worker-of") + 1])
                index = int(argv[argv.index("--worker-index") + 1])
                out[index] = (pid, folder / f"worker-{index}.sock")
        return out

    def read(self, index: int, what: str) -> dict[str, Any]:
        """Ask worker ``index`` itself (not the merged view)."""
        sock = self.workers()[index][1]
        return asyncio.run(ask(sock, {"op": "read", "what": what}, 5.0))

    def serving(self) -> bool:
        try:
            text = httpx.get(self.url + "/metrics", timeout=2).text
        except httpx.HTTPError:
            return False
        return 'pdctl_router_workers{state="serving"} 2.0' in text


def start_router(tmp: Path, p: int, d: int, workers: int = 2) -> Router:
    port = free_port()
    f = tmp / f"spec-{port}.json"
    f.write_text(spec_for(p, d, port, workers).model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]
    )
    r = Router(proc, f"http://127.0.0.1:{port}")
    wait_for(lambda: r.serving() or proc.poll() is not None, 30, "the router's 2 workers serve")
    assert proc.poll() is None, "the router exited while starting"
    return r


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def mocks() -> Iterator[tuple[int, int]]:
    p, d = free_port(), free_port()
    py = [sys.executable, "-m", "pdctl.sdk.router.mock", "--no-record"]
    procs = [
        subprocess.Popen([*py, "--role", "prefill", "--port", str(p)]),
        subprocess.Popen([*py, "--role", "decode", "--port", str(d)]),
    ]
    try:
        for port in (p, d):
            wait_for(lambda port=port: _up(port), 20, f"mock on {port}")
        yield p, d
    finally:
        for proc in procs:
            stop(proc)


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def router(mocks: tuple[int, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    r = start_router(tmp_path_factory.mktemp("workers"), *mocks)
    try:
        yield r
    finally:
        stop(r.proc)


def served(r: Router, index: int) -> float:
    snap = r.read(index, "metrics")["snapshot"]
    fam = next(f for f in snap if f["name"] == "pdctl_router_requests_total")
    return float(sum(v for lv, v in fam["samples"] if lv[1] == "ok"))


def merged_ok(r: Router) -> float:
    text = httpx.get(r.url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pdctl_router_requests_total{") and 'outcome="ok"' in line
    )


def test_both_workers_serve_and_metrics_is_one_merged_view(router: Router) -> None:
    assert sorted(router.workers()) == [0, 1]
    for _ in range(60):  # a fresh connection each: the kernel spreads connections
        with httpx.Client(timeout=5) as c:
            assert c.post(router.url + "/v1/completions", json=BODY).status_code == 200
    mine = [served(router, i) for i in (0, 1)]
    assert all(n > 0 for n in mine), f"one worker served nothing: {mine}"
    text = httpx.get(router.url + "/metrics", timeout=5).text
    assert merged_ok(router) == sum(mine) >= 60
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps)), "a metric family appears twice"
    assert 'pdctl_router_workers{state="configured"} 2.0' in text
    found = httpx.get(router.url + "/v1/pdctl/requests?limit=1000", timeout=5).json()
    assert len(found["requests"]) == sum(mine)
    stamps = [t["received"] for t in found["requests"]]
    assert stamps == sorted(stamps, reverse=True)


def test_a_control_change_reaches_every_worker_before_the_answer(router: Router) -> None:
    r = httpx.post(router.url + "/v1/pdctl/mode", json={"mode": "push-sequential"}, timeout=5)
    assert r.status_code == 200, r.text
    change = r.json()["change"]
    assert (change["applied"], change["of"], change["restarted"]) == (2, 2, [])
    assert all(router.read(i, "state")["state"]["mode"] == "push-sequential" for i in (0, 1))
    bad = httpx.post(router.url + "/v1/pdctl/mode", json={"mode": "nope"}, timeout=5)
    assert bad.status_code == 400
    assert "push-sequential" in bad.text
    r = httpx.post(router.url + "/v1/pdctl/mode", json={"mode": "push"}, timeout=5)
    assert r.json()["change"]["version"] == change["version"] + 1
    audit = httpx.get(router.url + "/v1/pdctl/audit", timeout=5).json()["entries"]
    modes = [e for e in audit if e["action"] == "POST /v1/pdctl/mode"]
    assert len(modes) == 3, "each control request is audited once, by one worker"


def test_a_killed_worker_is_replaced_with_the_changes_so_far(router: Router) -> None:
    drain = {"instance": "prefill-0", "drain": True}
    assert httpx.post(router.url + "/v1/pdctl/drain", json=drain, timeout=5).status_code == 200
    before = merged_ok(router)
    pid, _ = router.workers()[1]
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: router.workers().get(1, (pid,))[0] != pid and router.serving(),
        30,
        "worker 1 replaced",
    )
    text = httpx.get(router.url + "/metrics", timeout=5).text
    assert "pdctl_router_worker_restarts_total 1.0" in text
    assert merged_ok(router) >= before, "a summed counter went back when a worker died"
    state = router.read(1, "state")["state"]
    assert next(i for i in state["instances"] if i["name"] == "prefill-0")["drained"]
    undrain = {"instance": "prefill-0", "drain": False}
    assert httpx.post(router.url + "/v1/pdctl/drain", json=undrain, timeout=5).status_code == 200
    assert httpx.post(router.url + "/v1/completions", json=BODY, timeout=5).status_code == 200


def test_a_hung_worker_is_replaced_before_a_change_is_answered(router: Router) -> None:
    pid, _ = router.workers()[0]
    os.kill(pid, signal.SIGSTOP)  # alive, silent: it cannot apply the change
    answer = None
    try:
        # the kernel spreads connections over the two workers by a hash of their ports: one
        # it gives the stopped worker gets no answer, so ask again on a new connection (the
        # chance that 12 all land there is 1 in 4096)
        for _ in range(12):
            with contextlib.suppress(httpx.TimeoutException):
                answer = httpx.post(router.url + "/v1/pdctl/mode", json={"mode": "push"}, timeout=5)
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert answer is not None, "no live worker answered"
    assert answer.status_code == 200, answer.text
    change = answer.json()["change"]
    assert (change["applied"], change["restarted"]) == (1, [0])
    wait_for(
        lambda: router.workers().get(0, (pid,))[0] != pid and router.serving(),
        30,
        "the hung worker replaced",
    )


def test_sigterm_stops_every_worker(router: Router) -> None:
    pids = [pid for pid, _ in router.workers().values()]
    assert len(pids) == 2
    router.proc.send_signal(signal.SIGTERM)
    folder = router.workers()[0][1].parent
    assert router.proc.wait(20) == 0
    wait_for(lambda: not any(alive(p) for p in pids), 5, "the workers exit with the parent")
    assert not folder.exists()


def test_a_parent_killed_outright_leaves_no_worker(mocks: tuple[int, int], tmp_path: Path) -> None:
    r = start_router(tmp_path, *mocks)
    pids = [pid for pid, _ in r.workers().values()]
    assert len(pids) == 2
    folder = r.workers()[0][1].parent
    r.proc.kill()
    r.proc.wait()
    wait_for(lambda: not any(alive(p) for p in pids), 10, "orphaned workers exit")
    wait_for(lambda: not folder.exists(), 5, "the orphans clear the channel's folder")


def test_pdctl_router_runs_the_workers_on_the_port_it_is_given(
    mocks: tuple[int, int], tmp_path: Path
) -> None:
    f = tmp_path / "spec.json"
    f.write_text(spec_for(*mocks, free_port(), 2).model_dump_json())
    port = free_port()
    cli = [sys.executable, "-m", "pdctl.cli.main", "router", "--spec-json", str(f)]
    proc = subprocess.Popen([*cli, "--port", str(port)])
    r = Router(proc, f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: r.serving() or proc.poll() is not None, 30, "2 workers on --port")
        assert proc.poll() is None
        assert httpx.post(r.url + "/v1/completions", json=BODY, timeout=5).status_code == 200
    finally:
        pids = [pid for pid, _ in r.workers().values()]
        stop(proc)
    assert proc.returncode == 0
    wait_for(lambda: not any(alive(p) for p in pids), 5, "the workers exit")
