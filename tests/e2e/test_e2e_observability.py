"""The operator's stack on the real CPU push fleet. A real Prometheus, started by
`pdctl up` (``[observability] prometheus = true``), scrapes it with the generated
configuration: every dashboard query returns data, pdctl's figures agree with Prometheus'
own, promtool accepts the generated rules, the instance-down rule fires when decode is
killed, and `pdctl down` stops Prometheus. An OTLP/HTTP receiver collects the spans of
the router and of both vLLM instances for one request: one trace, linked leg by leg.

Prometheus comes from the distribution's package (scripts/install-prometheus.sh). Without
it the module is skipped, unless ``PDCTL_REQUIRE_PROMETHEUS`` is set (CI), where that is
a failure.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.fleet import Fleet, read_state
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.observability import dashboards
from pdctl.sdk.observability.dashboards import expand
from pdctl.sdk.urls import router_url
from tests.conftest import free_ports
from tests.e2e.conftest import WORDS, demo_spec, running_fleet
from tests.otlp import OtlpReceiver
from tests.promql import counters, shipped_names

pytestmark = pytest.mark.e2e

NAME = "e2e-prom"
WINDOW_S = 60.0
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
if not (PROMETHEUS and PROMTOOL):
    if os.environ.get("PDCTL_REQUIRE_PROMETHEUS"):
        raise RuntimeError(
            "PDCTL_REQUIRE_PROMETHEUS is set but prometheus/promtool are not on PATH: "
            "run scripts/install-prometheus.sh"
        )
    pytest.skip(
        "prometheus/promtool not installed (scripts/install-prometheus.sh installs them)",
        allow_module_level=True,
    )

PROMPTS = [
    " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(10 + i)) + f" #{i}" for i in range(24)
]


@dataclass
class Stack:
    fleet: Fleet
    prom: str
    rules: Path
    window_start: float = 0.0
    """Unix time just before the traffic (the fleet idle)."""
    window_end: float = 0.0
    """Unix time after the traffic settled and Prometheus scraped it."""
    monitor: FleetMonitor | None = None
    idle_counters: set[str] = field(default_factory=set)
    """The counters Prometheus held series of before the first request."""


def query(prom: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = at
    r = httpx.get(prom + "/api/v1/query", params=params, timeout=30)
    body = r.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scalar(prom: str, expr: str, at: float) -> float:
    result = query(prom, expr, at)
    assert len(result) == 1, f"{expr}: {result}"
    return float(result[0]["value"][1])


def wait_scraped(prom: str, after: float, timeout_s: float = 30) -> None:
    """Until every target has been scraped successfully since ``after``."""
    deadline = time.monotonic() + timeout_s
    while True:
        targets = httpx.get(prom + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        fresh = [
            t
            for t in targets
            if t["health"] == "up" and _ts(t["lastScrape"]) > after + t["lastScrapeDuration"]
        ]
        if targets and len(fresh) == len(targets):
            return
        assert time.monotonic() < deadline, f"targets not scraped: {targets}"
        time.sleep(0.5)


def _ts(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def send_traffic(url: str) -> None:
    async def go() -> None:
        sem = asyncio.Semaphore(2)
        async with httpx.AsyncClient(timeout=120) as c:

            async def one(p: str) -> httpx.Response:
                async with sem:
                    body = {
                        "model": "tiny",
                        "prompt": p,
                        "max_tokens": 16,
                        "temperature": 0,
                        "ignore_eos": True,
                    }
                    return await c.post(url + "/v1/completions", json=body)

            rs = await asyncio.gather(*(one(p) for p in PROMPTS))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]

    asyncio.run(go())


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path, otlp: OtlpReceiver) -> Iterator[Fleet]:
    """The demo push fleet with ``[observability] prometheus = true``: `pdctl up` starts
    the Prometheus these tests query, with the generated scrape config and rules; the
    router and the engines send their spans to the test's OTLP receiver."""
    spec = demo_spec(tiny_model, NAME)[0]
    assert spec.router is not None
    spec.router = spec.router.model_copy(update={"otlp_endpoint": otlp.url})
    # export spans within half a second instead of the SDK's 5 s
    spec.fleet = spec.fleet.model_copy(
        update={"env": {**spec.fleet.env, "OTEL_BSP_SCHEDULE_DELAY": "500"}}
    )
    spec.observability = spec.observability.model_copy(
        update={
            "prometheus": True,
            "prometheus_port": free_ports(1)[0],
            "prometheus_bin": PROMETHEUS,
            "scrape_interval": "1s",
        }
    )
    yield from running_fleet(spec)


@pytest.fixture(scope="module")
def stack(fleet: Fleet, state_root: Path) -> Stack:
    spec = fleet.fleet.spec
    o = spec.observability
    prom = f"http://{o.prometheus_host}:{o.prometheus_port}"
    s = Stack(fleet, prom, state_root / NAME / "prometheus" / "pdctl-rules.yml")
    # pdctl's monitor and Prometheus both see the fleet idle, then the traffic
    s.monitor = FleetMonitor.for_fleet(spec, fleet.fleet.plan, window_s=3600)
    wait_scraped(prom, time.time())
    asyncio.run(s.monitor.poll())
    s.idle_counters = {
        r["metric"]["__name__"]
        for r in query(prom, f'group by (__name__) ({{__name__=~".+_total", fleet="{NAME}"}})')
    }
    s.window_start = time.time()
    time.sleep(1.5)
    send_traffic(router_url(spec))
    # a one-minute window (the monitor's default): Prometheus' increase() extrapolates
    # to the window's edges, by at most two scrape intervals out of sixty seconds
    time.sleep(max(1.0, s.window_start + WINDOW_S - time.time()))
    asyncio.run(s.monitor.poll())
    wait_scraped(prom, time.time())
    s.window_end = time.time()
    return s


def test_prometheus_is_supervised_with_the_fleet(stack: Stack):
    by_name = {i.name: i for i in stack.fleet.status()}
    assert by_name["prometheus"].state == "ready"
    cfg = httpx.get(stack.prom + "/api/v1/status/config", timeout=10).json()["data"]["yaml"]
    assert f"job_name: pdctl-{NAME}" in cfg
    targets = httpx.get(stack.prom + "/api/v1/targets", timeout=10).json()["data"]
    labels = sorted(t["labels"]["instance"] for t in targets["activeTargets"])
    assert labels == ["decode-0", "prefill-0", "router"]
    assert all(t["labels"]["fleet"] == NAME for t in targets["activeTargets"])


def test_every_panel_returns_data(stack: Stack):
    empty = []
    n = 0
    for d in dashboards():
        for p in d.panels:
            for q in p.queries:
                n += 1
                result = query(stack.prom, expand(q.expr, NAME, "2m"), stack.window_end)
                finite = [r for r in result if math.isfinite(float(r["value"][1]))]
                if not finite:
                    empty.append(f"{d.uid} / {p.title}: {q.expr}")
    print(f"\n{n} dashboard queries, {len(empty)} without data")
    assert empty == []


def test_every_counter_read_exists_before_the_first_request(stack: Stack):
    """Counters exist from the start: every counter a dashboard panel or an alert rule of
    this fleet reads had a series (at 0) while the fleet was still idle."""
    read = shipped_names(stack.fleet.fleet.spec)
    wanted = counters(read)
    assert {"pdctl_router_retries_total", "pdctl:push_expired_total"} <= wanted
    missing = sorted(f"{n} ({', '.join(sorted(read[n]))})" for n in wanted - stack.idle_counters)
    print(f"\n{len(wanted)} counters read by the dashboards and rules, {len(missing)} missing")
    assert missing == []


def test_promtool_accepts_the_rules(stack: Stack):
    r = subprocess.run(
        [PROMTOOL or "promtool", "check", "rules", str(stack.rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    loaded = httpx.get(stack.prom + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert {rule["name"] for g in loaded for rule in g["rules"]} >= {"PA006", "PA001", "PA007"}


def test_pdctl_agrees_with_prometheus(stack: Stack):
    """TTFT p50/p99 on decode and KV bytes pushed by prefill over the traffic window:
    pdctl's monitor against histogram_quantile/increase in Prometheus, within 5%."""
    assert stack.monitor is not None
    snap = stack.monitor.snapshot()
    d, p = snap.instance("decode-0"), snap.instance("prefill-0")
    w = f"{math.ceil(stack.window_end - stack.window_start)}s"
    at = stack.window_end
    sel = f'fleet="{NAME}"'

    def ttft(q: float) -> float:
        return scalar(
            stack.prom,
            f"histogram_quantile({q}, sum by (le) (increase("
            f'vllm:time_to_first_token_seconds_bucket{{{sel}, instance="decode-0"}}[{w}])))',
            at,
        )

    moved = scalar(
        stack.prom,
        f'sum(increase(vllm:nixl_bytes_transferred_sum{{{sel}, instance="prefill-0"}}[{w}]))',
        at,
    )
    pairs = {
        "ttft_p50": (d.ttft.p50, ttft(0.5)),
        "ttft_p99": (d.ttft.p99, ttft(0.99)),
        "kv_bytes": (p.transfers.bytes_window, moved),
    }
    assert d.ttft.count == len(PROMPTS)
    report = []
    for name, (ours, theirs) in pairs.items():
        assert ours is not None, name
        assert ours > 0, name
        ratio = ours / theirs
        report.append(f"{name}: pdctl {ours:.6g} prometheus {theirs:.6g} ratio {ratio:.4f}")
        assert abs(ratio - 1) <= 0.05, report[-1]
    print("\n" + "\n".join(report) + f"\nwindow {w}")


TRACE = "5e1f0c3a9d2b4e6f8a7c1b2d3e4f5a6b"
CLIENT_SPAN = "a1b2c3d4e5f60718"


def test_one_request_is_one_trace(stack: Stack, otlp: OtlpReceiver):
    """The client's trace holds the router's route span, its prefill and decode legs,
    and each engine's own span under the leg that reached it."""
    resp = httpx.post(
        stack.fleet.fleet.router_url + "/v1/completions",
        json={"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0},
        headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text

    def engine(instance: str) -> list[Any]:
        return [s for s in otlp.trace(TRACE) if s.resource.get("pdctl.instance") == instance]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = {s.name for s in otlp.trace(TRACE) if s.service == "pdctl-router"}
        if (
            {"route", "prefill leg", "decode leg"} <= names
            and engine("prefill-0")
            and engine("decode-0")
        ):
            break
        time.sleep(0.5)
    spans = otlp.trace(TRACE)
    assert otlp.errors == []
    router = {s.name: s for s in spans if s.service == "pdctl-router"}
    assert set(router) == {"route", "prefill leg", "decode leg"}, otlp.dump()
    route = router["route"]
    assert route.parent_id == CLIENT_SPAN
    assert router["prefill leg"].parent_id == route.span_id
    assert router["decode leg"].parent_id == route.span_id
    for instance, leg in (("prefill-0", "prefill leg"), ("decode-0", "decode leg")):
        mine = engine(instance)
        assert mine, f"no span from {instance}: {otlp.dump()}"
        assert {s.service for s in mine} == {"vllm"}
        assert any(s.parent_id == router[leg].span_id for s in mine), (instance, mine)
    print(
        f"\ntrace {TRACE}: "
        + ", ".join(f"{s.service}/{s.resource.get('pdctl.instance', '')}:{s.name}" for s in spans)
    )


def test_instance_down_rule_fires_when_decode_is_killed(stack: Stack, state_root: Path):
    rec = read_state(state_root / NAME)
    assert rec is not None
    shepherd = rec.instance("decode-0").shepherd_pid
    api = int(Path(f"/proc/{shepherd}/task/{shepherd}/children").read_text().split()[0])
    os.kill(api, signal.SIGKILL)
    t0 = time.monotonic()
    firing: list[dict[str, Any]] = []
    while time.monotonic() - t0 < 60:
        alerts = httpx.get(stack.prom + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        firing = [
            a for a in alerts if a["labels"].get("alertname") == "PA006" and a["state"] == "firing"
        ]
        if firing:
            break
        time.sleep(1)
    print(f"\nPA006 firing {time.monotonic() - t0:.1f}s after the kill")
    assert [a["labels"]["instance"] for a in firing] == ["decode-0"]
    a = firing[0]
    assert a["labels"]["severity"] == "critical"
    assert a["annotations"]["description"] == (
        "decode-0 does not answer /metrics (Prometheus cannot scrape it)"
    )


def test_down_stops_prometheus(stack: Stack):
    stack.fleet.down()  # what `pdctl down` asks the supervisor to do
    with pytest.raises(httpx.ConnectError):
        httpx.get(stack.prom + "/-/ready", timeout=5)
