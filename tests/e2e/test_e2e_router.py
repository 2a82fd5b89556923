"""pdctl's router on a real vLLM-CPU push fleet: exact outputs in push (concurrent) and
push-sequential modes, real KV through NIXL, streaming, a decode killed mid-stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.fleet import Fleet, read_state
from pdctl.sdk.fleet.procs import cpu_seconds, instance_pids
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.metrics.derive import Scrape
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.metrics.promtext import parse_text
from pdctl.sdk.metrics.rendezvous import Rendezvous
from pdctl.sdk.sse import DONE, EventParser
from tests.e2e.conftest import WORDS, demo_spec, extra_router, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-router"
PROMPTS = [
    " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8 + i)) + f" #{i}" for i in range(16)
]
KV = ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"})


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    yield from running_fleet(demo_spec(tiny_model, NAME)[0])


def router_url(f: Fleet) -> str:
    return f.fleet.router_url


def urls(f: Fleet) -> tuple[str, str]:
    p, d = f.fleet.plan.instances
    return p.url, d.url


def counters(f: Fleet) -> tuple[float, float]:
    """(NIXL bytes moved, decode prompt tokens served from transferred KV). The WRITE
    initiator records the bytes: prefill in push mode, decode in pull mode."""
    p, d = urls(f)
    pm = parse(httpx.get(p + "/metrics").text)
    dm = parse(httpx.get(d + "/metrics").text)
    moved = sum(total(m, "vllm:nixl_bytes_transferred_sum") or 0.0 for m in (pm, dm))
    return moved, total(dm, *KV) or 0.0


def body(prompt: str, **kw: object) -> dict[str, object]:
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        **kw,
    }


def check_exact(f: Fleet, url: str) -> None:
    _, d = urls(f)
    b0, t0 = counters(f)
    with httpx.Client(timeout=120) as c:
        for prompt in PROMPTS:
            local = c.post(d + "/v1/completions", json=body(prompt))
            routed = c.post(url + "/v1/completions", json=body(prompt))
            assert routed.status_code == 200, routed.text
            assert routed.json()["choices"][0]["text"] == local.json()["choices"][0]["text"]
    b1, t1 = counters(f)
    assert b1 > b0, "no KV bytes moved through NIXL"
    assert t1 - t0 >= 16, "decode took no prompt tokens from KV transfer"


def test_push_concurrent_outputs_are_exact(fleet: Fleet):
    check_exact(fleet, router_url(fleet))
    hist = httpx.get(router_url(fleet) + "/v1/pdctl/requests?limit=16").json()
    assert hist["mode"] == "push"
    # concurrent: decode was sent before prefill finished, on every request
    assert all(r["decode_sent_ms"] < r["prefill_done_ms"] for r in hist["requests"])


@pytest.fixture(scope="module")
def sequential_router(fleet: Fleet, state_root: Path) -> Iterator[str]:
    with extra_router(fleet.fleet.spec, state_root, "sequential", mode="push-sequential") as url:
        yield url


def test_push_sequential_outputs_are_exact(fleet: Fleet, sequential_router: str):
    check_exact(fleet, sequential_router)
    hist = httpx.get(sequential_router + "/v1/pdctl/requests?limit=16").json()
    assert hist["mode"] == "push-sequential"
    assert all(r["decode_sent_ms"] >= r["prefill_done_ms"] for r in hist["requests"])


# ---------------------------------------------------------------- rendezvous telemetry


def rendezvous(url: str, role: str) -> Rendezvous:
    samples, bad = parse_text(httpx.get(url + "/metrics").text, (rv.PREFIX,))
    assert not bad
    r = rv.rendezvous_of(Scrape(samples, 0.0), None, role)
    assert r is not None, f"no pdctl: rendezvous series on {url}/metrics"
    return r


def routed_batch(url: str, n: int = 8, concurrency: int = 1) -> None:
    """``n`` requests through a router, ``concurrency`` at a time. One at a time, decode
    is idle when each arrives and registers at once; while decode is busy stepping other
    requests, its registration waits for the next step boundary and a tiny model's
    prefill often wins the race (2 of 4 at concurrency 2 on a 2-core machine)."""

    async def go() -> None:
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=120) as c:

            async def one(i: int) -> httpx.Response:
                async with sem:
                    return await c.post(url + "/v1/completions", json=body(PROMPTS[i]))

            rs = await asyncio.gather(*(one(i) for i in range(n)))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]

    asyncio.run(go())


def settled(f: Fleet, timeout_s: float = 15.0) -> tuple[Rendezvous, Rendezvous]:
    """Both sides' figures once every waiting/in-flight gauge is back to 0."""
    p, d = urls(f)
    deadline = time.monotonic() + timeout_s
    while True:
        rp, rd = rendezvous(p, "prefill"), rendezvous(d, "decode")
        queues = (
            rp.registrations_waiting,
            rp.prefills_waiting,
            rp.writes_in_flight,
            rd.awaiting_notifications,
        )
        if all(q == 0 for q in queues) or time.monotonic() > deadline:
            assert all(q == 0 for q in queues), f"queues did not drain: {queues}"
            return rp, rd
        time.sleep(0.5)


def test_rendezvous_concurrent_dispatch_registers_first(fleet: Fleet):
    p, d = urls(fleet)
    before_p, before_d = rendezvous(p, "prefill"), rendezvous(d, "decode")
    routed_batch(router_url(fleet))
    after_p, after_d = settled(fleet)
    reg_first = after_p.matches_registration_first - before_p.matches_registration_first
    pre_first = after_p.matches_prefill_first - before_p.matches_prefill_first
    assert reg_first + pre_first == 8
    assert reg_first > pre_first, (reg_first, pre_first)
    assert after_p.match_wait.count - before_p.match_wait.count == 8
    assert after_p.match_to_write_done.count - before_p.match_to_write_done.count == 8
    assert (after_p.bytes_pushed or 0) > (before_p.bytes_pushed or 0)
    assert (after_d.registrations_sent or 0) - (before_d.registrations_sent or 0) == 8
    assert after_d.registration_to_notified.count - before_d.registration_to_notified.count == 8
    assert after_p.expired == before_p.expired
    assert after_d.receive_failures == 0


def test_rendezvous_sequential_dispatch_is_all_prefill_first(fleet: Fleet, sequential_router: str):
    p, _ = urls(fleet)
    before = rendezvous(p, "prefill")
    routed_batch(sequential_router)
    after, _ = settled(fleet)
    assert after.matches_prefill_first - before.matches_prefill_first == 8
    assert after.matches_registration_first == before.matches_registration_first


def test_idle_pair_stays_off_the_cpu(fleet: Fleet, state_root: Path):
    """The connector's CPU knobs (on in the demo spec): no busy-polling NIXL progress
    thread, so an idle 1P1D pair uses a small fraction of one core."""
    rec = read_state(state_root / NAME)
    assert rec is not None
    pids = instance_pids([i.shepherd_pid for i in rec.instances])
    assert pids
    time.sleep(2)
    c0, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(5)
    share = (cpu_seconds(pids) - c0) / (time.monotonic() - t0)
    assert share < 0.10, f"idle pair used {share:.0%} of a core"


def test_streaming_gives_the_same_text(fleet: Fleet):
    url = router_url(fleet)
    with httpx.Client(timeout=120) as c:
        whole = c.post(url + "/v1/completions", json=body(PROMPTS[3])).json()
        text = ""
        with c.stream("POST", url + "/v1/completions", json=body(PROMPTS[3], stream=True)) as r:
            assert r.status_code == 200
            parser = EventParser()
            for data in r.iter_bytes():
                for event in parser.feed(data):
                    if event.data != DONE:
                        text += json.loads(event.data)["choices"][0]["text"]
    assert text == whole["choices"][0]["text"]


def monitor_for(f: Fleet) -> FleetMonitor:
    return FleetMonitor.for_fleet(f.fleet.spec, f.fleet.plan, window_s=600)


def test_monitor_sees_ttft_and_kv_moved(fleet: Fleet):
    """After the traffic above, the metrics stream shows it: TTFT on decode, KV bytes
    pushed by prefill, the router's pairs, no alert."""
    snap = asyncio.run(monitor_for(fleet).poll())
    p, d = snap.instance("prefill-0"), snap.instance("decode-0")
    assert (p.health, d.health, snap.instance("router").health) == ("UP", "UP", "UP")
    assert d.ttft.count > 0
    assert d.ttft.p50 is not None
    assert d.ttft.p50 > 0
    assert (p.transfers.bytes_total or 0) > 0
    assert d.prompt_tokens_by_source["external_kv_transfer"] > 0
    assert snap.router is not None
    assert snap.router["mode"] == "push"
    assert any(pr.prefill == "prefill-0" and pr.decode == "decode-0" for pr in snap.pairs)
    assert snap.alerts == ()


def test_decode_killed_mid_stream(fleet: Fleet, state_root: Path):
    url = router_url(fleet)
    rec = read_state(state_root / NAME)
    assert rec is not None
    shepherd = rec.instance("decode-0").shepherd_pid
    api = int(Path(f"/proc/{shepherd}/task/{shepherd}/children").read_text().split()[0])
    events: list[str] = []
    with httpx.Client(timeout=120) as c:
        with c.stream(
            "POST", url + "/v1/completions", json=body(PROMPTS[0], stream=True, max_tokens=900)
        ) as r:
            assert r.status_code == 200
            parser = EventParser()
            for data in r.iter_bytes():
                for event in parser.feed(data):
                    events.append(event.data)
                    if len(events) == 3:
                        os.kill(api, signal.SIGKILL)
        # a clean end for the client: an OpenAI-style error event, then [DONE]
        assert events[-1] == DONE
        err = json.loads(events[-2])
        assert err["error"]["code"] == 502
        # the router itself is fine: it answers, and says no decode is available
        for _ in range(50):
            h = c.get(url + "/health")
            if h.status_code == 503:
                break
            time.sleep(0.1)
        assert h.json()["status"] == "no healthy decode instance"
        snap = asyncio.run(monitor_for(fleet).poll())
        assert snap.instance("decode-0").health == "DOWN"
        assert ("PA006", "decode-0") in {(a.code, a.subject) for a in snap.alerts}
        assert "pdctl_router_requests_total" in c.get(url + "/metrics").text
        fleet.restart("decode-0")
        for _ in range(100):
            if c.get(url + "/health").status_code == 200:
                break
            time.sleep(0.1)
        again = c.post(url + "/v1/completions", json=body(PROMPTS[1]))
        assert again.status_code == 200
