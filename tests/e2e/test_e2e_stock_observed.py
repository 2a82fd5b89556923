"""A stock-connector pair observed without a spec: every panel shows data or says why not.

A real vLLM-CPU 1P1D pull pair runs vLLM's own ``NixlConnector`` (``fleet.connector =
"stock"``) behind pdctl's router; `pdctl metrics` then reads it by its URLs alone
(``--prefill``/``--decode``/``--router``, no spec). Its JSON's ``panels`` name, for every
figure the CLI and the TUI draw, either that it has data or why it has none: the figures
vLLM's own series give are shown (latencies, queues, KV usage, NIXL's transfers on the
reading decode, the router's pairs and their split), the ones the stock connector or the
pull mode cannot give are blank with the reason, and one scrape's rates are blank with
the reason until a stream's second scrape fills them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics.panels import ONE_SCRAPE
from tests.e2e.conftest import demo_spec, running_fleet
from tests.e2e.test_e2e_router import body, router_url, urls

pytestmark = pytest.mark.e2e

PANELS = {
    "fleet": {"request_rate", "running", "waiting", "kv_usage", "prefix_hit_rate"},
    "latency": {"ttft", "itl", "tpot", "e2e", "router_ttft"},
    "lengths": {"prompt_tokens", "output_tokens"},
    "transfers": {"bytes_total", "throughput", "xfer_time", "post_time", "descriptors"},
    "kv_sources": {"kv_fetch_by_stage", "prompt_tokens_by_source"},
    "rendezvous": {"prefill", "decode"},
    "pairs": {"requests", "ttft", "ttft_split", "ttft_split_engines", "kv_verify", "canary"},
    "admission": {"shed", "admitted", "prediction_error"},
}
"""Every panel and figure `pdctl metrics` reports on."""
REAL = {
    "fleet": {"running", "waiting", "kv_usage"},
    "latency": {"ttft", "itl", "tpot", "e2e", "router_ttft"},
    "lengths": {"prompt_tokens", "output_tokens"},
    "transfers": {"bytes_total", "xfer_time"},
    "kv_sources": {"prompt_tokens_by_source"},
    "pairs": {"requests", "ttft", "ttft_split"},
}
"""What vLLM's own series and the router give on a stock pull pair after traffic."""


@pytest.fixture(scope="module")
def stock_pair(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec, _ = demo_spec(tiny_model, "e2e-stock")
    spec.fleet.mode = "pull"
    spec.fleet.connector = "stock"
    yield from running_fleet(spec)


@pytest.fixture(scope="module")
def endpoints(stock_pair: Fleet) -> list[str]:
    """The pair's URLs as an operator who did not launch it would give them, after a
    few requests through the router."""
    p, d = urls(stock_pair)
    with httpx.Client(timeout=120) as c:
        for n in range(4):
            r = c.post(router_url(stock_pair) + "/v1/completions", json=body(f"stock pair {n}"))
            assert r.status_code == 200, r.text
    return ["--prefill", p, "--decode", d, "--router", router_url(stock_pair)]


def pdctl_metrics(*argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pdctl.cli.main", "metrics", "--window", "600", *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode in (0, 1), out.stderr  # 1: an alert is open (listed in the JSON)
    return out


def check_every_figure(panels: dict[str, Any]) -> None:
    assert set(panels) == set(PANELS)
    for name, figures in PANELS.items():
        shown, missing = set(panels[name]["shown"]), panels[name]["missing"]
        assert shown | set(missing) == figures, name
        assert not shown & set(missing), name
        for figure, why in missing.items():
            assert isinstance(why, str), (name, figure)
            assert len(why) > 20, (name, figure, why)


def test_one_scrape_shows_vllms_figures_and_says_why_not_for_the_rest(endpoints: list[str]):
    out = pdctl_metrics("--once", "-o", "json", *endpoints)
    doc = json.loads(out.stdout)
    panels = doc["panels"]
    check_every_figure(panels)
    for name, figures in REAL.items():
        assert figures <= set(panels[name]["shown"]), (name, panels[name])
    # what needs two scrapes says so
    assert panels["fleet"]["missing"]["request_rate"] == ONE_SCRAPE
    assert panels["transfers"]["missing"]["throughput"] == ONE_SCRAPE
    # what a pull fleet or the stock connector cannot give says so, with no zeros
    for side in ("prefill", "decode"):
        assert "pull fleet" in panels["rendezvous"]["missing"][side]
    assert "pull fleet" in panels["pairs"]["missing"]["ttft_split_engines"]
    assert "canary" in panels["pairs"]["missing"]["canary"]
    assert set(panels["admission"]["missing"]) >= {"shed", "admitted"}  # rates: one scrape
    engines = [i for i in doc["instances"] if i["role"] != "router"]
    assert {i["health"] for i in doc["instances"]} == {"UP"}
    assert all(i["rendezvous"] is None for i in engines)
    assert all(i["pdctl_series"] is False for i in engines)
    (d,) = [i for i in engines if i["role"] == "decode"]
    assert d["transfers"]["bytes_total"] > 0  # the reading decode records NIXL's figures
    # the table says the same in words
    text = " ".join(pdctl_metrics("--once", *endpoints).stdout.split())  # unwrapped
    assert "no data for" in text
    assert "rendezvous.prefill" in text
    assert "a rate is a difference between two scrapes" in text


def test_a_stream_fills_the_rates(endpoints: list[str]):
    out = pdctl_metrics("-o", "json", "--count", "2", "--interval", "1", *endpoints)
    first, second = (json.loads(line) for line in out.stdout.splitlines())
    assert "request_rate" in first["panels"]["fleet"]["missing"]
    check_every_figure(second["panels"])
    assert "request_rate" in second["panels"]["fleet"]["shown"]
    assert "throughput" in second["panels"]["transfers"]["shown"]
    assert {"shed", "admitted"} <= set(second["panels"]["admission"]["shown"])
