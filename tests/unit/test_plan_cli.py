"""``pdctl plan`` end to end on recorded profiles (no fleet): JSON, table, -o spec."""

from __future__ import annotations

import json

import pytest

from pdctl.cli.main import main
from pdctl.sdk.plan import load_profile
from pdctl.sdk.specload import load_spec
from tests.conftest import REPO
from tests.unit.test_plan import L40S_TOPO, SEED_PATH, seven_b

DEMO = REPO / "sdk" / "pdctl" / "sdk" / "data" / "demo.toml"


@pytest.fixture
def l40s_profile(tmp_path):
    p = tmp_path / "l40s.json"
    p.write_text(seven_b("NVIDIA L40S", kv_path=SEED_PATH).model_dump_json())
    return p


SEED_ARGS = ["--isl", "8192", "--osl", "256", "--rate", "0.4", "--ttft-slo", "1500"]
SEED_ARGS += ["--itl-slo", "50", "--budget", "2"]


def test_plan_json_names_the_transfer(l40s_profile, capsys):
    rc = main(
        ["plan", "--profile", str(l40s_profile), *SEED_ARGS, "--topology", str(L40S_TOPO), "--json"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "do not disaggregate"
    assert out["kv_path"]["path"] == "HOST_STAGED"
    assert out["kv_path"]["transfer_ms_at_isl"] == pytest.approx(1300, rel=0.01)
    why = {c["layout"]: c["why"] for c in out["candidates"]}
    assert "KV transfer 1.30 s" in why["1P1D push"]
    assert load_profile(l40s_profile).prefill  # the file is untouched and valid


def test_plan_table_and_spec_output(l40s_profile, tmp_path, capsys):
    spec_out = tmp_path / "spec.toml"
    rc = main(
        ["plan", "--profile", str(l40s_profile), *SEED_ARGS, "-f", str(DEMO), "-o", str(spec_out)]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "do not disaggregate" in text
    assert "1P1D push" in text
    spec = load_spec(spec_out).spec
    assert spec.fleet.mode == "colocated"
    assert [g.count for g in spec.prefill] == [1]
    assert spec.decode == []
    assert spec_out.read_text().startswith("# pdctl plan: do not disaggregate")


def _plan(profile, *args: str) -> int:
    return main(["plan", "--profile", str(profile), *args])


def test_plan_exit_1_when_nothing_meets_and_2_on_bad_input(l40s_profile, capsys):
    hard = ["--isl", "8192", "--osl", "64", "--rate", "9", "--ttft-slo", "100", "--budget", "2"]
    assert _plan(l40s_profile, *hard, "--json") == 1
    assert "no layout meets" in json.loads(capsys.readouterr().out)["summary"]
    small = ["--osl", "1", "--rate", "1", "--budget", "1"]
    with pytest.raises(SystemExit, match="--isl"):
        _plan(l40s_profile, "--isl", "8k", *small)
    assert _plan("/nonexistent.json", "--isl", "8", *small) == 2
    assert "pdctl profile" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--rate"):
        _plan(l40s_profile, "--isl", "8", "--osl", "1", "--budget", "1")
    # -o without a base spec: the profile names none
    assert _plan(l40s_profile, *SEED_ARGS, "-o", "x.toml") == 2
    assert "-f SPEC" in capsys.readouterr().err
