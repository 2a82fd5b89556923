"""The benchmark engine's pure parts: arrivals, prompts, percentiles, records, plans, and
the streaming client against a scripted server."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdctl.sdk.bench import loadgen, report
from pdctl.sdk.bench.arrivals import arrival_offsets, count_for
from pdctl.sdk.bench.loadgen import BenchError, dataset_prompts, synthetic_prompts
from pdctl.sdk.bench.plan import PRESETS, BenchPlan
from pdctl.sdk.bench.stats import RequestResult, Slo, percentile, summarize

# ---------------------------------------------------------------------- arrivals


@pytest.mark.parametrize("rate", [0.5, 2.0, 8.0])
def test_poisson_mean_rate_over_a_long_seeded_run(rate: float):
    t = arrival_offsets(rate, 20_000, seed=7)
    gaps = np.diff(t)
    assert 20_000 / t[-1] == pytest.approx(rate, rel=0.03)
    # exponential gaps: coefficient of variation 1
    assert float(np.std(gaps) / np.mean(gaps)) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(("burstiness", "cv"), [(0.25, 2.0), (4.0, 0.5)])
def test_gamma_burstiness_keeps_the_rate_and_changes_the_spread(burstiness: float, cv: float):
    t = arrival_offsets(3.0, 20_000, burstiness=burstiness, seed=1)
    gaps = np.diff(t)
    assert float(np.mean(gaps)) == pytest.approx(1 / 3.0, rel=0.05)
    assert float(np.std(gaps) / np.mean(gaps)) == pytest.approx(cv, rel=0.08)


def test_arrivals_are_seeded_sorted_and_start_at_zero():
    a, b = arrival_offsets(4, 50, seed=3), arrival_offsets(4, 50, seed=3)
    assert a == b != arrival_offsets(4, 50, seed=4)
    assert a[0] == 0
    assert a == sorted(a)
    assert arrival_offsets(math.inf, 5) == [0.0] * 5


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_arrivals_reject_nonsense(rate: float, burst: float):
    with pytest.raises(ValueError, match="must be > 0"):
        arrival_offsets(rate, 3, burstiness=burst)


def test_count_for_is_bounded():
    assert count_for(2.0, 10, 100) == 20
    assert count_for(2.0, 10, 5) == 5
    assert count_for(0.01, 10, 5) == 1


# ---------------------------------------------------------------------- prompts


def test_synthetic_prompts_have_exact_length_and_unique_prefixes():
    ps = synthetic_prompts(300, 64, 546, seed=1)
    assert {p.length for p in ps} == {64}
    assert len({tuple(p.tokens[:2]) for p in ps if p.tokens}) == 300
    assert all(4 <= t < 546 for p in ps for t in p.tokens or [])
    later = synthetic_prompts(3, 64, 546, seed=1, first_index=300)
    assert not {tuple(p.tokens[:2]) for p in later if p.tokens} & {
        tuple(p.tokens[:2]) for p in ps if p.tokens
    }


def test_synthetic_prompts_refuse_impossible_requests():
    with pytest.raises(BenchError, match="too short"):
        synthetic_prompts(1, 1, 546)
    with pytest.raises(BenchError, match="unique prompts"):
        synthetic_prompts(10, 8, 7)


def test_dataset_prompts_cycle_and_name_bad_lines(tmp_path: Path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "hello"}\n\n{"prompt_token_ids": [5, 6, 7]}\n')
    ps = dataset_prompts(f, 5)
    assert [p.payload for p in ps] == ["hello", [5, 6, 7], "hello", [5, 6, 7], "hello"]
    f.write_text('{"prompt": "ok"}\n{"text": 1}\n')
    with pytest.raises(BenchError, match=r"d.jsonl:2"):
        dataset_prompts(f, 1)
    with pytest.raises(BenchError, match="cannot read"):
        dataset_prompts(tmp_path / "missing.jsonl", 1)


# ---------------------------------------------------------------------- percentiles


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(0, 100),
)
def test_percentile_matches_numpy(xs: list[float], q: float):
    got = percentile(xs, q)
    assert got is not None
    assert got == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-6)
    assert min(xs) <= got <= max(xs)


def test_percentile_edges():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], 101)


# ---------------------------------------------------------------------- records

VLLM_BENCH_FIELDS = {
    "completed": int,
    "request_throughput": float,
    "output_throughput": float,
    "mean_ttft_ms": float,
    "median_ttft_ms": float,
    "p99_ttft_ms": float,
    "mean_tpot_ms": float,
    "median_tpot_ms": float,
    "p99_tpot_ms": float,
    "mean_itl_ms": float,
    "median_itl_ms": float,
    "p99_itl_ms": float,
    "median_e2el_ms": float,
    "goodput": float,
}


def result(i: int, ttft: float, e2e: float, tokens: int = 5, **kw: Any) -> RequestResult:
    gaps = [(e2e - ttft) / (tokens - 1)] * (tokens - 1)
    return RequestResult(
        i, 10, 0.0, ok=True, ttft_s=ttft, e2e_s=e2e, output_tokens=tokens, itl_s=gaps, **kw
    )


def test_summary_excludes_warmup_and_counts_goodput():
    rs = [
        result(0, 5.0, 9.0, warmup=True),
        result(1, 0.1, 0.5),
        result(2, 0.3, 0.7),
        RequestResult(3, 10, 0.0, error="HTTP 500: boom"),
    ]
    s = summarize(rs, 2.0, Slo.parse("ttft:200"))
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["errors"] == ["HTTP 500: boom"]
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["goodput"] == pytest.approx(0.5)  # only request 1 meets ttft <= 200 ms
    assert s["request_throughput"] == pytest.approx(1.0)


def test_slo_parse_names_the_bad_part():
    assert Slo.parse("ttft:500,tpot:50") == Slo(500.0, 50.0)
    assert Slo.parse(None) is None
    with pytest.raises(ValueError, match="itl:5"):
        Slo.parse("itl:5")
    with pytest.raises(ValueError, match="not a number"):
        Slo.parse("ttft:fast")


def test_json_record_schema_and_csv(tmp_path: Path):
    rec = {
        "schema_version": 1,
        "mode": "push",
        "input_len": 512,
        "output_len": 5,
        "request_rate": 1.0,
        "num_prompts": 2,
        **summarize([result(1, 0.1, 0.5), result(2, 0.2, 0.6)], 2.0, Slo(300.0)),
        "kv_bytes_moved": 1e6,
        "verified": 2,
        "mismatched": 0,
    }
    report.write_json(tmp_path / "b.json", PRESETS["cpu-smoke"], [rec], {"spec": "x"})
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["plan"]["modes"] == ["push", "push-sequential"]
    (got,) = doc["results"]
    for key, typ in VLLM_BENCH_FIELDS.items():
        assert isinstance(got[key], typ), key
    report.write_csv(tmp_path / "b.csv", [rec])
    header, row = (tmp_path / "b.csv").read_text().splitlines()
    assert header.split(",")[:3] == ["mode", "input_len", "output_len"]
    assert row.startswith("push,512,5,")


@pytest.mark.slow  # imports matplotlib, which builds its font cache in the test home
def test_plot_renders_a_png(tmp_path: Path):
    pytest.importorskip(
        "matplotlib", reason="plots need the bench extra (pip install 'pdctl[bench]')"
    )
    recs = [
        {
            "mode": m,
            "input_len": n,
            "request_rate": r,
            "median_ttft_ms": 10.0 * float(r) + (5 if m == "pull" else 0),
            "p99_ttft_ms": 12.0 * float(r),
            "median_tpot_ms": 3.0,
            "p99_tpot_ms": None,
        }
        for m in ("push", "pull")
        for n in (1024, 2048)
        for r in (1.0, 2.0, "inf")  # "inf" (all at once) has no place on a rate axis
    ]
    out = report.plot(tmp_path / "p.png", recs, title="t")
    assert out is not None
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.shape[1] > img.shape[0] > 300  # two panels wide, two rows high


# ---------------------------------------------------------------------- plans


def test_plan_groups_modes_by_fleet_and_estimates():
    plan = BenchPlan(modes=("push", "pull", "push-sequential"), rates=(1.0, 2.0))
    assert plan.fleet_modes == ["push", "pull"]
    # the arms sharing a fleet run side by side per rate, their order flipping each time
    assert [(c.mode, c.rate) for c in plan.cells()] == [
        ("push", 1.0),
        ("push-sequential", 1.0),
        ("push-sequential", 2.0),
        ("push", 2.0),
        ("pull", 1.0),
        ("pull", 2.0),
    ]
    assert plan.estimate_s(fleet_start_s=60) > 120
    closed = plan.with_(concurrency=4)
    assert {c.rate for c in closed.cells()} == {math.inf}


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"modes": ("fast",)}, "unknown mode"),
        ({"input_lens": (1,)}, "input-lens"),
        ({"rates": (0.0,)}, "rates"),
        ({"output_len": 0}, "output-len"),
        ({"concurrency": 0}, "concurrency"),
    ],
)
def test_plan_rejects_bad_settings_by_name(kw: dict[str, Any], msg: str):
    with pytest.raises(BenchError, match=msg):
        BenchPlan(**kw)


def test_paper_preset_is_the_published_grid():
    p = PRESETS["paper"]
    assert p.input_lens == (1024, 2048, 4096, 8192, 16384)
    assert p.rates == (1.0, 2.0, 4.0, 8.0)
    assert p.output_len == 128
    assert not p.prefix_caching


# ---------------------------------------------------------------------- the client


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def scripted(handler: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_stream_one_records_ttft_itl_and_token_ids():
    seen: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        body = sse(
            {"choices": [{"text": "a", "token_ids": [7]}]},
            {"choices": [{"text": "", "token_ids": [8]}]},
            {"choices": [{"text": "c", "token_ids": [9]}]},
            {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}},
        )
        return httpx.Response(200, content=body)

    r = RequestResult(0, 0, 0.0)
    async with scripted(handler) as c:
        ids = await loadgen.stream_one(c, "http://x", {"prompt": [1]}, r, 5)
    assert ids == [7, 8, 9]
    assert r.ok
    assert r.error is None
    assert (r.output_tokens, r.prompt_tokens, len(r.itl_s)) == (3, 4, 2)
    assert r.ttft_s is not None
    assert r.e2e_s is not None
    assert r.e2e_s >= r.ttft_s
    assert seen[0]["prompt"] == [1]


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(503, content=b"busy"), "HTTP 503: busy"),
        (httpx.Response(200, content=b"data: {not json\n\n"), "JSONDecodeError"),
        (httpx.Response(200, content=sse({"error": {"message": "x"}})), "message"),
        (httpx.Response(200, content=b"data: [DONE]\n\n"), "no tokens streamed"),
    ],
)
async def test_stream_one_failures_are_recorded_not_raised(response: httpx.Response, error: str):
    r = RequestResult(0, 0, 0.0)
    async with scripted(lambda req: response) as c:
        await loadgen.stream_one(c, "http://x", {}, r, 5)
    assert not r.ok
    assert r.error is not None
    assert error in r.error


def test_cell_needs_exactly_one_loop_kind():
    import asyncio

    with pytest.raises(BenchError, match="either"):
        asyncio.run(loadgen.run_cell("http://x", "m", [], 4))
    with pytest.raises(BenchError, match="either"):
        asyncio.run(loadgen.run_cell("http://x", "m", [], 4, offsets=[0.0], concurrency=2))


async def test_the_load_carries_the_key_a_keyed_router_needs():
    from pdctl.sdk.bench.loadgen import Prompt

    key = "bench-k-9f8e7d"

    def router(req: httpx.Request) -> httpx.Response:  # 401 without the key, as ours is
        if req.headers.get("authorization") != f"Bearer {key}":
            return httpx.Response(401, content=b'{"error": {"message": "missing API key"}}')
        return httpx.Response(200, content=sse({"choices": [{"text": "a", "token_ids": [7]}]}))

    prompts = [Prompt(tokens=[1, 2]), Prompt(tokens=[3])]
    t = httpx.MockTransport(router)
    ok = await loadgen.run_cell(
        "http://x", "m", prompts, 1, concurrency=2, api_key=key, transport=t
    )
    assert all(r.ok for r in ok.results)
    bare = await loadgen.run_cell("http://x", "m", prompts, 1, concurrency=2, transport=t)
    assert all(r.error is not None and "401" in r.error for r in bare.results)


def test_the_bench_uses_the_specs_inference_key_before_its_admin_key():
    from pdctl.sdk.keys import inference_key
    from pdctl.sdk.spec import FleetSpec

    keys = [
        {"name": "ops", "role": "admin", "env": "B_ADMIN"},
        {"name": "gone", "role": "inference", "env": "B_UNSET"},
        {"name": "web", "role": "inference", "env": "B_WEB"},
    ]
    spec = FleetSpec.model_validate(
        {"model": {"path": "m"}, "prefill": [{}], "decode": [{}], "router": {"keys": keys}}
    )
    env = {"B_ADMIN": "adm", "B_WEB": "web-key"}
    assert inference_key(spec, env) == "web-key"  # an unset one is passed over
    assert inference_key(spec, {"B_ADMIN": "adm"}) == "adm"
    assert inference_key(spec, {}) is None


def test_shared_prefix_prompts_share_within_groups_only():
    from pdctl.sdk.bench.loadgen import shared_prefix_prompts

    ps = shared_prefix_prompts(12, 64, 1000, 3, 8, seed=1)
    toks = [p.tokens or [] for p in ps]
    assert all(len(t) == 64 for t in toks)
    assert toks[0][:56] == toks[3][:56] == toks[9][:56]  # group 0
    assert toks[0][:56] != toks[1][:56]
    assert len({tuple(t) for t in toks}) == 12  # every suffix its own
    other = shared_prefix_prompts(3, 64, 1000, 3, 8, seed=2)
    assert other[0].tokens is not None
    assert other[0].tokens[:56] != toks[0][:56]


def test_shared_prefix_preset_compares_policies_cell_by_cell():
    p = PRESETS["shared-prefix"]
    cells = p.cells()
    assert [c.policy for c in cells] == ["least_loaded", "cache_aware"]
    two = p.with_(input_lens=(256, 512))
    assert [(c.input_len, c.policy) for c in two.cells()] == [
        (256, "least_loaded"),
        (256, "cache_aware"),
        (512, "cache_aware"),
        (512, "least_loaded"),
    ]
    assert p.prefix_caching
    assert p.as_dict()["policies"] == ["least_loaded", "cache_aware"]
    with pytest.raises(BenchError, match="policy"):
        BenchPlan(policies=("fastest",))
    with pytest.raises(BenchError, match="shared_prefix"):
        BenchPlan(input_lens=(16,), shared_prefix=(2, 16))


def test_bench_spec_starts_the_router_cache_aware_when_compared():
    from pdctl.sdk.bench.suite import spec_for
    from pdctl.sdk.spec import FleetSpec
    from tests.conftest import spec_dict

    spec = FleetSpec(**spec_dict())
    out = spec_for(spec, "push", PRESETS["shared-prefix"])
    assert out.router is not None
    assert out.router.policy == "cache_aware"
    assert out.kv_events_on
    assert spec_for(spec, "push", PRESETS["cpu-smoke"]).router.policy != "cache_aware"  # type: ignore[union-attr]
