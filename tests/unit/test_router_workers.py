"""The pure parts of a router of several workers: merging their metrics, requests and
state (:mod:`pdctl.sdk.router.merge`), the control requests every worker applies, each
worker's share of a rate limit, how many workers the default is, and the Unix-socket
channel's answers to a peer that is absent, silent or answers garbage."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.linesock import LineSockError, ask, serve
from pdctl.sdk.router.limits import Limiter
from pdctl.sdk.router.merge import merge_metrics, merge_requests, merge_state
from pdctl.sdk.router.promreg import Registry, expose_snapshot
from pdctl.sdk.router.workers import _cumulative, usable_cpus
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.spec.security import RateLimitSpec


def worker_registry(ok: float, up: float, breaker: float, inflight: float, lat: list[float]):
    reg = Registry()
    c = reg.counter("req_total", "requests", ("outcome",))
    c.inc("ok", by=ok)
    reg.gauge("up", "up", ("instance",), lambda: {("d0",): up}, merge="min")
    reg.gauge("breaker_open", "open", ("instance",), lambda: {("d0",): breaker}, merge="max")
    reg.gauge("outstanding", "in flight", ("instance",), lambda: {("d0",): inflight})
    h = reg.histogram("lat_seconds", "latency", (), buckets=(0.1, 1.0))
    for v in lat:
        h.observe(v)
    return reg


def test_counters_and_histograms_add_up_and_gauges_merge_by_their_rule() -> None:
    a = worker_registry(3, 1.0, 0.0, 2, [0.05, 0.5])
    b = worker_registry(4, 0.0, 1.0, 5, [2.0])
    merged = merge_metrics([a.snapshot(), b.snapshot()])
    text = expose_snapshot(merged).decode()
    assert 'req_total{outcome="ok"} 7.0' in text
    assert 'up{instance="d0"} 0.0' in text  # up while every worker sees it up
    assert 'breaker_open{instance="d0"} 1.0' in text  # open while any worker's is
    assert 'outstanding{instance="d0"} 7.0' in text  # in flight: the sum
    assert 'lat_seconds_bucket{le="0.1"} 1.0' in text
    assert 'lat_seconds_bucket{le="1.0"} 2.0' in text
    assert 'lat_seconds_bucket{le="+Inf"} 3.0' in text
    assert "lat_seconds_sum 2.55" in text
    assert "lat_seconds_count 3.0" in text
    assert text.count("# HELP req_total") == 1


def test_one_worker_merged_is_exactly_that_worker() -> None:
    a = worker_registry(3, 1.0, 0.0, 2, [0.05])
    assert expose_snapshot(merge_metrics([a.snapshot()])) == a.expose()


def test_a_series_only_one_worker_has_is_kept() -> None:
    a, b = Registry(), Registry()
    a.counter("x_total", "x", ("pair",)).inc("p0-d0")
    b.counter("x_total", "x", ("pair",)).inc("p1-d0", by=2)
    text = expose_snapshot(merge_metrics([a.snapshot(), b.snapshot()])).decode()
    assert 'x_total{pair="p0-d0"} 1.0' in text
    assert 'x_total{pair="p1-d0"} 2.0' in text


def test_histograms_with_different_buckets_are_refused() -> None:
    a, b = Registry(), Registry()
    a.histogram("h", "h", buckets=(1.0,)).observe(0.5)
    b.histogram("h", "h", buckets=(2.0,)).observe(0.5)
    with pytest.raises(ValueError, match="buckets"):
        merge_metrics([a.snapshot(), b.snapshot()])


def test_a_dead_workers_counts_stay_in_the_sum_and_its_gauges_go() -> None:
    dead = worker_registry(5, 1.0, 0.0, 9, [0.5]).snapshot()
    retired = merge_metrics([[], _cumulative(dead)])
    fresh = worker_registry(1, 1.0, 0.0, 0, []).snapshot()
    text = expose_snapshot(merge_metrics([fresh, retired])).decode()
    assert 'req_total{outcome="ok"} 6.0' in text  # never below what was exported
    assert 'outstanding{instance="d0"} 0.0' in text  # the dead worker's in-flight: gone
    assert "lat_seconds_count 1.0" in text


def test_requests_newest_first_over_workers_up_to_the_limit() -> None:
    w0 = [{"id": "a", "received": 5.0}, {"id": "b", "received": 1.0}]
    w1 = [{"id": "c", "received": 4.0}, {"id": "d", "received": 3.0}]
    assert [r["id"] for r in merge_requests([w0, w1], 3)] == ["a", "c", "d"]
    assert merge_requests([[], []], 10) == []


def state(inflight: int, healthy: bool, breaker: str) -> dict[str, Any]:
    inst = {"name": "d0", "role": "decode", "healthy": healthy, "drained": True}
    return {
        "mode": "push",
        "policy": "least_loaded",
        "instances": [{**inst, "in_flight": inflight, "breaker": breaker}],
    }


def test_state_sums_in_flight_and_takes_the_worst_health_and_breaker() -> None:
    s = merge_state([state(2, True, "closed"), state(3, False, "half-open")])
    (d0,) = s["instances"]
    assert (d0["in_flight"], d0["healthy"], d0["breaker"], d0["drained"]) == (
        5,
        False,
        "half-open",
        True,
    )
    assert [w["in_flight"] for w in d0["workers"]] == [2, 3]
    assert s["mode"] == "push"
    assert s["policy"] == "least_loaded"
    with pytest.raises(ValueError, match="no worker"):
        merge_state([])


@pytest.fixture
def instances() -> Any:
    from pdctl.sdk.lint import lint, require_clean
    from pdctl.sdk.router.instanceset import InstanceSet

    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": 18001, "devices": [0]}],
        decode=[{"http_port": 18002, "devices": [1]}],
        router={"port": 18003},
    )
    return InstanceSet(spec, require_clean(lint(spec, check_bound_ports=False)))


@pytest.mark.parametrize(
    ("setting", "req", "status", "says"),
    [
        ("mode", {"mode": "pull"}, 400, "push-sequential"),
        ("policy", {"policy": "cache_aware"}, 400, "cache_aware needs"),
        ("drain", {"instance": "nope"}, 404, "have: prefill-0, decode-0"),
        ("drain", {"instance": "decode-0", "drain": "yes"}, 400, "'drain' must be"),
        ("instance", {"instance": "decode-0", "event": "sideways"}, 400, "'event'"),
        ("instance", {"instance": "nope", "event": "up"}, 404, "no instance named 'nope'"),
        ("reboot", {}, 404, "no control setting 'reboot'"),
    ],
)
def test_control_refusals_name_the_problem(
    instances: Any, setting: str, req: dict[str, Any], status: int, says: str
) -> None:
    refused = instances.apply(setting, req)
    assert refused is not None
    assert refused[0] == status
    assert says in refused[1]


def test_control_changes_apply(instances: Any) -> None:
    assert instances.apply("mode", {"mode": "push-sequential"}) is None
    assert instances.apply("policy", {"policy": "least_loaded"}) is None
    assert instances.apply("drain", {"instance": "decode-0"}) is None
    st = instances.control_state()
    assert (st["mode"], st["policy"]) == ("push-sequential", "least_loaded")
    assert [i["drained"] for i in st["instances"]] == [False, True]


def test_each_worker_enforces_its_share_of_a_rate_limit() -> None:
    from pdctl.sdk.router.auth import Principal

    now = [0.0]
    spec = RateLimitSpec(requests_per_s=10, burst_s=1)
    whole = Limiter(Registry(), {"t": spec}, {}, clock=lambda: now[0])
    half = Limiter(Registry(), {"t": spec}, {}, clock=lambda: now[0], share=0.5)
    who = Principal(name="k", tenant="t", role="user")

    def admitted(lim: Limiter) -> int:
        from pdctl.sdk.router.limits import Refusal

        return sum(not isinstance(lim.reserve(who, 1), Refusal) for _ in range(100))

    assert (admitted(whole), admitted(half)) == (10, 5)


def test_default_workers_are_the_usable_cpus(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path / "absent") == cpus
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path / "cpu.max") == cpus
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU: one worker
    assert usable_cpus(tmp_path / "cpu.max") == 1
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert usable_cpus(tmp_path / "cpu.max") == cpus


async def test_the_channel_answers_an_absent_silent_or_garbled_peer(tmp_path: Path) -> None:
    with pytest.raises(LineSockError, match="cannot reach"):
        await ask(tmp_path / "absent.sock", {"op": "x"}, 1.0)

    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(5)
        return {"ok": True}

    server = await serve(tmp_path / "slow.sock", slow)
    try:
        with pytest.raises(LineSockError, match=r"did not answer within 0\.3 s"):
            await ask(tmp_path / "slow.sock", {"op": "x"}, 0.3)
    finally:
        server.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"not json\n")
        await writer.drain()
        writer.close()

    g = await asyncio.start_unix_server(garbage, str(tmp_path / "g.sock"))
    try:
        with pytest.raises(LineSockError, match="malformed reply"):
            await ask(tmp_path / "g.sock", {"op": "x"}, 1.0)
    finally:
        g.close()

    async def refuse(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": False, "error": "no such op"}

    r = await serve(tmp_path / "r.sock", refuse)
    try:
        with pytest.raises(LineSockError, match="no such op"):
            await ask(tmp_path / "r.sock", {"op": "x"}, 1.0)
        assert (tmp_path / "r.sock").stat().st_mode & 0o777 == 0o600
    finally:
        r.close()


def test_a_histograms_inf_bucket_is_its_count_whatever_the_values() -> None:
    reg = Registry()
    h = reg.histogram("h_seconds", "h", buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 7.0):  # one above the top bound
        h.observe(v)
    text = reg.expose().decode()
    assert 'h_seconds_bucket{le="1.0"} 2.0' in text
    assert 'h_seconds_bucket{le="+Inf"} 3.0' in text
    assert "h_seconds_sum 7.55" in text
    assert "h_seconds_count 3.0" in text
