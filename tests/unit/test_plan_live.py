"""The live side of the planner: request lengths from vLLM's histograms, correction
factors applied to every prediction, the recommendation for a running fleet's live load,
where the UI finds a profile, and ``pdctl plan --from-fleet`` re-planning with the factors.

The numbers are checked by hand against the seeds' L40S profile (tests/unit/test_plan.py):
at 8192-token prompts, 256 output tokens and 0.4 req/s the planner predicts TTFT p90
1.1936 s for colocated x1 and 0.8138 s for colocated x2, TTFT p50 2.342 s for 1P1D push.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdctl.sdk.metrics.derive import Histogram, Lengths
from pdctl.sdk.metrics.monitor import InstanceMetrics, Snapshot
from pdctl.sdk.metrics.snapshot import Summary
from pdctl.sdk.plan import (
    Correction,
    Layout,
    LivePlanner,
    Prediction,
    ProfileError,
    Slos,
    Workload,
    make_plan,
    recommend,
    transfers,
)
from pdctl.sdk.plan.live import LiveFigures, live_figures
from pdctl.sdk.plan.recommend import CORRECTED, HOW_TO, INFERRED, MEASURED, PREDICTED
from pdctl.sdk.spec import FleetSpec
from tests.conftest import spec_dict
from tests.unit.test_plan import SEED_PATH, seven_b
from tests.unit.test_plan import _inst as inst

PROFILE = seven_b("NVIDIA L40S", kv_path=SEED_PATH)
SEED_SLOS = Slos(1.5, 0.05)


def _hist(*buckets: tuple[float, float], total: float) -> Histogram:
    count = buckets[-1][1]
    return Histogram((*buckets, (float("inf"), count)), total, count)


def test_lengths_mean_is_exact_and_p95_only_when_the_buckets_resolve_it():
    # ten 64-token prompts: all in the 50-100 bucket, which also holds the mean
    same = Lengths.of(_hist((50.0, 0.0), (100.0, 10.0), total=640.0))
    assert (same.mean, same.p95, same.count) == (64.0, None, 10.0)
    # nine 40-token prompts and one of 800: mean (9*40 + 800) / 10 = 116; the p95 rank
    # 9.5 lies in the 500-1000 bucket (9 below it, 10 at its top), wholly above the mean:
    # 500 + 500 * (9.5 - 9) / (10 - 9) = 750
    mixed = Lengths.of(
        _hist((20.0, 0.0), (50.0, 9.0), (100.0, 9.0), (500.0, 9.0), (1000.0, 10.0), total=1160.0)
    )
    assert mixed.mean == pytest.approx(116.0)
    assert mixed.p95 == pytest.approx(750.0)
    assert Lengths.of(None) == Lengths()
    assert Lengths.of(_hist((10.0, 0.0), total=0.0)) == Lengths()


def test_correction_scales_ttft_and_its_parts_by_one_factor_itl_and_tpot_by_the_other():
    pred = Prediction(
        ttft_s={"p50": 0.1, "p90": 0.2},
        itl_s={"p50": 0.01},
        tpot_s={"p90": 0.02},
        parts_s={"prefill": 0.08, "wait": 0.02},
    )
    got = Correction(1.5, 2.0, "1P1D push", 0.4, 10.0).apply(pred)
    assert got.ttft_s == pytest.approx({"p50": 0.15, "p90": 0.3})
    assert got.parts_s == pytest.approx({"prefill": 0.12, "wait": 0.03})
    assert got.itl_s == pytest.approx({"p50": 0.02})
    assert got.tpot_s == pytest.approx({"p90": 0.04})
    assert pred.ttft_s["p50"] == 0.1  # the prediction itself is untouched
    unmeasured = Correction(None, 2.0, "1P1D push", 0.4, None).apply(pred)
    assert unmeasured.ttft_s == pred.ttft_s
    words = Correction(1.5, None, "1P1D push", 0.4, 10.0).words()
    assert (
        words
        == "TTFT x1.5, ITL not measured (observed / predicted on 1P1D push at 0.4 req/s over 10 s)"
    )


def _seed_plan(correction: Correction | None = None):
    work = Workload(8192, 256, 0.4)
    return make_plan(PROFILE, work, SEED_SLOS, 2, transfers(PROFILE, 8192), correction=correction)


def test_a_ttft_factor_of_1_5_moves_the_recommendation_from_one_to_two_instances():
    raw = _seed_plan()
    assert raw.best.layout == Layout("colocated", 1)
    by_name = {c.layout.name: c.pred for c in raw.candidates}
    assert by_name["colocated x1"].ttft_s["p90"] == pytest.approx(1.1936, abs=1e-4)
    assert by_name["colocated x2"].ttft_s["p90"] == pytest.approx(0.8138, abs=1e-4)
    corr = Correction(1.5, 1.0, "1P1D push", 0.4, 10.0)
    fixed = _seed_plan(corr)
    # 1.1936 s x 1.5 = 1.790 s > 1.5 s; 0.8138 s x 1.5 = 1.221 s <= 1.5 s
    got = {c.layout.name: c for c in fixed.candidates}
    assert got["colocated x1"].pred.ttft_s["p90"] == pytest.approx(1.7904, abs=1e-3)
    assert got["colocated x2"].pred.ttft_s["p90"] == pytest.approx(1.2207, abs=1e-3)
    assert not got["colocated x1"].meets
    assert fixed.best.layout == Layout("colocated", 2)
    assert got["colocated x1"].why.startswith("TTFT p90 1.79 s > 1.50 s")
    assert fixed.correction is corr
    assert fixed.as_dict()["correction"]["ttft_factor"] == 1.5
    assert any("TTFT x1.5, ITL x1" in a for a in fixed.assumptions)
    # an ITL factor of 2 as well: colocated x2's TPOT p90 0.0306 s x 2 = 0.061 s > 50 ms
    both = _seed_plan(Correction(1.5, 2.0, "1P1D push", 0.4, 10.0))
    assert not any(c.meets for c in both.candidates)
    assert "no layout meets" in both.summary


def _inst(
    name: str,
    role: str,
    *,
    rate: float | None = None,
    ttft: float | None = None,
    itl: float | None = None,
    prompt: Lengths = Lengths(),
    output: Lengths = Lengths(),
) -> InstanceMetrics:
    return inst(
        name, role, rate, ttft, itl, prompt_tokens=prompt, output_tokens=output, span_s=12.0
    )


def _snap(*insts: InstanceMetrics) -> Snapshot:
    return Snapshot(0.0, 60.0, insts, {}, (), None, (), Summary())


def test_live_lengths_are_count_weighted_prompts_in_front_outputs_behind():
    snap = _snap(
        _inst(
            "p0", "prefill", rate=0.3, prompt=Lengths(8000.0, None, 30), output=Lengths(1, None, 30)
        ),
        _inst("p1", "prefill", rate=0.1, prompt=Lengths(8768.0, 9500.0, 10)),
        _inst("d0", "decode", ttft=2.0, itl=0.03, output=Lengths(256.0, None, 40)),
    )
    live = live_figures(snap)
    assert live.rate == pytest.approx(0.4)
    assert live.isl_mean == pytest.approx(8192)  # 30 requests of 8000 and 10 of 8768 tokens
    assert live.isl_p95 == 9500.0
    assert live.osl_mean == 256.0  # the prefills' single tokens do not count
    assert (live.front, live.back, live.span_s) == (("p0", "p1"), ("d0",), 12.0)


def _seed_snapshot(ttft_factor: float = 1.5) -> Snapshot:
    predicted_p50 = next(
        c.pred.ttft_s["p50"] for c in _seed_plan().candidates if c.layout.name == "1P1D push"
    )
    return _snap(
        _inst("prefill-0", "prefill", rate=0.4, prompt=Lengths(8192.0, None, 5)),
        _inst(
            "decode-0",
            "decode",
            ttft=predicted_p50 * ttft_factor,
            itl=0.0241,
            output=Lengths(256.0, None, 5),
        ),
    )


def test_recommend_applies_the_factors_measured_on_the_current_layout():
    spec = FleetSpec(**spec_dict())  # 1P1D push, TP 1
    rec = recommend(_seed_snapshot(), PROFILE, spec, slos=SEED_SLOS, profile_source="l40s.json")
    assert rec.current == Layout("push", 1, 1)
    # observed 1.5 x the predicted 2.342 s: factor 1.5; then colocated x1 misses (above)
    assert rec.factors["ttft"].value == 1.5
    assert rec.factors["ttft"].source == INFERRED
    assert rec.factors["ttft"].detail == "observed / predicted p50 over 12 s"
    assert rec.predicted["ttft_p50"].value == pytest.approx(2.342, abs=1e-3)
    assert rec.predicted["ttft_p50"].source == PREDICTED
    assert rec.observed["ttft_p50"].value == pytest.approx(3.513, abs=2e-3)  # 2.342 x 1.5
    assert rec.observed["ttft_p50"].source == MEASURED
    assert rec.recommended == Layout("colocated", 2)
    assert rec.change
    # colocated x2's TTFT p50 0.7083 s x 1.5
    assert rec.expected["ttft_p50"].value == pytest.approx(1.0625, abs=1e-3)  # 0.7083 x 1.5
    assert rec.expected["ttft_p50"].source == CORRECTED
    itl = rec.factors["itl"].value
    assert itl is not None
    assert rec.expected["itl_p50"].value == pytest.approx(
        next(c for c in _seed_plan().candidates if c.layout.name == "colocated x2").pred.itl_s[
            "p50"
        ]
        * itl,
        rel=1e-6,
    )
    assert rec.load["rate"].value == pytest.approx(0.4)
    assert rec.load["isl"].value == 8192.0
    assert rec.load["isl_p95"].value is None
    assert "over 12 s" in rec.load["rate"].detail
    assert rec.current_why.startswith("TTFT p90")
    assert rec.summary == rec.plan.summary
    assert rec.budget == 2
    doc = rec.as_dict()
    assert doc["recommended"] == "colocated x2"
    assert doc["correction"]["layout"] == "1P1D push"
    json.dumps(doc)


def test_recommend_without_factors_says_why():
    tp2 = FleetSpec(**spec_dict(prefill=[{"count": 1, "tp": 2}], decode=[{"count": 1, "tp": 2}]))
    rec = recommend(_seed_snapshot(), PROFILE, tp2, slos=SEED_SLOS, budget=4)
    assert rec.correction is None
    assert rec.factors["ttft"].value is None
    assert rec.expected["ttft_p50"].source == PREDICTED
    assert "not among the plan's candidates" in rec.notes[0]
    quiet = _snap(_inst("prefill-0", "prefill", rate=0.4), _inst("decode-0", "decode"))
    with pytest.raises(ProfileError, match="request_prompt_tokens"):
        recommend(quiet, PROFILE, FleetSpec(**spec_dict()))
    with pytest.raises(ProfileError, match="no request rate"):
        recommend(_snap(_inst("prefill-0", "prefill")), PROFILE, FleetSpec(**spec_dict()))


def test_discover_reads_the_default_profile_and_the_settings(tmp_path: Path):
    spec = FleetSpec(**spec_dict())
    planner, note = LivePlanner.discover(spec, {}, tmp_path)
    assert planner is None
    assert note == HOW_TO
    assert "pdctl profile -f SPEC --quick" in note
    (tmp_path / "pdctl-profile.json").write_text(PROFILE.model_dump_json())
    env = {
        "PDCTL_PLAN_TTFT_SLO_MS": "1500",
        "PDCTL_PLAN_ITL_SLO_MS": "50",
        "PDCTL_PLAN_BUDGET": "2",
    }
    planner, note = LivePlanner.discover(spec, env, tmp_path)
    assert note == ""
    assert planner is not None
    assert planner.slos == SEED_SLOS
    assert planner.budget == 2
    assert planner.profile_source == str(tmp_path / "pdctl-profile.json")
    assert planner.recommend(_seed_snapshot()).recommended == Layout("colocated", 2)
    missing, note = LivePlanner.discover(spec, {"PDCTL_PLAN_PROFILE": "/nonexistent.json"})
    assert missing is None
    assert "no such file" in note
    _, note = LivePlanner.discover(spec, {"PDCTL_PLAN_BUDGET": "1.5"}, tmp_path)
    assert "whole number" in note
    _, note = LivePlanner.discover(spec, {"PDCTL_PLAN_SLO_PCT": "p95"}, tmp_path)
    assert "p50, p90 or p99" in note


def test_plan_from_fleet_re_plans_with_the_live_factors(tmp_path, monkeypatch, capsys):
    from pdctl.cli import cmd_plan
    from pdctl.cli.main import main

    profile = tmp_path / "l40s.json"
    profile.write_text(PROFILE.model_dump_json())
    predicted_p50 = 2.342  # 1P1D push at 0.4 req/s (above); observed 1.5 x that
    live = LiveFigures(0.4, predicted_p50 * 1.5, 0.0241, 2, span_s=10.2)
    monkeypatch.setattr(cmd_plan, "_live", lambda args: (FleetSpec(**spec_dict()), live))
    argv = ["plan", "--profile", str(profile), "--isl", "8192", "--osl", "256"]
    argv += ["--ttft-slo", "1500", "--itl-slo", "50", "--budget", "2", "--from-fleet", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["live"]["ttft_factor"] == pytest.approx(1.5, abs=1e-3)
    assert doc["live"]["window_s"] == 10.2
    assert doc["correction"]["window_s"] == 10.2
    assert doc["recommended"] == "colocated x2"  # colocated x1: 1.19 s x 1.5 > 1.5 s
    ttft = {c["layout"]: c["ttft_ms"]["p90"] for c in doc["candidates"]}
    assert ttft["colocated x2"] == pytest.approx(1220.7, abs=1)  # 813.8 ms x 1.5
    # the text form says which factors and which window
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "scaled by the live correction factors: TTFT x1.5" in out
    assert "over 10 s" in out


def test_the_ui_looks_where_pdctl_profile_writes_by_default():
    import argparse

    from pdctl.cli import cmd_profile
    from pdctl.sdk.plan.recommend import DEFAULT_PROFILE

    parser = argparse.ArgumentParser()
    cmd_profile.add_arguments(parser)
    assert parser.get_default("out") == DEFAULT_PROFILE


def test_top_plan_profile_points_the_ui_at_a_profile(tmp_path: Path):
    """``pdctl top --plan-profile FILE``: the live source plans from FILE, or says why not."""
    import argparse

    from pdctl.cli import cmd_top
    from pdctl.sdk.fleetplan import build_plan

    spec = FleetSpec(**spec_dict(router={}))
    path = tmp_path / "elsewhere.json"
    path.write_text(PROFILE.model_dump_json())
    parser = argparse.ArgumentParser()
    cmd_top.add_arguments(parser)
    args = parser.parse_args(["--plan-profile", str(path)])
    from pdctl.tui.source import LiveSource

    source = LiveSource(spec, build_plan(spec))
    source.use_profile(args.plan_profile)
    assert source.planner is not None
    assert source.planner.profile_source == str(path)
    source.use_profile(str(tmp_path / "missing.json"))
    assert source.planner is None
    assert "no such file" in source.planner_note
