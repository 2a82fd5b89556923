"""The SDK's example scripts, run as they are on the real demo fleet: the README's 10-line
quickstart (one import, one completion, a positive KV byte count) and the tour (lint,
streaming compared with whole answers, one with U+2028 and U+0085 in it, the flight
recorder, metrics); each leaves nothing running."""

from __future__ import annotations

import json
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
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPT = EXAMPLES / "sdk_quickstart.py"
TOUR = EXAMPLES / "sdk_tour.py"


def run_example(script: Path, name: str, ports: list[int]) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as a user would. It takes no arguments: the spec's PDCTL_
    environment layer moves the demo fleet to free ports and its own name."""
    hp, hd, sp, sd, rp = ports
    env = {
        **os.environ,
        "PDCTL_FLEET__NAME": name,
        "PDCTL_PREFILL__0__HTTP_PORT": str(hp),
        "PDCTL_PREFILL__0__SIDE_CHANNEL_PORT": str(sp),
        "PDCTL_DECODE__0__HTTP_PORT": str(hd),
        "PDCTL_DECODE__0__SIDE_CHANNEL_PORT": str(sd),
        "PDCTL_ROUTER__PORT": str(rp),
    }
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def assert_nothing_left(state_root: Path, name: str, ports: list[int]) -> None:
    assert not (state_root / name / "state.json").exists()
    assert processes_mentioning(str(state_root / name)) == []
    assert processes_mentioning(f"--port {ports[0]}") == []
    assert all(port_free(p) for p in ports)


def test_quickstart_script_moves_kv_and_leaves_nothing_running(tiny_model: Path, state_root: Path):
    ports = free_ports(5)
    hp = ports[0]
    r = run_example(SCRIPT, NAME, ports)
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
    assert_nothing_left(state_root, NAME, ports)


def test_tour_streams_the_same_text_as_whole_answers_even_with_u2028(
    tiny_model: Path, state_root: Path
):
    name = "e2e-sdk-tour"
    ports = free_ports(5)
    out = run_example(TOUR, name, ports).stdout

    def answers(label: str) -> dict[str, str]:
        m = re.search(rf"^{label} (\{{.*\}})$", out, re.M)
        assert m is not None, out
        got: dict[str, str] = json.loads(m.group(1))
        return got

    plain, odd = answers("plain"), answers("odd")
    assert plain["whole"].strip()
    assert plain["streamed"] == plain["whole"]
    # the model wrote the characters str.splitlines() splits at, and the stream kept them
    assert re.fullmatch("(cache|block)\u2028(push|pull)\u0085(fleet|queue)", odd["whole"])
    assert odd["streamed"] == odd["whole"]
    assert re.search(r"^lint warnings: \[.*\]$", out, re.M), out
    assert re.search(r"^last request: prefill-0 -> decode-0 ok \d", out, re.M), out
    assert re.search(r"^mode: push$", out, re.M), out
    moved = re.search(r"^KV bytes moved: (\d+)$", out, re.M)
    assert moved is not None, out
    assert int(moved.group(1)) > 0
    assert_nothing_left(state_root, name, ports)
