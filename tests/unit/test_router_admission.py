"""Admission control (router/admission.py) on its own: stage limits, the priority queue,
shedding lower classes first, answers with reasons, run-time changes; and the gauges it
reads (router/saturation.py), their names checked against the installed vLLM."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdctl.sdk.router.admission import CLASSES, Admission, Shed, Ticket
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.pace import SPREAD_Z
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.router.saturation import GAUGES, Reading, reading_of
from pdctl.sdk.spec import AdmissionSpec
from pdctl.sdk.spec.router import RouterSpec


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def ups(role: str, n: int) -> list[Upstream]:
    return [Upstream(f"{role}-{i}", role, f"http://127.0.0.1:{9000 + i}", None) for i in range(n)]  # type: ignore[arg-type]


def make(
    prefills: int = 1, decodes: int = 1, share: float = 1.0, **spec: Any
) -> tuple[Admission, Registry, Clock]:
    reg, clock = Registry(), Clock()
    s = AdmissionSpec(scrape_interval_s=0, **spec)
    p, d = ups("prefill", prefills), ups("decode", decodes)
    a = Admission(s, p, d, reg, share=share, clock=clock)
    return a, reg, clock


def tl(prefill_done: float | None = None, first: float | None = None) -> Any:
    return SimpleNamespace(prefill_done=prefill_done, decode_first_byte=first)


def sample(reg: Registry, name: str, *labels: str) -> float:
    for m in reg.metrics:
        if m.name == name:
            snap = m.snapshot()
            for lv, v in snap["samples"]:
                if tuple(lv) == labels:
                    return float(v if not isinstance(v, list) else v[-1])
    raise AssertionError(f"{name}{labels} not exported")


async def test_admits_up_to_the_prefill_stage_limit_then_queues():
    a, reg, _ = make(prefill_in_flight_per_instance=2, max_queue_wait_s=5)
    t1, t2 = await a.enter("standard"), await a.enter("standard")
    assert isinstance(t1, Ticket)
    assert isinstance(t2, Ticket)
    third = asyncio.create_task(a.enter("standard"))
    await asyncio.sleep(0.05)
    assert not third.done()
    assert a.state()["queued"] == 1
    t1.tl = tl(prefill_done=0.1)  # its prefill answered: its prefill-stage place is free
    got = await asyncio.wait_for(third, 1)
    assert isinstance(got, Ticket)
    assert a.state()["in_flight"] == 3
    assert a.state()["in_prefill"] == 2
    assert sample(reg, "pdctl_router_admitted_total", "standard", "true") == 1
    assert sample(reg, "pdctl_router_admitted_total", "standard", "false") == 2


async def test_decode_stage_limit_frees_on_release_exactly_once():
    a, _, _ = make(decode_in_flight_per_instance=1, max_queue_wait_s=5)
    t1 = await a.enter("batch")
    assert isinstance(t1, Ticket)
    t1.tl = tl(first=0.1)
    waiting = asyncio.create_task(a.enter("batch"))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    assert a.room() == "decode_saturated"
    t1.release()
    t1.release()  # a second release gives nothing back twice
    t2 = await asyncio.wait_for(waiting, 1)
    assert isinstance(t2, Ticket)
    assert a.state()["in_flight"] == 1
    with t2:
        pass
    assert a.state()["in_flight"] == 0


async def test_full_queue_answers_429_at_once_with_reason_and_retry_after():
    a, reg, _ = make(prefill_in_flight_per_instance=1, max_queued=1)
    assert isinstance(await a.enter("standard"), Ticket)
    queued = asyncio.create_task(a.enter("standard"))
    await asyncio.sleep(0.01)
    shed = await asyncio.wait_for(a.enter("standard"), 0.05)  # at once, not after a wait
    assert isinstance(shed, Shed)
    assert (shed.status, shed.reason) == (429, "prefill_saturated")
    hs = dict(shed.headers())
    assert hs[b"pdctl-drop-reason"] == b"prefill_saturated"
    assert int(hs[b"retry-after"]) >= 1
    assert int(hs[b"pdctl-retry-after-ms"]) > 0
    assert "saturated" in shed.message
    assert sample(reg, "pdctl_router_shed_total", "prefill_saturated", "standard") == 1
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert a.state()["queued"] == 0


async def test_a_higher_class_sheds_a_lower_one_never_the_reverse():
    a, reg, _ = make(prefill_in_flight_per_instance=1, max_queued=1)
    held = await a.enter("interactive")
    assert isinstance(held, Ticket)
    batch = asyncio.create_task(a.enter("batch"))
    await asyncio.sleep(0.01)
    inter = asyncio.create_task(a.enter("interactive"))
    out = await asyncio.wait_for(batch, 0.05)  # shed at once to make room
    assert isinstance(out, Shed)
    assert out.status == 429
    assert sample(reg, "pdctl_router_shed_total", "prefill_saturated", "batch") == 1
    # the queue holds the interactive request now: a batch one cannot push it out
    late = await asyncio.wait_for(a.enter("batch"), 0.05)
    assert isinstance(late, Shed)
    assert not inter.done()
    held.release()
    assert isinstance(await asyncio.wait_for(inter, 1), Ticket)


async def test_queue_admits_the_highest_class_first_then_the_oldest():
    a, _, _ = make(decode_in_flight_per_instance=1, max_queue_wait_s=5)
    held = await a.enter("standard")
    assert isinstance(held, Ticket)
    order: list[str] = []

    async def one(k: str, tag: str) -> None:
        t = await a.enter(k)
        assert isinstance(t, Ticket)
        order.append(tag)
        await asyncio.sleep(0.01)
        t.release()

    tasks = []
    for k, tag in (("batch", "b1"), ("standard", "s1"), ("interactive", "i1"), ("standard", "s2")):
        tasks.append(asyncio.create_task(one(k, tag)))
        await asyncio.sleep(0.005)
    held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["i1", "s1", "s2", "b1"]


async def test_queue_wait_and_deadline_answers():
    a, reg, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=0.05)
    assert isinstance(await a.enter("standard"), Ticket)
    out = await a.enter("standard")
    assert isinstance(out, Shed)
    assert (out.status, out.reason) == (503, "decode_saturated")
    # a deadline nearer than the queue wait: shed at it as slo_unreachable (504)
    a.max_queue_wait_s = 10
    out = await asyncio.wait_for(a.enter("interactive", deadline=clock.t + 0.03), 1)
    assert isinstance(out, Shed)
    assert (out.status, out.reason) == (504, "slo_unreachable")
    assert sample(reg, "pdctl_router_shed_total", "slo_unreachable", "interactive") == 1
    assert a.state()["queued"] == 0


async def test_every_instance_of_a_stage_drained_is_draining():
    a, _, _ = make(decodes=2)
    for u in a.decodes:
        u.drained = True
    out = await a.enter("standard")
    assert isinstance(out, Shed)
    assert (out.status, out.reason) == (503, "draining")
    a.decodes[0].drained = False
    assert isinstance(await a.enter("standard"), Ticket)


async def test_limits_are_per_worker_share_and_scale_with_healthy_instances():
    a, _, _ = make(decodes=2, share=0.5, decode_in_flight_per_instance=3)
    # 3 per decode x 2 decodes = 6 for the router; this worker of 2 holds 3
    ts = [await a.enter("standard") for _ in range(3)]
    assert all(isinstance(t, Ticket) for t in ts)
    for t in ts:
        assert isinstance(t, Ticket)
        t.tl = tl(first=0.1)
    assert a.room() == "decode_saturated"
    a.decodes[1].healthy = False  # one decode down: half the room
    a.limits["decode"] = 6  # changed at run time: 6 x 1 healthy x 0.5 = 3, all held
    assert a.room() == "decode_saturated"
    assert isinstance(ts[0], Ticket)
    ts[0].release()
    assert a.room() is None
    a.decodes[1].healthy = True  # 6 x 2 x 0.5 = 6
    assert a.state()["in_flight"] == 2
    assert a.room() is None


async def test_stale_gauges_are_unknown_never_overload():
    a, _, clock = make(max_waiting_per_instance=4, max_kv_usage=0.9, stale_after_s=5)
    sat = a.saturation
    p, d = a.prefills[0], a.decodes[0]
    sat.readings[d.name] = Reading(waiting=10, running=3, kv_usage=0.5, at=clock.t)
    assert a.room() == "decode_saturated"
    clock.t += 6  # the reading went stale: unknown, so not saturated
    assert a.room() is None
    assert d.name in a.state()["unknown"]
    sat.readings[p.name] = Reading(waiting=0, running=1, kv_usage=0.95, at=clock.t)
    assert a.room() == "prefill_saturated"
    p.healthy = False  # an ineligible instance does not count: none left is not overload
    assert a.room() is None


async def test_one_instance_with_room_keeps_the_stage_open():
    a, _, clock = make(decodes=2, max_waiting_per_instance=4)
    d0, d1 = a.decodes
    a.saturation.readings[d0.name] = Reading(9, 1, 0.1, clock.t)
    a.saturation.readings[d1.name] = Reading(1, 1, 0.1, clock.t)
    assert a.room() is None
    a.saturation.readings[d1.name] = Reading(4, 1, 0.1, clock.t)
    assert a.room() == "decode_saturated"


async def test_run_time_changes_are_checked_and_applied():
    a, _, _ = make()
    assert a.apply({"max_queued": 3, "max_kv_usage": 0.5, "max_queue_wait_s": 2}) is None
    st = a.state()
    assert (st["max_queued"], st["max_kv_usage"], st["max_queue_wait_s"]) == (3, 0.5, 2.0)
    assert a.apply({"decode_in_flight_per_instance": 7, "max_waiting_per_instance": 0}) is None
    assert a.state()["decode_in_flight_per_instance"] == 7
    for bad, word in (
        ({"max_queued": -1}, "max_queued"),
        ({"max_queued": True}, "max_queued"),
        ({"max_kv_usage": 2}, "max_kv_usage"),
        ({"max_kv_usage": "x"}, "max_kv_usage"),
        ({"max_queue_wait_s": 0}, "max_queue_wait_s"),
        ({"prefill_in_flight_per_instance": 0}, "prefill_in_flight_per_instance"),
        ({"queue": 3}, "unknown admission setting"),
        ({}, "none given"),
    ):
        refused = a.apply(bad)
        assert refused is not None, bad
        assert refused[0] == 400, bad
        assert word in refused[1], bad
    assert a.state()["max_queued"] == 3  # nothing of a refused change applied


async def test_raising_a_limit_admits_the_queue_at_once():
    a, _, _ = make(decode_in_flight_per_instance=1, max_queue_wait_s=5)
    assert isinstance(await a.enter("standard"), Ticket)
    w = asyncio.create_task(a.enter("standard"))
    await asyncio.sleep(0.01)
    assert a.apply({"decode_in_flight_per_instance": 2}) is None
    assert isinstance(await asyncio.wait_for(w, 0.5), Ticket)


def test_metrics_are_exported_from_zero():
    _, reg, _ = make()
    text = reg.expose().decode()
    for k in CLASSES:
        assert f'pdctl_router_shed_total{{reason="decode_saturated",class="{k}"}} 0.0' in text
        assert f'pdctl_router_queue_depth{{class="{k}"}} 0.0' in text
    assert 'pdctl_router_stage_in_flight{stage="prefill"} 0.0' in text
    assert "pdctl_router_loop_lag_seconds_count 0.0" in text


def test_spec_defaults_and_errors_name_the_field():
    s = RouterSpec()
    assert s.admission.enabled
    assert s.admission.max_queued == 512
    with pytest.raises(ValueError, match="stale_after_s"):
        AdmissionSpec(scrape_interval_s=5, stale_after_s=2)
    with pytest.raises(ValueError, match="max_kv_usage"):
        RouterSpec.model_validate({"admission": {"max_kv_usage": 1.5}})
    with pytest.raises(ValueError, match="max_queud"):
        RouterSpec.model_validate({"admission": {"max_queud": 1}})


def test_reading_of_vllm_metrics_text():
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
        "garbage line here\n"
    )
    r = reading_of(text, 1.0)
    assert (r.waiting, r.running, r.kv_usage, r.at) == (5.0, 7.0, 0.75, 1.0)
    empty = reading_of("not prometheus at all", 2.0)
    assert (empty.waiting, empty.kv_usage) == (None, None)


def test_gauge_names_are_the_installed_vllms():
    """vllm/v1/metrics/loggers.py (PrometheusStatLogger) names the gauges we read."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.fail("vllm is not installed in the test environment")
    src = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    for name in GAUGES:
        assert f'name="{name}"' in src, name


async def test_a_stage_with_no_eligible_instance_is_not_overload():
    a, _, _ = make(decode_in_flight_per_instance=1)
    t = await a.enter("standard")
    assert isinstance(t, Ticket)
    assert a.room() == "decode_saturated"
    a.decodes[0].healthy = False  # the instance set waits for one and answers 503 itself
    assert a.room() is None
    assert isinstance(await a.enter("standard"), Ticket)


async def paced(a: Admission, clock: Clock, first: str = "interactive") -> Ticket:
    """Teach ``a`` (one place in all) its pace: a standard request holds the place, one
    of class ``first`` queues for 2 s of the clock and takes it when it frees. Returns
    the ticket now holding the place."""
    held = await a.enter("standard")
    assert isinstance(held, Ticket)
    # before the pace is known nothing is predicted: with no class above it queued, it queues
    queued = asyncio.create_task(a.enter(first, deadline=clock.t + 0.5))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1
    clock.t += 2.0
    held.release()
    got = await asyncio.wait_for(queued, 1)
    assert isinstance(got, Ticket)
    return got


async def test_a_request_predicted_to_miss_its_deadline_is_shed_at_arrival():
    """Once the pace is seen, a request that would queue is queued only when its
    predicted wait, plus its predicted time to a first byte once placed, times
    (1 + slo_margin), is within its time left; else 503 slo_unreachable at once, the
    prediction named."""
    a, reg, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=10)
    holder = await paced(a, clock)
    wait = a.pace.wait_s(CLASSES.index("interactive"), 0)
    assert wait is not None
    assert 0 < wait < 10
    margin = 1 + a.spec.slo_margin
    out = await a.enter("interactive", deadline=clock.t + wait * margin * 0.95)
    assert isinstance(out, Shed)
    assert (out.status, out.reason, out.queued) == (503, "slo_unreachable", False)
    assert "predicted queue wait" in out.message
    assert sample(reg, "pdctl_router_shed_total", "slo_unreachable", "interactive") == 1
    assert a.state()["queued"] == 0
    # the time to a first byte once placed counts as well
    left = wait * margin * 1.05
    out = await a.enter("interactive", deadline=clock.t + left, service_s=wait)
    assert isinstance(out, Shed)
    assert "ms to a first byte" in out.message
    fits = asyncio.create_task(a.enter("interactive", deadline=clock.t + left))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1  # predicted within it: queued
    holder.release()
    t = await asyncio.wait_for(fits, 1)
    assert isinstance(t, Ticket)
    t.release()


async def test_higher_classes_arriving_during_the_wait_shed_lower_classes_first():
    """A request's wait counts the places higher classes take meanwhile: with the same
    time left, an interactive request is queued while a standard one is shed, and a
    batch one is shed with time a standard one would be queued with."""
    a, _, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=10)
    holder = await paced(a, clock)
    # a standard request let in while requests queue (one admitted at once, with no queue,
    # overtakes no one and counts for nothing): the batch class's wait counts it
    extra = asyncio.create_task(a.enter("standard"))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1
    extra.cancel()
    with pytest.raises(asyncio.CancelledError):
        await extra
    ranks = {k: CLASSES.index(k) for k in CLASSES}
    inter, std = a.pace.wait_s(ranks["interactive"], 0), a.pace.wait_s(ranks["standard"], 0)
    assert inter is not None
    assert std is not None
    batch = a.pace.wait_s(ranks["batch"], 0)
    assert batch is not None
    # the interactive requests taking places slow a standard one, both a batch one
    assert inter < std < batch
    m = 1 + a.spec.slo_margin
    out = await a.enter("batch", deadline=clock.t + std * m * 1.05)  # a standard one fits
    assert isinstance(out, Shed)
    assert out.reason == "slo_unreachable"
    left = (inter + std) / 2 * m
    out = await a.enter("standard", deadline=clock.t + left)
    assert isinstance(out, Shed)
    assert out.reason == "slo_unreachable"
    queued = asyncio.create_task(a.enter("interactive", deadline=clock.t + left))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1
    # one interactive request queued ahead: the next one's wait is for two places
    two = a.pace.wait_s(ranks["interactive"], 1)
    assert two is not None
    rates = a.pace.rates(ranks["interactive"])
    assert rates is not None
    mu, lam = rates
    assert lam == 0  # no class above it

    def wait(n: int) -> float:  # n places at mu, the rates known over seen_s seconds
        return (n + SPREAD_Z * math.sqrt(n * (1 + n / (mu * a.pace.seen_s)))) / mu

    assert inter == pytest.approx(wait(1))
    assert two == pytest.approx(wait(2))
    holder.release()
    t = await asyncio.wait_for(queued, 1)
    assert isinstance(t, Ticket)
    t.release()


async def test_a_request_shed_for_its_prediction_makes_no_room_first():
    """At a full queue, a higher-class request predicted to miss its deadline is shed
    without shedding the lower one queued; one predicted to meet it takes its place
    (429 to the lower one, a shed after queueing)."""
    a, _, clock = make(decode_in_flight_per_instance=1, max_queued=1, max_queue_wait_s=60)
    holder = await paced(a, clock)
    batch = asyncio.create_task(a.enter("batch"))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1
    wait = a.pace.wait_s(CLASSES.index("interactive"), 0)
    assert wait is not None
    out = await a.enter("interactive", deadline=clock.t + wait / 2)
    assert isinstance(out, Shed)
    assert out.reason == "slo_unreachable"
    assert not batch.done()  # still queued
    inter = asyncio.create_task(a.enter("interactive", deadline=clock.t + wait * 2))
    shed = await asyncio.wait_for(batch, 1)
    assert isinstance(shed, Shed)
    assert (shed.status, shed.queued) == (429, True)
    holder.release()
    t = await asyncio.wait_for(inter, 1)
    assert isinstance(t, Ticket)
    t.release()


async def test_a_predicted_wait_past_max_queue_wait_is_shed_at_arrival():
    a, reg, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=10)
    holder = await paced(a, clock)
    wait = a.pace.wait_s(CLASSES.index("standard"), 0)
    assert wait is not None
    a.max_queue_wait_s = wait  # the margin puts the predicted wait past it
    out = await a.enter("standard")  # no deadline: max_queue_wait_s is its limit
    assert isinstance(out, Shed)
    assert (out.status, out.reason, out.queued) == (503, "decode_saturated", False)
    assert "max_queue_wait_s" in out.message
    assert sample(reg, "pdctl_router_shed_total", "decode_saturated", "standard") == 1
    holder.release()


async def test_a_queue_where_no_place_frees_teaches_its_pace():
    """A batch request that waited out its deadline in the queue (504, shed after
    queueing) is evidence enough: with no place freed in 5 s, the next batch request with
    as little time is shed at arrival."""
    a, reg, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=10)
    held = await a.enter("standard")
    assert isinstance(held, Ticket)
    waiting = asyncio.create_task(a.enter("batch", deadline=clock.t + 0.05))
    await asyncio.sleep(0)
    clock.t += 5.0  # the admission's clock: it waited 5 s for its place
    out = await asyncio.wait_for(waiting, 1)
    assert isinstance(out, Shed)
    assert (out.status, out.queued) == (504, True)
    a.answered(out, 5.0)
    nxt = await a.enter("batch", deadline=clock.t + 1.0)
    assert isinstance(nxt, Shed)
    assert (nxt.status, nxt.reason, nxt.queued) == (503, "slo_unreachable", False)
    a.answered(nxt, 0.002)
    assert sample(reg, "pdctl_router_shed_answer_seconds", "batch", "queued") == 1
    assert sample(reg, "pdctl_router_shed_answer_seconds", "batch", "arrival") == 1
    held.release()


async def test_slo_routing_off_queues_whatever_the_predicted_wait():
    a, _, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=10, slo_routing=False)
    held = await a.enter("standard")
    assert isinstance(held, Ticket)
    queued = asyncio.create_task(a.enter("standard"))
    await asyncio.sleep(0)
    clock.t += 2.0
    held.release()
    got = await asyncio.wait_for(queued, 1)
    assert isinstance(got, Ticket)
    late = asyncio.create_task(a.enter("batch", deadline=clock.t + 1.0))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1  # queued, not shed
    got.release()
    out = await asyncio.wait_for(late, 1)
    assert isinstance(out, Ticket)
    out.release()


async def test_each_class_keeps_a_share_of_the_queue_from_the_classes_below():
    """A lower class joins the queue only while it holds fewer than its share (a quarter
    of the queue kept per class above it); a higher class is never refused while a lower
    one waits, and a lower one is shed after queueing (429) only when the whole queue is
    full."""
    from pdctl.sdk.router.arrival import share_of

    assert [share_of(8, r) for r in range(3)] == [8, 6, 4]
    assert [share_of(3, r) for r in range(3)] == [3, 3, 3]  # a small queue keeps none
    a, reg, _ = make(decode_in_flight_per_instance=1, max_queued=8, max_queue_wait_s=10)
    held = await a.enter("standard")
    assert isinstance(held, Ticket)
    waiting: list[asyncio.Task[Ticket | Shed]] = []

    async def queue(klass: str) -> asyncio.Task[Ticket | Shed]:
        t = asyncio.create_task(a.enter(klass))
        await asyncio.sleep(0)
        assert not t.done()
        waiting.append(t)
        return t

    batches = [await queue("batch") for _ in range(4)]
    out = await asyncio.wait_for(a.enter("batch"), 0.05)  # its share is full: at once
    assert isinstance(out, Shed)
    assert (out.status, out.reason, out.queued) == (429, "decode_saturated", False)
    assert "4 kept for higher classes" in out.message
    assert dict(out.headers())[b"pdctl-shed-when"] == b"arrival"
    for _ in range(3):  # past the standard share too: a batch request still waits
        await queue("standard")
    await queue("interactive")
    assert a.state()["queued"] == 8
    assert not any(b.done() for b in batches)  # nothing shed after queueing so far
    last = await queue("interactive")  # the whole queue is full: the newest batch goes
    evicted = await asyncio.wait_for(batches[-1], 0.05)
    assert isinstance(evicted, Shed)
    assert (evicted.status, evicted.queued) == (429, True)
    assert dict(evicted.headers())[b"pdctl-shed-when"] == b"queued"
    assert not last.done()
    assert sample(reg, "pdctl_router_shed_total", "decode_saturated", "batch") == 2
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert a.state()["queued"] == 0
    held.release()


async def test_a_higher_class_at_its_own_share_with_nothing_lower_is_refused_at_arrival():
    """With only its own class and higher queued, a request past its share is answered
    429 at arrival (the places above its share are the higher classes')."""
    a, _, _ = make(decode_in_flight_per_instance=1, max_queued=4, max_queue_wait_s=10)
    held = await a.enter("interactive")
    assert isinstance(held, Ticket)
    waiting = [asyncio.create_task(a.enter("standard")) for _ in range(3)]
    await asyncio.sleep(0)
    assert a.state()["queued"] == 3  # share_of(4, 1) == 3
    out = await asyncio.wait_for(a.enter("standard"), 0.05)
    assert isinstance(out, Shed)
    assert (out.status, out.queued) == (429, False)
    inter = asyncio.create_task(a.enter("interactive"))  # the place kept for it
    await asyncio.sleep(0)
    assert a.state()["queued"] == 4
    assert not any(t.done() for t in waiting)
    for t in (*waiting, inter):
        t.cancel()
    await asyncio.gather(*waiting, inter, return_exceptions=True)
    held.release()


async def test_before_the_pace_is_known_a_lower_class_overtaken_is_shed_at_arrival():
    """At the onset of overload the pace is unknown: the top class queues, but once a
    higher class is queued a lower one that would wait behind it is answered at once
    (503 slo_unreachable with a deadline), never after queueing — unless a lower class
    than it already waits."""
    a, reg, clock = make(decode_in_flight_per_instance=1, max_queue_wait_s=10)
    held = await a.enter("standard")
    assert isinstance(held, Ticket)
    batch = asyncio.create_task(a.enter("batch", deadline=clock.t + 10))
    await asyncio.sleep(0)
    inter = asyncio.create_task(a.enter("interactive", deadline=clock.t + 1.5))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 2  # nothing predicted yet: both queue
    std = asyncio.create_task(a.enter("standard", deadline=clock.t + 3))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 3  # overtaken, but a batch request waits below it
    late = await asyncio.wait_for(a.enter("batch", deadline=clock.t + 10), 0.05)
    assert isinstance(late, Shed)
    assert (late.status, late.reason, late.queued) == (503, "slo_unreachable", False)
    assert "cannot be predicted yet" in late.message
    assert sample(reg, "pdctl_router_shed_total", "slo_unreachable", "batch") == 1
    for t in (batch, inter, std):
        t.cancel()
    await asyncio.gather(batch, inter, std, return_exceptions=True)
    held.release()


async def test_at_the_onset_a_lower_class_behind_higher_ones_filling_the_fleet_is_shed():
    """An idle fleet filled at once by interactive requests: the next batch request has
    no room, nothing has queued yet, but higher classes took places faster than they
    freed: it is answered at once (503) instead of queued on a promise nothing backs.
    Where places free as fast as they are taken, it queues as before."""
    a, reg, clock = make(decode_in_flight_per_instance=2, max_queue_wait_s=10)
    held = [await a.enter("interactive") for _ in range(2)]
    assert all(isinstance(t, Ticket) for t in held)
    late = await asyncio.wait_for(a.enter("batch", deadline=clock.t + 10), 0.05)
    assert isinstance(late, Shed)
    assert (late.status, late.reason, late.queued) == (503, "slo_unreachable", False)
    assert sample(reg, "pdctl_router_shed_total", "slo_unreachable", "batch") == 1
    for _ in range(10):  # a light, steady load: each place freed is taken again
        clock.t += 0.1
        held.pop(0).release()  # type: ignore[union-attr]
        t = await a.enter("interactive")
        assert isinstance(t, Ticket)
        held.append(t)
    waiting = asyncio.create_task(a.enter("batch", deadline=clock.t + 10))
    await asyncio.sleep(0)
    assert a.state()["queued"] == 1
    held.pop(0).release()  # type: ignore[union-attr]
    assert isinstance(await asyncio.wait_for(waiting, 1), Ticket)
