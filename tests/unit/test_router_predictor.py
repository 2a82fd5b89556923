"""The TTFT predictor per P->D pair and SLO routing (router/predictor.py): the model on
synthetic data, unknown before enough observations, and through the router's HTTP face
over mock engines: routing to a pair predicted to meet the SLO, shedding, metrics."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from pdctl.sdk.client.results import RequestTimeline
from pdctl.sdk.router.admission import CLASSES
from pdctl.sdk.router.merge import merge_state
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.predictor import (
    ROUTING,
    Pair,
    PairModel,
    Predictor,
    Size,
    error_summary,
    size_of,
)
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.spec import RouterSpec
from pdctl.sdk.spec.admission import AdmissionSpec
from tests.unit.test_router import body, rig

URL = "/v1/completions"
TWO_DECODES = [MockConfig(role="decode"), MockConfig(role="decode")]
RR = {"policy": "round_robin"}


def up(name: str, outstanding: int = 0) -> Any:
    """What the predictor reads of an instance."""
    return SimpleNamespace(name=name, outstanding=outstanding)


def timeline(pair: Pair, **kw: Any) -> Any:
    """A settled request's timeline as the ledger hands it to the predictor."""
    at = {"now": 0.0}
    fields: dict[str, Any] = {
        "prefill": pair[0] or None,
        "decode": pair[1],
        "outcome": "ok",
        "retries": 0,
        "redispatched": False,
        "migrations": [],
        "decode_first_byte": None,
        "prediction": None,
        "size": None,
        "ttft_due": None,
        "notes": [],
        "mark": lambda: at["now"],
        **kw,
    }
    ns = SimpleNamespace(**fields)
    ns.note = ns.notes.append
    return ns


def truth(size: Size, p_load: int, d_load: int) -> float:
    """The synthetic fleet's TTFT: fixed 40 ms, 250 ms per 1k prompt tokens, 30 ms per
    prefill leg in flight, 5 ms per decode leg in flight."""
    return 0.04 + 0.25 * size.prompt_k + 0.03 * p_load + 0.005 * d_load


def teach(pred: Predictor, pair: Pair, n: int, seed: int = 7, noise: float = 0.0) -> list[float]:
    """``n`` requests on ``pair`` drawn from :func:`truth`; each one's relative error."""
    rng = random.Random(seed)
    errors: list[float] = []
    for _ in range(n):
        size = Size(rng.uniform(0.05, 2.0), 0.0)
        pl, dl = rng.randrange(0, 8), rng.randrange(0, 16)
        p, d = up(pair[0], pl), up(pair[1], dl)
        tl = timeline(pair, size=size)
        pred.record(tl, d, p)
        y = truth(size, pl, dl) * (1 + rng.uniform(-noise, noise))
        tl.decode_first_byte = y
        if tl.prediction.ahead_s is not None:
            errors.append(abs(tl.prediction.ahead_s - y) / y)
        pred.observe(tl)
    return errors


def trained(pred: Predictor, pair: Pair, fixed_s: float) -> None:
    """Give ``pair`` a known model predicting ``fixed_s`` whatever the request."""
    m = PairModel()
    m.n, m.mad, m.w_mad = 10_000, 10.0, 50.0
    m.theta = [fixed_s, 0.0, 0.0, 0.0, 0.0]
    pred.models[pair] = m


def predictor(**kw: Any) -> tuple[Predictor, Registry]:
    reg = Registry()
    return Predictor(AdmissionSpec(**kw), reg), reg


# ---------------------------------------------------------------------- the model


def test_the_model_converges_on_a_synthetic_workload():
    pred, reg = predictor()
    errors = teach(pred, ("p", "d"), 400)
    assert len(errors) == 400 - 16  # unknown for the first predictor_min_observations
    assert max(errors[-100:]) < 0.01  # noiseless: the fit is the law
    theta = pred.models[("p", "d")].theta
    for got, want in zip(theta, (0.04, 0.25, 0.03, 0.005, 0.0), strict=True):
        assert got == pytest.approx(want, abs=2e-3)
    text = reg.expose().decode()
    assert "pdctl_router_ttft_prediction_error_ratio_count 384.0" in text
    assert 'pdctl_router_ttft_predictions_total{result="unknown"} 16.0' in text
    assert 'pdctl_router_ttft_predictions_total{result="known"} 384.0' in text
    assert 'pdctl_router_pair_ttft_error_ratio{prefill="p",decode="d"}' in text


def test_noise_and_outliers_keep_the_median_error_small():
    pred, _ = predictor()
    errors = teach(pred, ("p", "d"), 300, noise=0.1)
    rng = random.Random(3)  # a few stalled requests (20x) do not ruin the fit
    for _ in range(5):
        size = Size(1.0, 0.0)
        tl = timeline(("p", "d"), size=size)
        pred.record(tl, up("d"), up("p"))
        tl.decode_first_byte = 20 * truth(size, 0, 0)
        pred.observe(tl)
    errors += teach(pred, ("p", "d"), 100, seed=rng.randrange(1000), noise=0.1)
    last = sorted(errors[-100:])
    assert last[50] < 0.1


def test_it_follows_a_pair_that_becomes_slower(monkeypatch):
    pred, _ = predictor()
    teach(pred, ("p", "d"), 300, noise=0.1)
    before = truth
    monkeypatch.setattr(f"{__name__}.truth", lambda size, pl, dl: 3 * before(size, pl, dl) + 0.5)
    errors = teach(pred, ("p", "d"), 300, seed=5, noise=0.1)
    assert sorted(errors[:25])[12] > 0.5  # the old fit, at first
    assert sorted(errors[-100:])[50] < 0.1


def test_unknown_before_enough_observations_and_per_pair():
    pred, _ = predictor(predictor_min_observations=5)
    size = Size(0.5, 0.0)
    assert pred.ahead(size, up("p"), up("d")) is None  # nothing learned: unknown
    teach(pred, ("p", "d"), 4)
    assert pred.ahead(size, up("p"), up("d")) is None
    teach(pred, ("p", "d"), 1, seed=9)
    assert pred.ahead(size, up("p"), up("d")) is not None
    assert pred.ahead(size, up("p2"), up("d")) is None  # another pair knows nothing
    assert pred.state()["pairs"][0]["known"] is True


def test_only_the_pairs_own_clean_requests_teach_it():
    pred, _ = predictor()
    for kw in (
        {"outcome": "error"},
        {"retries": 1},
        {"redispatched": True},
        {"migrations": [{"from": "d"}]},
        {"decode": "elsewhere"},
    ):
        tl = timeline(("p", "d"), size=Size(0.1, 0.0))
        pred.record(tl, up("d"), up("p"))
        for k, v in kw.items():
            setattr(tl, k, v)
        tl.decode_first_byte = 0.1
        pred.observe(tl)
    assert pred.models == {}


def test_size_of_bodies():
    assert size_of({"prompt": "x" * 4000, "stream": True}) == Size(1.0, 0.0)
    assert size_of({"prompt": [1, 2, 3, 4], "max_tokens": 100}) == Size(0.004, 0.1)
    chat = {"messages": [{"role": "user", "content": "x" * 400}], "stream": True}
    assert size_of(chat) == Size(0.1, 0.0)
    assert size_of({"prompt": "hi"}).gen_k == 0.016  # vLLM's completions default cap


def test_unreachable_only_when_every_pair_is_known_to_miss():
    pred, _ = predictor(slo_margin=0.1)
    d1, d2, p = up("d1"), up("d2"), up("p")
    trained(pred, ("p", "d1"), 2.0)
    size = Size(0.1, 0.0)
    assert pred.unreachable(size, 1.0, [(d1, p), (d2, p)]) is None  # d2 unknown
    trained(pred, ("p", "d2"), 1.05)
    assert pred.unreachable(size, 1.0, [(d1, p), (d2, p)]) is None  # within the margin
    trained(pred, ("p", "d2"), 1.2)
    assert pred.unreachable(size, 1.0, [(d1, p), (d2, p)]) == pytest.approx(1.2)
    assert pred.unreachable(size, 1.0, []) is None


def test_spec_defaults_and_errors_name_the_field():
    s = RouterSpec().admission
    assert (s.slo_routing, s.slo_margin, s.predictor_min_observations) == (True, 0.1, 16)
    with pytest.raises(ValueError, match="slo_margin"):
        RouterSpec.model_validate({"admission": {"slo_margin": -0.5}})
    with pytest.raises(ValueError, match="predictor_min_observations"):
        RouterSpec.model_validate({"admission": {"predictor_min_observations": 1}})
    with pytest.raises(ValueError, match="slo_routing"):
        RouterSpec.model_validate({"admission": {"slo_routing": "maybe"}})


def test_error_summary_of_the_routers_requests():
    reqs: list[dict[str, Any]] = [
        {"outcome": "ok", "predicted_ttft_ms": 110.0, "ttft_ms": 100.0},
        {"outcome": "ok", "predicted_ttft_ms": 50.0, "ttft_ms": 100.0},
        {"outcome": "ok", "predicted_ttft_ms": 100.0, "ttft_ms": 100.0},
        {"outcome": "ok", "predicted_ttft_ms": None, "ttft_ms": 100.0},
        {"outcome": "error", "predicted_ttft_ms": 1.0, "ttft_ms": 100.0},
    ]
    assert error_summary(reqs) == {"predicted": 3, "error_p50": 0.1, "error_p90": 0.5}
    assert error_summary([]) == {"predicted": 0, "error_p50": None, "error_p90": None}


def test_each_workers_models_in_the_merged_state():
    def state(n: int) -> dict[str, Any]:
        return {"instances": [], "predictor": {"slo_routing": True, "pairs": [{"n": n}]}}

    merged = merge_state([state(1), state(2)])
    assert merged["predictor"]["pairs"] == [{"n": 1}]
    assert merged["predictor"]["workers"] == [[{"n": 1}], [{"n": 2}]]


# ---------------------------------------------------------------------- through the router


async def test_metrics_exist_from_start():
    async with rig("push") as t, httpx.AsyncClient() as c:
        text = (await c.get(t.url + "/metrics")).text
        for r in ("known", "unknown"):
            assert f'pdctl_router_ttft_predictions_total{{result="{r}"}} 0.0' in text
        for d in ROUTING:
            assert f'pdctl_router_slo_routing_total{{decision="{d}"}} 0.0' in text
        for h in (
            "pdctl_router_ttft_predicted_seconds",
            "pdctl_router_ttft_predicted_observed_seconds",
            "pdctl_router_ttft_prediction_error_ratio",
        ):
            assert f"{h}_count 0.0" in text
        assert "# TYPE pdctl_router_pair_ttft_error_ratio gauge" in text
        for k in CLASSES:
            assert f'pdctl_router_shed_total{{reason="slo_unreachable",class="{k}"}} 0.0' in text


async def test_the_router_learns_each_pair_and_shows_predicted_against_observed():
    adm = {"predictor_min_observations": 2}
    async with rig("push", router={"admission": adm}) as t, httpx.AsyncClient() as c:
        for i in range(5):
            r = await c.post(t.url + URL, json=body(stream=i % 2 == 0))
            assert r.status_code == 200
        pred = t.router.instances.predictor
        (pair,) = pred.models
        assert pred.models[pair].n == 5
        recent = (await c.get(t.url + "/v1/pdctl/requests")).json()["requests"]
        known = [q for q in recent if q["predicted_ttft_ms"] is not None]
        assert len(known) == 3  # the first two: unknown
        assert all(q["ttft_ms"] is not None for q in known)
        text = (await c.get(t.url + "/metrics")).text
        assert "pdctl_router_ttft_prediction_error_ratio_count 3.0" in text
        assert 'pdctl_router_ttft_predictions_total{result="unknown"} 2.0' in text
        st = (await c.get(t.url + "/v1/pdctl/state")).json()["predictor"]
        assert st["pairs"][0]["observations"] == 5
        typed = RequestTimeline.from_json(known[0])
        assert typed.predicted_ttft_ms == known[0]["predicted_ttft_ms"]


async def test_routes_to_the_pair_predicted_to_meet_the_slo():
    async with rig("push", decodes=TWO_DECODES, router=RR) as t, httpx.AsyncClient() as c:
        pred = t.router.instances.predictor
        (p,) = t.router.prefills
        fast, slow = t.router.decodes
        trained(pred, (p.name, fast.name), 0.01)
        trained(pred, (p.name, slow.name), 60.0)
        hs = {"pdctl-slo-ttft-ms": "5000"}
        for _ in range(4):  # round robin alone would send two of them to the slow decode
            r = await c.post(t.url + URL, json=body(), headers=hs)
            assert r.status_code == 200, r.text
        recent = t.router.recent()
        assert [q["decode"] for q in recent] == [fast.name] * 4
        assert all(q["predicted_ttft_ms"] is not None for q in recent)
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_slo_routing_total{decision="steered"} 2.0' in text
        assert 'pdctl_router_slo_routing_total{decision="kept"} 2.0' in text
        # without an SLO the policy's choice stands
        for _ in range(2):
            assert (await c.post(t.url + URL, json=body())).status_code == 200
        assert {q["decode"] for q in t.router.recent()[:2]} == {fast.name, slow.name}


@pytest.mark.parametrize("klass", ["standard", "batch"])
async def test_a_sheddable_request_no_pair_can_serve_in_time_is_shed(klass):
    async with rig("push", decodes=TWO_DECODES) as t, httpx.AsyncClient() as c:
        pred = t.router.instances.predictor
        (p,) = t.router.prefills
        for d in t.router.decodes:
            trained(pred, (p.name, d.name), 60.0)
        hs = {"pdctl-slo-ttft-ms": "2000", "pdctl-priority": klass}
        r = await c.post(t.url + URL, json=body(), headers=hs)
        assert r.status_code == 503, r.text
        assert r.headers["pdctl-drop-reason"] == "slo_unreachable"
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "overloaded_error"
        assert "predicted" in r.json()["error"]["message"]
        assert sum(m.state.received for m in t.mocks.values()) == 0  # never reached the fleet
        text = (await c.get(t.url + "/metrics")).text
        assert f'pdctl_router_shed_total{{reason="slo_unreachable",class="{klass}"}} 1.0' in text
        # a deadline counts as well as an SLO
        r = await c.post(t.url + URL, json=body(), headers={"pdctl-deadline-ms": "2000"})
        assert r.headers["pdctl-drop-reason"] == "slo_unreachable"


async def test_interactive_is_shed_only_when_no_pair_can_come_near_its_slo():
    """An interactive request is sent on to the fastest pair when that one misses its SLO
    within the margin, and shed at once (503 slo_unreachable) when every pair misses it
    by more: nothing lower is in its way, it cannot be served in time."""
    async with rig("push", decodes=TWO_DECODES) as t, httpx.AsyncClient() as c:
        pred = t.router.instances.predictor
        (p,) = t.router.prefills
        fast, slow = t.router.decodes
        trained(pred, (p.name, fast.name), 2.1)  # misses 2000 ms, within the 10% margin
        trained(pred, (p.name, slow.name), 60.0)
        hs = {"pdctl-slo-ttft-ms": "2000", "pdctl-priority": "interactive"}
        r = await c.post(t.url + URL, json=body(), headers=hs)
        assert r.status_code == 200, r.text
        (q,) = t.router.recent()
        assert q["decode"] == fast.name  # the fastest predicted, though it misses
        assert any("no pair predicted" in n for n in q["notes"])
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_slo_routing_total{decision="missed"} 1.0' in text
        trained(pred, (p.name, fast.name), 30.0)
        r = await c.post(t.url + URL, json=body(), headers=hs)
        assert r.status_code == 503, r.text
        assert r.headers["pdctl-drop-reason"] == "slo_unreachable"
        assert len(t.router.recent()) == 1  # never reached the fleet
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_shed_total{reason="slo_unreachable",class="interactive"} 1.0' in text
        assert (
            'pdctl_router_shed_answer_seconds_count{class="interactive",when="arrival"} 1.0' in text
        )


async def test_an_unknown_prediction_never_sheds():
    async with rig("push", decodes=TWO_DECODES, router=RR) as t, httpx.AsyncClient() as c:
        pred = t.router.instances.predictor
        (p,) = t.router.prefills
        slow, unknown = t.router.decodes
        trained(pred, (p.name, slow.name), 60.0)
        hs = {"pdctl-slo-ttft-ms": "2000", "pdctl-priority": "batch"}
        for _ in range(2):
            r = await c.post(t.url + URL, json=body(), headers=hs)
            assert r.status_code == 200, r.text
        assert [q["decode"] for q in t.router.recent()] == [unknown.name] * 2
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_slo_routing_total{decision="explored"} 1.0' in text
        assert 'pdctl_router_shed_total{reason="slo_unreachable",class="batch"} 0.0' in text


async def test_slo_routing_off_neither_steers_nor_sheds():
    adm = {"slo_routing": False}
    router = {**RR, "admission": adm}
    async with rig("push", decodes=TWO_DECODES, router=router) as t, httpx.AsyncClient() as c:
        pred = t.router.instances.predictor
        (p,) = t.router.prefills
        for d in t.router.decodes:
            trained(pred, (p.name, d.name), 60.0)
        hs = {"pdctl-slo-ttft-ms": "2000"}
        for _ in range(2):
            assert (await c.post(t.url + URL, json=body(), headers=hs)).status_code == 200
        assert {q["decode"] for q in t.router.recent()} == {d.name for d in t.router.decodes}
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_ttft_predictions_total{result="known"} 2.0' in text  # measured


async def test_with_admission_off_it_steers_but_never_sheds():
    router = {**RR, "admission": {"enabled": False}}
    async with rig("push", decodes=TWO_DECODES, router=router) as t, httpx.AsyncClient() as c:
        pred = t.router.instances.predictor
        (p,) = t.router.prefills
        fast, slow = t.router.decodes
        trained(pred, (p.name, fast.name), 30.0)
        trained(pred, (p.name, slow.name), 60.0)
        hs = {"pdctl-slo-ttft-ms": "2000", "pdctl-priority": "batch"}
        for _ in range(2):
            assert (await c.post(t.url + URL, json=body(), headers=hs)).status_code == 200
        assert [q["decode"] for q in t.router.recent()] == [fast.name] * 2
