"""``pdctl scale`` against the fake ``kubectl`` (no cluster here), and the pure parts."""

from __future__ import annotations

import json

import pytest

from pdctl.cli.main import main
from pdctl.sdk.plan.scale import ScaleError, counts_from_plan, scaled
from pdctl.sdk.specload import load_spec
from tests.unit.test_k8s_backend import MULTI, kubectl  # noqa: F401  (fixture)


def test_scaled_names_the_groups_and_refuses_zero():
    spec = load_spec(MULTI, environ={}).spec
    assert scaled(spec, "prefill", 3).prefill[0].count == 3
    with pytest.raises(ScaleError, match="groups are prefill, decode"):
        scaled(spec, "nope", 2)
    with pytest.raises(ScaleError, match="at least 1"):
        scaled(spec, "prefill", 0)


def _plan(layout: str, mode: str, p: int, d: int) -> dict[str, object]:
    cand = {"layout": layout, "mode": mode, "prefill": p, "decode": d}
    return {"recommended": layout, "candidates": [cand]}


def test_counts_from_plan_follow_the_recommendation_or_refuse_a_mode_change():
    spec = load_spec(MULTI, environ={}).spec
    assert spec.fleet.mode == "push"
    assert counts_from_plan(spec, _plan("3P1D push", "push", 3, 1)) == {"prefill": 3, "decode": 1}
    with pytest.raises(ScaleError, match="pdctl plan --out"):
        counts_from_plan(spec, _plan("colocated x2", "colocated", 2, 0))


def test_scale_applies_the_changed_spec_with_kubectl(kubectl, tmp_path, capsys):  # noqa: F811
    kubectl.gets("get-objects-stale.json")
    assert main(["scale", "-f", str(MULTI), "prefill", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["applied"] == {"prefill": 1}
    apply = next(c for c in kubectl.calls() if c["argv"][0] == "apply")
    names = [d["metadata"]["name"] for d in json.loads(apply["stdin"])["items"]]
    assert "llama405-prefill-0" in names
    assert "llama405-prefill-1" not in names
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan("2P1D push", "push", 2, 1)))
    assert main(["scale", "-f", str(MULTI), "--from-plan", str(plan)]) == 0
    assert "prefill = 2, decode = 1" in capsys.readouterr().out


def test_scale_refuses_a_local_fleet(capsys):
    from tests.conftest import EXAMPLES

    assert main(["scale", "-f", str(EXAMPLES / "cpu-1p1d.toml"), "prefill", "2"]) == 2
    assert "Kubernetes only" in capsys.readouterr().err
