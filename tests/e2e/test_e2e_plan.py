"""`pdctl profile --quick` on the CPU demo fleet (one colocated instance, then a 1P1D push
pair, then the probe), a resumed run that measures nothing again, then `pdctl plan` on
the profile it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_ports
from tests.e2e.conftest import processes_mentioning

pytestmark = pytest.mark.e2e


def _pdctl(args: list[str], state_root: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PDCTL_STATE_DIR": str(state_root)},
        check=False,
    )


def test_profile_quick_then_plan(tiny_model: Path, state_root: Path, tmp_path: Path):
    hp, hd, sp, sd, rp = free_ports(5)
    sets = [
        f"model.path={tiny_model}",
        "fleet.name=e2e-plan",
        f"prefill.0.http_port={hp}",
        f"prefill.0.side_channel_port={sp}",
        f"decode.0.http_port={hd}",
        f"decode.0.side_channel_port={sd}",
        f"router.port={rp}",
    ]
    out = tmp_path / "profile.json"
    argv = ["profile", "--quick", "-o", str(out), "--json"]
    argv += [a for s in sets for a in ("--set", s)]
    first = _pdctl(argv, state_root, 600)
    assert first.returncode == 0, first.stderr[-3000:]
    prof = json.loads(out.read_text())
    assert prof["model"] == "tiny"
    assert prof["platform"] == "cpu"
    assert prof["hardware"].startswith("cpu: ")
    assert prof["tp"] == 1
    assert prof["vllm_version"].startswith("0.32")
    assert len(prof["prefill"]) == 3
    assert len(prof["decode"]) == 4
    assert all(p["ttft_s"] > 0 for p in prof["prefill"])
    assert [d["input_len"] for d in prof["disagg"]] == sorted(
        p["input_len"] for p in prof["prefill"]
    )
    assert all(d["mode"] == "push" and d["ttft_s"] > 0 for d in prof["disagg"])
    assert prof["kv_path"]["bytes_per_s"] > 0
    assert "pdctl probe" in prof["kv_path"]["source"]
    assert not processes_mentioning("e2e-plan"), "fleet processes left behind"
    # resumed: every point is there, nothing is started again
    again = _pdctl(argv, state_root, 120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["resumed_points"] == 10
    assert "starting" not in again.stderr
    plan = _pdctl(
        [
            "plan",
            "--profile",
            str(out),
            "--isl",
            "64",
            "--osl",
            "32",
            "--rate",
            "1",
            "--ttft-slo",
            "2000",
            "--itl-slo",
            "500",
            "--budget",
            "2",
            "--json",
        ],
        state_root,
        60,
    )
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    names = {c["layout"] for c in doc["candidates"]}
    assert names == {"colocated x1", "colocated x2", "1P1D push", "1P1D pull"}
    assert doc["recommended"] in names
    assert doc["kv_path"]["path"] == "measured P/D"
    best = next(c for c in doc["candidates"] if c["layout"] == doc["recommended"])
    assert best["meets_slos"]
    assert 0 < best["ttft_ms"]["p50"] < 2000
