"""Counters exist from the start: the real router, before its first request, exports every
counter it has at 0 for the label values it knows (modes, outcomes, roles, instances,
pairs, tenants), and every router counter the shipped dashboards and alert rules read has
a series. pdctl's connector declares every label value of its labelled counters, so it can
export them at 0 too (tests/e2e/test_e2e_observability.py checks them on real vLLM)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from pdctl.sdk.metrics import parse
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.promreg import Counter, Registry
from pdctl.sdk.router.timeline import OUTCOMES
from pdctl.sdk.spec import FleetSpec
from tests.conftest import spec_dict
from tests.promql import counters, metric_names, shipped_names
from tests.unit.test_router import rig

TWO = [MockConfig(role="prefill", engine_id=f"prefill-{i}") for i in range(2)]
DECODES = [MockConfig(role="decode"), MockConfig(role="decode")]


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for s in parse(text):
        out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def declared_counters(text: str) -> set[str]:
    return {
        line.split()[2] + "_total" if not line.split()[2].endswith("_total") else line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE ") and line.split()[3] == "counter"
    }


async def idle_metrics(**kw: object) -> str:
    async with rig("push", prefills=TWO, decodes=DECODES, **kw) as t, httpx.AsyncClient() as c:  # type: ignore[arg-type]
        text = (await c.get(t.url + "/metrics")).text
        hist = (await c.get(t.url + "/v1/pdctl/requests")).json()
        assert hist["requests"] == []  # no request yet: every value below is a primed 0
        return text


async def test_every_router_counter_has_its_label_values_at_zero():
    text = await idle_metrics(router={"policy": "cache_aware"}, fleet={"kv_events": False})
    got = series(text)
    empty = sorted(n for n in declared_counters(text) if not got.get(n))
    assert empty == []
    for name, rows in got.items():
        if name.endswith("_total"):
            assert all(v == 0 for _, v in rows), (name, rows)

    def values(name: str, label: str) -> set[str]:
        return {lab[label] for lab, _ in got[name]}

    assert {(lab["mode"], lab["outcome"]) for lab, _ in got["pdctl_router_requests_total"]} == {
        (m, o) for m in ("push", "push-sequential") for o in OUTCOMES
    }
    assert values("pdctl_router_retries_total", "role") == {"prefill", "decode"}
    prefills, decodes = ("prefill-0", "prefill1-0"), ("decode-0", "decode1-0")
    assert values("pdctl_router_prefill_identity_changes_total", "instance") == set(prefills)
    assert values("pdctl_router_migrations_total", "instance") == set(decodes)
    pairs = {(lab["prefill"], lab["decode"]) for lab, _ in got["pdctl_router_pair_requests_total"]}
    assert pairs == {(p, d) for p in prefills for d in decodes}
    assert values("pdctl_router_disaggregation_decisions_total", "decision") == {
        "disaggregated",
        "decode-only",
    }
    assert values("pdctl_router_kv_releases_total", "outcome") == {"sent", "failed"}
    assert values("pdctl_router_kv_index_transitions_total", "state") == {
        "EXACT",
        "DEGRADED",
        "FALLBACK",
    }


async def test_every_router_counter_the_dashboards_and_rules_read_has_a_series():
    # the canary's counters (its panel, PA013) exist when it is on
    text = await idle_metrics(router={"canary": {"rate": 1.0}})
    got = series(text)
    pairs = {(lab["prefill"], lab["decode"]) for lab, _ in got["pdctl_router_canary_total"]}
    assert len(pairs) == len(TWO) * len(DECODES)
    results = {lab["result"] for lab, _ in got["pdctl_router_canary_total"]}
    assert results == {"match", "diverged", "tied", "error"}
    spec = FleetSpec.model_validate(spec_dict())
    read = shipped_names(spec)
    router_counters = {n for n in counters(read) if n.startswith("pdctl_router_")}
    assert router_counters  # the shipped queries read some (else this proves nothing)
    missing = sorted(f"{n} ({', '.join(sorted(read[n]))})" for n in router_counters - set(got))
    assert missing == []


def test_every_labelled_connector_counter_declares_its_label_values():
    for m in rv.METRICS:
        assert len(m.values) == len(m.labels), m.name
        assert all(m.values), m.name
    read = counters(shipped_names(FleetSpec.model_validate(spec_dict())))
    ours = {m.name + "_total" for m in rv.METRICS if m.kind == "counter"}
    assert {n for n in read if n.startswith(rv.PREFIX)} <= ours


def test_prime_exports_every_combination_once():
    reg = Registry()
    c = reg.counter("x_total", "x", ("a", "b"))
    c.prime(("1", "2"), ("u",))
    c.inc("1", "u")
    c.prime(("1", "2"), ("u",))  # priming again keeps what was counted
    assert c.values == {("1", "u"): 1.0, ("2", "u"): 0.0}
    with pytest.raises(ValueError, match="2 label"):
        c.prime(("1",))
    bare = Counter("y_total", "y")
    bare.prime()
    assert bare.expose()[-1] == "y_total 0.0"


def test_metric_names_reads_selectors_and_name_matchers():
    expr = (
        'sum by (le) (rate(vllm:x_bucket{fleet="f"}[1m])) + '
        'increase({__name__=~"vllm:nixl_num_failed_(transfers|notifications)_total", fleet="f"}'
        '[1m]) and up{role!="router"}'
    )
    assert metric_names(expr) == {
        "vllm:x_bucket",
        "vllm:nixl_num_failed_transfers_total",
        "vllm:nixl_num_failed_notifications_total",
        "up",
    }


def test_the_connector_exports_every_counter_and_label_value_at_zero():
    """pdctl's connector metrics built on vLLM's own NixlPromMetrics (installed vLLM), in a
    private registry: before any event every pdctl:* series exists, labelled ones with
    each of their declared values, next to vLLM's NIXL counters."""
    import functools
    from types import SimpleNamespace

    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'pdctl[cpu]')")

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client import Counter as PCounter
    from prometheus_client import Gauge as PGauge
    from prometheus_client import Histogram as PHistogram
    from vllm.config import KVTransferConfig

    from pdctl.connector.push import PdctlPromMetrics

    reg = CollectorRegistry()
    kinds = {k: functools.partial(k, registry=reg) for k in (PGauge, PCounter, PHistogram)}
    kv = KVTransferConfig(kv_connector="PdctlPushConnector", kv_role="kv_both")
    engines: dict[int, list[object]] = {0: ["tiny", "0"], 1: ["tiny", "1"]}
    PdctlPromMetrics(
        SimpleNamespace(kv_transfer_config=kv), kinds, ["model_name", "engine"], engines
    )
    got = series(generate_latest(reg).decode())
    for m in rv.METRICS:
        name = m.name + {"counter": "_total", "histogram": "_count"}.get(m.kind, "")
        rows = got.get(name, [])
        want = {(e, *combo) for e in ("0", "1") for combo in itertools.product(*m.values)}
        assert {(lab["engine"], *(lab[k] for k in m.labels)) for lab, _ in rows} == want, name
        assert all(v == 0 for _, v in rows), name
    for read in counters(shipped_names(FleetSpec.model_validate(spec_dict()))):
        if read.startswith(("vllm:nixl_", rv.PREFIX)):
            assert got.get(read), read


async def test_every_router_latency_histogram_dashboards_read_exists_empty_at_start():
    """The router's latency histograms exist, empty, for every label value they can take
    before the first request: a series first scraped after its first requests has no
    earlier sample, so Prometheus' rate() never counts them (a short burst leaves the
    latency panels without data)."""
    got = series(await idle_metrics())
    prefills, decodes = ("prefill-0", "prefill1-0"), ("decode-0", "decode1-0")
    modes = {"push", "push-sequential"}
    for name, label, want in (
        ("pdctl_router_ttft_seconds", "mode", modes),
        ("pdctl_router_e2e_seconds", "mode", modes),
        ("pdctl_router_decode_first_byte_after_prefill_seconds", "mode", modes),
        ("pdctl_router_leg_overlap_seconds", "mode", modes),
        ("pdctl_router_prefill_leg_seconds", "instance", set(prefills)),
    ):
        assert {lab[label] for lab, _ in got[name + "_count"]} == want, name
        assert all(v == 0 for _, v in got[name + "_count"] + got[name + "_bucket"]), name
    pairs = {
        (lab["prefill"], lab["decode"]) for lab, _ in got["pdctl_router_pair_handoff_seconds_count"]
    }
    assert pairs == {(p, d) for p in prefills for d in decodes}
    shipped = [
        n for n in shipped_names() if n.startswith("pdctl_router_") and n.endswith("_bucket")
    ]
    assert shipped  # the dashboards read router histograms
    empty = sorted(n for n in shipped if not got.get(n))
    assert empty == [], f"read by a shipped query, no series before the first request: {empty}"
