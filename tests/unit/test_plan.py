"""The planner: fits, queueing, KV path per mode, recommendation and its reasons, and
the two published-style cases (L40S host-staged vs an NVLink H100 pair at 8k prompts)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pdctl.sdk.bench.stats import RequestResult
from pdctl.sdk.metrics.monitor import InstanceMetrics
from pdctl.sdk.plan import (
    Layout,
    Profile,
    ProfileError,
    Slos,
    Workload,
    fit,
    layouts,
    load_profile,
    make_plan,
    transfers,
)
from pdctl.sdk.plan.latency import GRID, mg1_wait_grid, poisson_quantile, quantile
from pdctl.sdk.plan.profile import DecodePoint, KvPath, KvShape, PrefillPoint, nnls
from pdctl.sdk.plan.profiler import default_sweep, steady_gaps
from pdctl.sdk.preflight.kvsize import kv_layout
from tests.conftest import FIXTURES

QWEN_CFG = json.loads((FIXTURES / "models" / "qwen2.5-7b" / "config.json").read_text())
TOPO = FIXTURES / "topology"
L40S_TOPO = TOPO / "topo_m_4xL40S_pcie_noNVLink_2numa_2nic.txt"
H100_TOPO = TOPO / "topo_m_8xH100-SXM_NV18_8nic-1to1-PIX_2numa.txt"
SEED_BYTES = 469_762_048  # Qwen2.5-7B, 8192 tokens, bf16


def seven_b(hardware: str, scale: float = 1.0, kv_path: KvPath | None = None) -> Profile:
    """A Qwen2.5-7B profile: prefill 0.7 s at 8k (the seeds' colocated TTFT) x ``scale``,
    23 ms decode steps at batch 1 x ``scale``."""
    return Profile(
        model="Qwen2.5-7B",
        hardware=hardware,
        kv=KvShape.of(kv_layout(QWEN_CFG, "bfloat16")),
        chunk_tokens=2048,
        prefill=[
            PrefillPoint(input_len=n, ttft_s=t * scale)
            for n, t in ((1024, 0.08), (2048, 0.165), (4096, 0.34), (8192, 0.7))
        ],
        decode=[
            DecodePoint(batch=b, context=c, itl_s=t * scale)
            for b, c, t in ((1, 8192, 0.023), (8, 8192, 0.028), (32, 8192, 0.045), (8, 1024, 0.024))
        ],
        kv_path=kv_path,
    )


SEED_PATH = KvPath(bytes_per_s=SEED_BYTES / 1.3, source="470 MB in 1.3 s (published)")


def test_fit_recovers_known_curves():
    prof = seven_b("x")
    prof.prefill = [
        PrefillPoint(input_len=n, ttft_s=0.01 + 1e-5 * n + 1e-9 * n * n) for n in (16, 512, 4096)
    ]
    prof.decode = [
        DecodePoint(batch=b, context=c, itl_s=0.005 + 0.001 * b + 1e-7 * b * c)
        for b in (1, 4, 16)
        for c in (128, 4096)
    ]
    c = fit(prof)
    assert c.prefill == pytest.approx((0.01, 1e-5, 1e-9), rel=1e-6)
    assert c.decode == pytest.approx((0.005, 0.001, 1e-7), rel=1e-6)


def test_nnls_never_returns_a_negative_coefficient():
    # a falling curve: the unconstrained fit would make the slope negative
    coef = nnls([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], [3.0, 2.0, 1.0])
    assert min(coef) >= 0
    with pytest.raises(ProfileError, match="at least 2 prompt lengths"):
        fit(seven_b("x").model_copy(update={"prefill": [PrefillPoint(input_len=8, ttft_s=1)]}))


def test_mg1_wait_matches_pollaczek_khinchine_and_overload():
    waits, rho = mg1_wait_grid(0.5, [1.0] * GRID)  # M/D/1: mean wait = rho / (2 (1 - rho))
    assert rho == pytest.approx(0.5)
    assert sum(1 for w in waits if w > 0) == GRID // 2  # P(wait) = rho
    assert quantile(waits, 0.9) > quantile(waits, 0.6) > 0
    assert mg1_wait_grid(0.0, [1.0] * GRID)[0] == [0.0] * GRID
    assert math.isinf(mg1_wait_grid(1.2, [1.0] * GRID)[0][0])
    assert poisson_quantile(3.0, 0.5) == 3.0
    assert poisson_quantile(0.0, 0.9) == 0.0


def test_layouts_within_budget():
    names = [lay.name for lay in layouts(2, 1)]
    assert names == ["colocated x1", "colocated x2", "1P1D push", "1P1D pull"]
    assert all(lay.gpus <= 8 for lay in layouts(8, 2))
    assert Layout("push", 2, 1, tp=2).gpus == 6


def test_seed_l40s_does_not_disaggregate_because_of_the_transfer():
    """2x L40S, no P2P (host-staged), 470 MB measured in 1.3 s; 8k prompts at 0.4 req/s."""
    prof = seven_b("NVIDIA L40S", kv_path=SEED_PATH)
    tr = transfers(prof, 8192, topology=L40S_TOPO)
    assert tr is not None
    assert tr["push"].path == "HOST_STAGED"
    assert tr["push"].seconds(8192) == pytest.approx(1.3, rel=0.01)
    plan = make_plan(
        prof, Workload(8192, 256, 0.4), Slos(ttft_s=1.5, tpot_s=0.05), budget=2, transfer=tr
    )
    assert plan.verdict == "do not disaggregate"
    assert plan.best.layout.mode == "colocated"
    assert "to the KV transfer (1.30 s per 8192-token prompt)" in plan.summary
    by = {c.layout.name: c for c in plan.candidates}
    for name in ("1P1D push", "1P1D pull"):
        assert not by[name].meets
        assert "KV transfer 1.3" in by[name].why
        assert "469.8 MB at 0.36 GB/s" in by[name].why
    # the published medians: 0.7 s colocated, 2.2 s disaggregated
    assert by["colocated x2"].pred.ttft_s["p50"] == pytest.approx(0.7, rel=0.1)
    assert by["1P1D push"].pred.ttft_s["p50"] == pytest.approx(2.2, rel=0.25)


def test_nvlink_h100_pair_at_8k_disaggregates():
    """An H100 pair on NVLink (NV18): the same 8k prompts move in milliseconds, and at a
    load where prefill chunks stall colocated decode, 1P1D meets the SLOs."""
    prof = seven_b("NVIDIA H100 80GB HBM3", scale=0.5)
    tr = transfers(prof, 8192, topology=H100_TOPO)
    assert tr is not None
    assert tr["push"].path == "NVLINK"
    assert tr["push"].seconds(8192) < 0.01
    work, slos = Workload(8192, 256, 2.0), Slos(ttft_s=1.5, tpot_s=0.016)
    plan = make_plan(prof, work, slos, budget=2, transfer=tr)
    assert plan.verdict == "disaggregate"
    assert plan.best.layout.name == "1P1D push"
    assert plan.best.meets
    col = next(c for c in plan.candidates if c.layout.name == "colocated x2")
    assert "prompt chunks stall decode" in col.why
    # the same compute behind the L40S path: the transfer takes disaggregation away
    slow = make_plan(
        prof.model_copy(update={"kv_path": SEED_PATH}),
        work,
        slos,
        budget=2,
        transfer=transfers(prof.model_copy(update={"kv_path": SEED_PATH}), 8192),
    )
    assert slow.verdict == "do not disaggregate"


def test_pull_on_one_host_without_nvlink_is_predicted_to_fall_back():
    tr = transfers(seven_b("NVIDIA L40S"), 8192, topology=L40S_TOPO)
    assert tr is not None
    assert tr["pull"].bps == pytest.approx(0.4e9)
    assert "fallback" in tr["pull"].source
    assert tr["push"].bps > 10 * tr["pull"].bps


def test_no_kv_path_means_colocated_only_and_overload_is_named():
    prof = seven_b("NVIDIA L40S")
    assert transfers(prof, 8192) is None
    plan = make_plan(prof, Workload(8192, 64, 3.0), Slos(ttft_s=1.0), 2, None)
    assert {c.layout.mode for c in plan.candidates} == {"colocated"}
    assert not plan.best.meets
    assert "no layout meets the SLOs" in plan.summary
    assert any("prefill cannot keep up" in c.why for c in plan.candidates)
    assert plan.assumptions


def test_cheapest_meeting_layout_wins_and_others_say_why():
    prof = seven_b("NVIDIA L40S", kv_path=SEED_PATH)
    plan = make_plan(
        prof, Workload(1024, 64, 0.2), Slos(ttft_s=1.0, tpot_s=0.05), 4, transfers(prof, 1024)
    )
    assert plan.best.layout.name == "colocated x1"
    assert all(c.why for c in plan.candidates)
    assert any("needs 2 GPUs" in c.why for c in plan.candidates)
    d = plan.as_dict()
    assert d["recommended"] == "colocated x1"
    assert d["candidates"][0]["ttft_ms"]["p50"] > 0


def test_load_profile_names_the_bad_field(tmp_path):
    bad = json.loads(seven_b("x").model_dump_json())
    bad["prefill"][0]["ttft_s"] = -1
    p = tmp_path / "p.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"prefill\.0\.ttft_s"):
        load_profile(p)
    with pytest.raises(ProfileError, match="pdctl profile"):
        load_profile(tmp_path / "missing.json")


def test_steady_gaps_skip_the_ramp_and_sweep_shapes():
    a = RequestResult(0, 8, sent_at=0.0, ok=True, ttft_s=0.1, itl_s=[0.5, 0.01, 0.01, 0.01])
    b = RequestResult(1, 8, sent_at=0.0, ok=True, ttft_s=0.55, itl_s=[0.01, 0.01, 0.01])
    itl, n = steady_gaps([a, b])
    assert itl == pytest.approx(0.01)
    assert n == 6
    quick = default_sweep(1024, 4, quick=True)
    assert max(quick.prefill_lens) < 1024
    assert {b for b, _ in quick.decode_points} == {1, 4}
    assert default_sweep(1024, 4, quick=False).total > quick.total


def _inst(
    name: str, role: str, rate: float | None, ttft: float | None, itl: float | None, **extra: Any
) -> InstanceMetrics:
    """An UP instance with these p50s; ``extra``: more InstanceMetrics fields."""
    from pdctl.sdk.metrics.derive import Latency

    return InstanceMetrics(
        name,
        role,
        "http://x",
        "UP",
        request_rate=rate,
        ttft=Latency(p50=ttft),
        itl=Latency(p50=itl),
        **extra,
    )


def test_live_correction_factors_for_the_current_layout():
    from pdctl.sdk.metrics.monitor import Snapshot, Summary
    from pdctl.sdk.plan.live import corrections, layout_of, live_figures
    from pdctl.sdk.spec import FleetSpec
    from tests.conftest import spec_dict

    spec = FleetSpec(**spec_dict())
    current = layout_of(spec)
    assert current == Layout(spec.fleet.mode, 1, 1)
    snap = Snapshot(
        0.0,
        10.0,
        (_inst("p", "prefill", 0.4, 0.5, 0.0), _inst("d", "decode", 0.4, 3.0, 0.03)),
        {},
        (),
        None,
        (),
        Summary(),
    )
    live = live_figures(snap)
    assert live.rate == pytest.approx(0.4)  # prefill side only: each request counts once
    assert live.ttft_p50_s == 3.0
    prof = seven_b("NVIDIA L40S", kv_path=SEED_PATH)
    plan = make_plan(
        prof, Workload(8192, 256, live.rate), Slos(1.5, 0.05), 2, transfers(prof, 8192)
    )
    corr = corrections(plan, current, live)
    pred = next(c for c in plan.candidates if c.layout == current).pred
    assert corr["ttft_factor"] == pytest.approx(3.0 / pred.ttft_s["p50"], rel=1e-3)
    assert corr["itl_factor"] == pytest.approx(0.03 / pred.itl_s["p50"], rel=1e-3)
    idle = Snapshot(
        0.0, 10.0, (_inst("p", "prefill", None, 0.5, 0.0),), {}, (), None, (), Summary()
    )
    with pytest.raises(ProfileError, match="--rate"):
        live_figures(idle)


def test_served_path_is_fitted_from_1p1d_ttft_and_preferred_to_the_probe():
    from pdctl.sdk.plan.profile import DisaggPoint
    from pdctl.sdk.plan.transfer import served_path

    prof = seven_b("NVIDIA L40S", kv_path=SEED_PATH)
    c = fit(prof)
    kv = prof.kv.layout()
    # served: 20 ms per request + 2 GB/s on top of prefill and one decode step
    prof.disagg = [
        DisaggPoint(
            input_len=n,
            ttft_s=c.prefill_s(n) + c.step_s(1, n) + 0.02 + kv.per_rank(n, 1) / 2e9,
        )
        for n in (1024, 4096, 8192)
    ]
    t = served_path(prof)
    assert t is not None
    assert t.overhead_s == pytest.approx(0.02, rel=1e-3)
    assert t.bps == pytest.approx(2e9, rel=1e-3)
    tr = transfers(prof, 8192)
    assert tr is not None
    assert tr["push"].path == "measured P/D"
    assert "1P1D push TTFT at 1024/4096/8192" in tr["push"].source
    prof.disagg = prof.disagg[:1]  # one length cannot separate the two terms
    assert served_path(prof) is None
    assert transfers(prof, 8192)["push"].path == "measured"  # type: ignore[index]


def test_plan_watch_adds_correction_factors_to_a_snapshot():
    from pdctl.sdk.metrics.monitor import Snapshot, Summary
    from pdctl.sdk.plan.live import PlanWatch
    from pdctl.sdk.spec import FleetSpec
    from tests.conftest import spec_dict

    watch = PlanWatch(
        seven_b("NVIDIA L40S", kv_path=SEED_PATH), FleetSpec(**spec_dict()), 8192, 256
    )
    busy = (_inst("p", "prefill", 0.4, 0.5, 0.0), _inst("d", "decode", 0.4, 2.5, 0.025))
    got = watch.check(Snapshot(0.0, 10.0, busy, {}, (), None, (), Summary()))
    assert got["layout"] == "1P1D push"
    assert got["rate"] == pytest.approx(0.4)
    assert 0.5 < got["ttft_factor"] < 2  # 2.5 s observed vs the 1.3 s transfer model
    quiet = (_inst("p", "prefill", None, 0.5, 0.0),)
    assert "--rate" in watch.check(Snapshot(0.0, 10.0, quiet, {}, (), None, (), Summary()))["note"]
