"""The launcher against a fake engine: readiness, failures, restarts, teardown, orphans.

Real vLLM is exercised by tests/e2e; these run in seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdctl.sdk.errors import FleetRunningError, LaunchError, LintFailed
from pdctl.sdk.fleet import AsyncFleet, fleet_status, read_state, remote_down, tail
from pdctl.sdk.fleet.procs import alive
from pdctl.sdk.shepherd import group_members
from pdctl.sdk.spec import FleetSpec
from tests.conftest import free_ports, port_free

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "fake_engine.py"


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An 'interpreter' that passes the vLLM-installed check and runs the fake engine.

    A fake engine is ready a fraction of a second after it starts, so this process's
    launcher and supervisor look at it as often (a real vLLM takes tens of seconds: their
    defaults poll every 0.5 s and 1 s)."""
    monkeypatch.setattr("pdctl.sdk.fleet.launcher.POLL_INTERVAL", 0.05)
    monkeypatch.setattr("pdctl.sdk.fleet.supervisor.MONITOR_INTERVAL_S", 0.1)
    script = tmp_path / "fake-python"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exit 0; fi\nexec {sys.executable} {FAKE} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "state"
    monkeypatch.setenv("PDCTL_STATE_DIR", str(root))
    return root


def make_spec(fake_python: str, name: str = "t", **fleet_env: str) -> FleetSpec:
    hp, hd, sp, sd = free_ports(4)
    return FleetSpec(
        model={"path": "org/fake", "served_name": "fake"},
        fleet={"name": name, "platform": "cpu", "python": fake_python, "env": fleet_env},
        prefill=[{"http_port": hp, "side_channel_port": sp}],
        decode=[{"http_port": hd, "side_channel_port": sd}],
    )


def write_spec_file(path: Path, spec: FleetSpec, fake_python: str) -> None:
    """The TOML a user would write for ``spec`` (what the CLI tests pass with -f)."""
    path.write_text(
        f'[model]\npath="org/fake"\nserved_name="fake"\n'
        f'[fleet]\nname="t"\nplatform="cpu"\npython="{fake_python}"\n'
        f"[[prefill]]\nhttp_port={spec.prefill[0].http_port}\n"
        f"side_channel_port={spec.prefill[0].side_channel_port}\n"
        f"[[decode]]\nhttp_port={spec.decode[0].http_port}\n"
        f"side_channel_port={spec.decode[0].side_channel_port}\n"
    )


def pgids(state_root: Path, name: str = "t") -> list[int]:
    rec = read_state(state_root / name)
    assert rec is not None
    return [i.shepherd_pid for i in rec.instances if i.shepherd_pid]


def wait_until(cond, limit: float = 10.0, what=None) -> None:
    """Return as soon as ``cond()`` holds; fail the test (saying ``what()``) after ``limit``
    seconds. The limit is a hang guard, not a speed claim."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"not met within {limit} s: {what() if what else 'condition'}")


async def test_up_ready_status_down(fake_python, state_root):
    spec = make_spec(fake_python)
    fleet = AsyncFleet(spec, grace=2)
    events = []

    async def collect():
        async for ev in fleet.events():
            events.append(ev.kind)

    collector = asyncio.create_task(collect())
    await asyncio.sleep(0)
    await fleet.up()
    groups = pgids(state_root)
    assert all(group_members(g) for g in groups)  # shepherd + engine + its child
    assert {s.state for s in await fleet.status()} == {"ready"}
    remote = await fleet_status("t")
    assert remote.supervisor_alive
    assert [i.state for i in remote.instances] == ["ready", "ready"]
    await fleet.down()
    await asyncio.wait_for(collector, 5)
    assert events.count("ready") == 2
    assert events[-1] == "fleet-stopped"
    assert not any(group_members(g) for g in groups)  # engine children gone too
    assert read_state(state_root / "t") is None
    for inst in fleet.plan.instances:
        assert port_free(inst.http_port)


async def test_exit_during_startup_stops_the_rest_and_shows_the_log(fake_python, state_root):
    spec = make_spec(fake_python, FAKE_ENGINE_EXIT="3")
    fleet = AsyncFleet(spec, grace=2)
    with pytest.raises(LaunchError) as e:
        await fleet.up()
    msg = str(e.value)
    assert "exited with code 3 during start-up" in msg
    assert "simulated start-up failure" in msg
    assert read_state(state_root / "t") is None


async def test_ready_timeout_names_the_instance(fake_python, state_root):
    spec = make_spec(fake_python, FAKE_ENGINE_DELAY="30")
    fleet = AsyncFleet(spec, grace=2, ready_timeout=1.5)
    with pytest.raises(LaunchError, match=r"not ready after 1.5 s \(prefill-0: not listening"):
        await fleet.up()


async def test_port_in_use_refuses_before_starting(fake_python, state_root):
    spec = make_spec(fake_python)
    with socket.socket() as s:
        s.bind(("127.0.0.1", spec.decode[0].http_port))
        s.listen()
        with pytest.raises(LintFailed, match="PD002"):
            await AsyncFleet(spec).up()
    assert not (state_root / "t" / "state.json").exists()


async def test_kill_is_reported_within_two_seconds_and_restart(fake_python, state_root):
    spec = make_spec(fake_python)
    spec.decode[0].restart = "never"  # left exited, restarted by hand (the policy: test_supervisor)
    async with AsyncFleet(spec, grace=2) as fleet:
        events = fleet.events()
        rec = read_state(state_root / "t")
        assert rec is not None
        shepherd = rec.instances[1].shepherd_pid
        assert shepherd is not None
        engine = next(p for p in group_members(shepherd) if p != shepherd)
        t0 = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        ev = await asyncio.wait_for(anext(events), 2)
        while ev.kind != "exited":
            ev = await asyncio.wait_for(anext(events), 2)
        assert time.monotonic() - t0 < 2
        assert (ev.instance, ev.code) == ("decode-0", 137)
        remote = await fleet_status("t")
        assert (remote.instances[1].state, remote.instances[1].exit_code) == ("exited", 137)
        assert any("fake engine" in ln for ln in remote.instances[1].log_tail)
        await fleet.restart("decode-0")
        st = {s.name: s for s in await fleet.status()}
        assert st["decode-0"].state == "ready"
        assert st["decode-0"].restarts == 1


async def test_second_up_is_refused(fake_python, state_root):
    spec = make_spec(fake_python)
    async with AsyncFleet(spec, grace=2):
        with pytest.raises(FleetRunningError, match="already running"):
            await AsyncFleet(spec).up()


def _cli(*args: str, **kw):
    return subprocess.Popen([sys.executable, "-m", "pdctl.cli.main", *args], **kw)


@pytest.mark.slow  # `pdctl up` in a subprocess: a second interpreter and a real fleet
def test_sigkill_of_pdctl_leaves_no_process_and_stale_state_is_cleaned(
    fake_python, state_root, tmp_path
):
    spec_file = tmp_path / "spec.toml"
    spec = make_spec(fake_python)
    write_spec_file(spec_file, spec, fake_python)
    proc = _cli(
        "up",
        "-f",
        str(spec_file),
        "--json",
        "--grace",
        "2",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line)["kind"] == "fleet-ready":
            break
    groups = pgids(state_root)
    assert all(group_members(g) for g in groups)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the shepherds see their parent die and kill their groups; the check is that every
    # member is gone (wait_until fails the test naming the survivors if one outlives 10 s)
    wait_until(
        lambda: not any(group_members(g) for g in groups),
        limit=10,
        what=lambda: f"process groups still alive: {[g for g in groups if group_members(g)]}",
    )
    # the state file outlives the killed supervisor: status says so, down cleans up
    rec = read_state(state_root / "t")
    assert rec is not None
    assert not alive(rec.supervisor_pid, rec.supervisor_ticks)
    assert "crashed supervisor" in remote_down("t", grace=1)
    assert read_state(state_root / "t") is None


@pytest.mark.slow  # a detached fleet driven by eight pdctl processes
def test_cli_status_restart_logs_down_from_another_shell(fake_python, state_root, tmp_path):
    spec = make_spec(fake_python)
    spec_file = tmp_path / "spec.toml"
    write_spec_file(spec_file, spec, fake_python)
    r = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "up", "-d", "-f", str(spec_file), "--grace", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr

    def cli(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pdctl.cli.main", *a, "--fleet", "t"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        st = cli("status", "--json")
        assert st.returncode == 0, st.stderr
        assert [i["state"] for i in json.loads(st.stdout)["instances"]] == ["ready", "ready"]
        r = cli("restart", "prefill-0")
        assert r.returncode == 0, r.stderr
        st = json.loads(cli("status", "--json").stdout)
        assert st["instances"][0]["restarts"] == 1
        logs = cli("logs", "prefill-0", "-n", "100")
        assert logs.stdout.count("=== pdctl: starting prefill-0") == 2
        bad = cli("restart", "nope-0")
        assert bad.returncode == 2
        assert "no instance named 'nope-0'" in bad.stderr
        again = subprocess.run(
            [sys.executable, "-m", "pdctl.cli.main", "up", "-f", str(spec_file)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 2
        assert "already running" in again.stderr
    finally:
        d = cli("down")
    assert d.returncode == 0
    assert "stopped" in d.stdout
    assert cli("status").returncode == 2


async def test_missing_vllm_names_the_extra(tmp_path, state_root):
    nopython = tmp_path / "python-without-vllm"
    nopython.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then exit 3; fi\nexit 1\n')
    nopython.chmod(0o755)
    spec = make_spec(str(nopython))
    with pytest.raises(LaunchError, match=r"vLLM is not installed .*pdctl\[cpu\]"):
        await AsyncFleet(spec).up()
    assert read_state(state_root / "t") is None


async def test_missing_local_model_is_refused_before_launch(fake_python, state_root):
    spec = make_spec(fake_python)
    spec.model.path = "/nonexistent/tiny"
    with pytest.raises(LintFailed, match="PD019"):
        AsyncFleet(spec)


async def test_restart_gives_a_fresh_engine_id(fake_python, state_root):
    async with AsyncFleet(make_spec(fake_python), grace=2) as fleet:
        await fleet.restart("decode-0")
        rec = read_state(state_root / "t")
        assert rec is not None
        assert rec.instance("decode-0").engine_id == "decode-0-r1"
        assert rec.instance("prefill-0").engine_id == "prefill-0"
        assert '"engine_id":"decode-0-r1"' in "\n".join(tail(rec.instance("decode-0").log, 5))


async def test_stop_one_instance_from_another_shell_then_restart(fake_python, state_root):
    from pdctl.sdk.fleet import remote_restart, remote_stop
    from pdctl.sdk.fleet.state import StateError

    async with AsyncFleet(make_spec(fake_python), grace=2):
        groups = pgids(state_root)
        await asyncio.to_thread(remote_stop, "t", "decode-0", grace=2)
        st = {s.name: s.state for s in (await fleet_status("t")).instances}
        assert st == {"prefill-0": "ready", "decode-0": "stopped"}
        assert not group_members(groups[1])
        assert group_members(groups[0])
        with pytest.raises(StateError, match="no instance named 'nope-0'"):
            remote_stop("t", "nope-0")
        await asyncio.to_thread(remote_restart, "t", "decode-0", timeout=30)
        st = {s.name: s.state for s in (await fleet_status("t")).instances}
        assert st == {"prefill-0": "ready", "decode-0": "ready"}
