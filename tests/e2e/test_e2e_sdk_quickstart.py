"""The README's 10-line SDK script, run as it is on the real demo fleet: one import,
one completion through the router, a positive KV byte count, and nothing left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_ports, port_free
from tests.e2e.conftest import processes_mentioning

pytestmark = pytest.mark.e2e

NAME = "e2e-sdk-quickstart"
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "sdk_quickstart.py"


def test_quickstart_script_moves_kv_and_leaves_nothing_running(tiny_model: Path, state_root: Path):
    hp, hd, sp, sd, rp = free_ports(5)
    # the script takes no arguments: the spec's PDCTL_ environment layer moves the demo
    # fleet to free ports and its own name, exactly as a user would
    env = {
        **os.environ,
        "PDCTL_FLEET__NAME": NAME,
        "PDCTL_PREFILL__0__HTTP_PORT": str(hp),
        "PDCTL_PREFILL__0__SIDE_CHANNEL_PORT": str(sp),
        "PDCTL_DECODE__0__HTTP_PORT": str(hd),
        "PDCTL_DECODE__0__SIDE_CHANNEL_PORT": str(sd),
        "PDCTL_ROUTER__PORT": str(rp),
    }
    r = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    answer = re.search(r"^answer: (.+)$", r.stdout, re.M)
    assert answer is not None, r.stdout
    assert answer.group(1).strip()
    moved = re.search(r"^KV bytes moved: (\d+)$", r.stdout, re.M)
    assert moved is not None, r.stdout
    assert int(moved.group(1)) > 0
    # the overrides reached the fleet: the prefill server listened on the free port
    log = (state_root / NAME / "logs" / "prefill-0.log").read_text()
    assert f"--port {hp}" in log
    # and the fleet is down: no state, no process, every port free again
    assert not (state_root / NAME / "state.json").exists()
    assert processes_mentioning(str(state_root / NAME)) == []
    assert processes_mentioning(f"--port {hp}") == []
    assert all(port_free(p) for p in (hp, hd, sp, sd, rp))
