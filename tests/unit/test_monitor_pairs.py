"""The monitor's per-pair figures from the router (pdctl.sdk.metrics.monitor): how many
of a pair's requests pushed KV and what the digest check said of them (their flights),
and the router's output canary counts (its /metrics), each kept apart."""

from __future__ import annotations

import time
from typing import Any

import httpx

from pdctl.sdk.metrics.monitor import FleetMonitor

ROUTER_METRICS = "\n".join(
    [
        "# TYPE pdctl_router_canary_total counter",
        'pdctl_router_canary_total{prefill="prefill-0",decode="decode-0",result="match"} 7.0',
        'pdctl_router_canary_total{prefill="prefill-0",decode="decode-0",result="diverged"} 2.0',
        'pdctl_router_canary_total{prefill="prefill-0",decode="decode-0",result="tied"} 1.0',
        'pdctl_router_canary_total{prefill="prefill-0",decode="decode-0",result="error"} 0.0',
        # primed at 0, no request yet: not a pair to show
        'pdctl_router_canary_total{prefill="prefill-0",decode="decode-1",result="match"} 0.0',
        # counted since start, no request of the window: still shown
        'pdctl_router_canary_total{prefill="prefill-1",decode="decode-1",result="match"} 3.0',
    ]
)


def flight(verified: bool | None, pushed: float | None) -> dict[str, Any]:
    return {
        "id": "r",
        "prefill": "prefill-0",
        "decode": "decode-0",
        "received": time.time(),
        "outcome": "ok",
        "push": {"bytes": pushed, "verified": verified},
    }


def monitor(requests: list[dict[str, Any]]) -> FleetMonitor:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/pdctl/requests":
            return httpx.Response(200, json={"mode": "push", "requests": requests})
        return httpx.Response(200, text=ROUTER_METRICS + "\n")

    return FleetMonitor.for_endpoints(
        router="http://router:8000", transport=httpx.MockTransport(handler)
    )


async def test_pairs_count_pushes_verify_results_and_canary_results_apart():
    flights = [flight(True, 4096.0)] * 3 + [flight(False, 4096.0), flight(None, 4096.0)]
    flights += [flight(None, 0.0)]  # the decode had it all cached: nothing pushed
    snap = await monitor(flights).poll()
    by = {(p.prefill, p.decode): p for p in snap.pairs}
    assert sorted(by) == [("prefill-0", "decode-0"), ("prefill-1", "decode-1")]
    p = by["prefill-0", "decode-0"]
    assert p.requests == 6
    assert p.transfers == 5
    assert p.kv_verify == {"ok": 3, "mismatch": 1, "unsampled": 1}
    assert p.canary == {"match": 7.0, "diverged": 2.0, "tied": 1.0, "error": 0.0}
    q = by["prefill-1", "decode-1"]
    assert q.requests == 0
    assert q.canary["match"] == 3.0


async def test_flights_that_measured_no_push_leave_the_verify_figures_unknown():
    snap = await monitor([flight(None, None)]).poll()
    (p, _) = snap.pairs
    assert p.transfers == 0
    assert p.kv_verify == {}  # unknown (no flight series), not "0 verified"


async def test_pdctl_metrics_prints_each_pair_with_its_canary_and_verify_figures():
    from rich.console import Console

    from pdctl.cli.metricsview import snapshot_view

    flights = [flight(True, 4096.0), flight(False, 4096.0)]
    snap = await monitor(flights).poll()
    console = Console(width=200, record=True, color_system=None)
    console.print(snapshot_view(snap))
    text = console.export_text()
    assert "P -> D pairs" in text
    assert "verify ok/bad/skip (flights)" in text
    assert "canary match/diff/tie/err (router)" in text
    (row,) = [ln for ln in text.splitlines() if ln.strip().startswith("prefill-0 -> decode-0")]
    assert row.split()[-2:] == ["1/1/0", "7/2/1/0"]
    (other,) = [ln for ln in text.splitlines() if ln.strip().startswith("prefill-1 -> decode-1")]
    assert other.split()[-2:] == ["-", "3/0/0/0"]


async def test_a_new_canary_divergence_in_the_window_raises_pa013_for_its_pair():
    """PA013 in the live monitor: the router's ``diverged`` count of a pair grew between
    two of its scrapes; counts that stand still (2 since start) raise nothing."""
    text = [ROUTER_METRICS]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/pdctl/requests":
            return httpx.Response(200, json={"mode": "push", "requests": []})
        return httpx.Response(200, text=text[0] + "\n")

    m = FleetMonitor.for_endpoints(
        router="http://router:8000", transport=httpx.MockTransport(handler)
    )
    first = await m.poll()
    assert "PA013" not in {a.code for a in first.alerts}  # one scrape: no window yet
    still = await m.poll()
    assert "PA013" not in {a.code for a in still.alerts}  # 2 since start, none new
    text[0] = ROUTER_METRICS.replace('result="diverged"} 2.0', 'result="diverged"} 5.0')
    grown = await m.poll()
    (alert,) = [a for a in grown.alerts if a.code == "PA013"]
    assert alert.subject == "prefill-0 → decode-0"
    assert alert.message.startswith("prefill-0 → decode-0: 3 greedy answer(s) differed")
