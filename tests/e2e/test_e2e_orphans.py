"""SIGKILL of the pdctl process itself leaves no vLLM process behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdctl.sdk.fleet import fleet_status, read_state
from pdctl.sdk.shepherd import group_members
from tests.conftest import port_free
from tests.e2e.conftest import demo_spec, processes_mentioning

pytestmark = pytest.mark.e2e

NAME = "e2e-orphans"


def test_sigkill_of_pdctl_leaves_no_vllm_process(tiny_model: Path, state_root: Path, tmp_path):
    import asyncio

    _spec, overrides = demo_spec(tiny_model, NAME)
    cmd = [
        sys.executable,
        "-m",
        "pdctl.cli.main",
        "up",
        "--json",
        "--grace",
        "5",
        "--file",
        str(tmp_path / "unused.toml"),
    ]
    # the demo spec comes from text; write it so `pdctl up` reads exactly that
    from pdctl.sdk.paths import demo_spec_text

    (tmp_path / "unused.toml").write_text(demo_spec_text())
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("{") and json.loads(line)["kind"] == "fleet-ready":
            break
    else:
        pytest.fail("fleet never became ready:\n" + "".join(seen[-30:]))
    rec = read_state(state_root / NAME)
    assert rec is not None
    groups = [i.shepherd_pid for i in rec.instances if i.shepherd_pid]
    ports = [p for i in rec.instances for p in (i.http_port, *i.side_channel_ports)]
    assert processes_mentioning(str(tiny_model))  # vLLM really runs

    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    while any(group_members(g) for g in groups) and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert not any(group_members(g) for g in groups)
    assert processes_mentioning(str(tiny_model)) == []
    assert all(port_free(p) for p in ports)

    # the crashed supervisor's state is detected and cleaned up
    st = asyncio.run(fleet_status(NAME))
    assert not st.supervisor_alive
    r = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "down", "--fleet", NAME],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0
    assert "crashed supervisor" in r.stdout
    assert read_state(state_root / NAME) is None
