"""Admission control, request terms and first-byte deadlines through the router's HTTP
face, over mock engines (router/app.py with admission.py, terms.py, deadline.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.terms import Terms, terms_of
from tests.unit.test_router import body, rig

URL = "/v1/completions"


async def settle(cond: object, *, tries: int = 200) -> None:
    for _ in range(tries):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


@pytest.mark.parametrize("stream", [False, True])
async def test_deadline_cancels_both_legs_and_answers_504(stream):
    """A decode that stalls: the request is cut at its deadline (not at the router's
    request_timeout_s), both legs' connections closed, the prefill asked to free its KV."""
    stall = MockConfig(role="decode", delay_s=30)
    pslow = MockConfig(role="prefill", engine_id="prefill-0", delay_s=30)
    async with rig("push", decodes=[stall], prefill=pslow) as t, httpx.AsyncClient() as c:
        hs = {"pdctl-deadline-ms": "300"}
        r = await c.post(t.url + URL, json=body(stream=stream), headers=hs, timeout=10)
        assert r.status_code == 504, r.text
        assert r.headers["pdctl-drop-reason"] == "deadline_exceeded"
        assert "deadline" in r.json()["error"]["message"]
        await settle(lambda: t.d.state.in_flight == 0 and t.p.state.in_flight == 0)
        assert t.d.state.cancelled == 1
        assert t.p.state.cancelled == 1
        assert all(u.outstanding == 0 for u in t.router.upstreams)
        (tl,) = t.router.recent()
        assert (tl["outcome"], tl["status"]) == ("error", 504)
        assert any("deadline" in n for n in tl["notes"])
        st = (await c.get(t.url + "/v1/pdctl/state")).json()["admission"]
        assert (st["in_flight"], st["queued"]) == (0, 0)


async def test_deadline_met_streams_on_and_is_not_cut_later():
    slow = MockConfig(role="decode", chunks=6, chunk_delay_s=0.1)
    async with rig("push", decodes=[slow]) as t, httpx.AsyncClient() as c:
        hs = {"pdctl-deadline-ms": "250"}
        async with c.stream("POST", t.url + URL, json=body(stream=True), headers=hs) as r:
            assert r.status_code == 200
            text = (await r.aread()).decode()
        assert text.count("data:") == 7  # six chunks past the deadline, then [DONE]
        assert t.router.recent()[0]["outcome"] == "ok"


async def test_spec_default_deadline_applies_without_a_header():
    stall = MockConfig(role="decode", delay_s=30)
    adm = {"default_deadline_ms": 200}
    async with (
        rig("push", decodes=[stall], router={"admission": adm}) as t,
        httpx.AsyncClient() as c,
    ):
        r = await c.post(t.url + URL, json=body(), timeout=10)
        assert r.status_code == 504


async def test_full_router_sheds_at_once_with_a_reason_and_counts_it():
    slow = MockConfig(role="decode", delay_s=1.0)
    adm = {"decode_in_flight_per_instance": 1, "max_queued": 0}
    async with (
        rig("push", decodes=[slow], router={"admission": adm}) as t,
        httpx.AsyncClient(timeout=10) as c,
    ):
        first = asyncio.create_task(c.post(t.url + URL, json=body()))
        await settle(lambda: t.d.state.in_flight == 1)
        r = await c.post(t.url + URL, json=body(), headers={"pdctl-priority": "batch"})
        assert r.status_code == 429, r.text
        assert r.headers["pdctl-drop-reason"] == "decode_saturated"
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "overloaded_error"
        assert (await first).status_code == 200
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_shed_total{reason="decode_saturated",class="batch"} 1.0' in text
        assert 'pdctl_router_admitted_total{class="standard",queued="false"} 1.0' in text
        # its answer's time from read to sent, as shed at arrival
        arrival = 'pdctl_router_shed_answer_seconds_count{class="batch",when="arrival"}'
        assert f"{arrival} 1.0" in text
        assert t.d.state.received == 1  # the shed request never reached the fleet


async def test_a_request_whose_slo_passes_in_the_queue_is_answered_504_as_a_later_shed():
    """Before the queue's pace is known a request queues; its SLO passing there is a
    504 slo_unreachable, counted as shed after queueing."""
    slow = MockConfig(role="decode", delay_s=1.0)
    adm = {"decode_in_flight_per_instance": 1}
    async with (
        rig("push", decodes=[slow], router={"admission": adm}) as t,
        httpx.AsyncClient(timeout=10) as c,
    ):
        first = asyncio.create_task(c.post(t.url + URL, json=body()))
        await settle(lambda: t.d.state.in_flight == 1)
        hs = {"pdctl-slo-ttft-ms": "100"}
        r = await c.post(t.url + URL, json=body(), headers=hs)
        assert r.status_code == 504, r.text
        assert r.headers["pdctl-drop-reason"] == "slo_unreachable"
        assert (await first).status_code == 200
        text = (await c.get(t.url + "/metrics")).text
        late = 'pdctl_router_shed_answer_seconds_count{class="standard",when="queued"}'
        assert f"{late} 1.0" in text
        assert t.d.state.received == 1


async def test_queued_request_runs_when_room_comes():
    slow = MockConfig(role="decode", delay_s=0.3)
    adm = {"decode_in_flight_per_instance": 1}
    async with (
        rig("push", decodes=[slow], router={"admission": adm}) as t,
        httpx.AsyncClient(timeout=10) as c,
    ):
        rs = await asyncio.gather(*(c.post(t.url + URL, json=body()) for _ in range(3)))
        assert [r.status_code for r in rs] == [200, 200, 200]
        text = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_admitted_total{class="standard",queued="true"} 2.0' in text


async def test_control_changes_admission_at_run_time_and_audits_it(tmp_path):
    async with rig("push") as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/pdctl/admission", json={"max_queued": 7})
        assert r.status_code == 200, r.text
        assert r.json()["admission"]["max_queued"] == 7
        bad = await c.post(t.url + "/v1/pdctl/admission", json={"max_queued": "many"})
        assert bad.status_code == 400
        assert "max_queued" in bad.json()["error"]["message"]
        entries = (await c.get(t.url + "/v1/pdctl/audit")).json()["entries"]
        mine = [e for e in entries if e["action"] == "POST /v1/pdctl/admission"]
        assert [e["result"] for e in mine] == [400, 200]
        assert mine[-1]["detail"]["request"] == {"max_queued": 7}


async def test_control_refuses_admission_changes_when_it_is_off():
    async with rig("push", router={"admission": {"enabled": False}}) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/pdctl/admission", json={"max_queued": 7})
        assert r.status_code == 409
        assert (await c.get(t.url + "/v1/pdctl/state")).json()["admission"] == {"enabled": False}
        assert (await c.post(t.url + URL, json=body())).status_code == 200


@pytest.mark.parametrize(
    ("headers", "extra", "word"),
    [
        ({"pdctl-priority": "urgent"}, {}, "pdctl-priority"),
        ({"pdctl-deadline-ms": "soon"}, {}, "pdctl-deadline-ms"),
        ({"pdctl-slo-ttft-ms": "0"}, {}, "pdctl-slo-ttft-ms"),
        ({}, {"priority": "high"}, "priority"),
    ],
)
async def test_bad_terms_are_refused_naming_them(headers, extra, word):
    async with rig("push") as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + URL, json=body(**extra), headers=headers)
        assert r.status_code == 400
        assert word in r.json()["error"]["message"]
        assert t.d.state.received == 0


def test_terms_of_headers_and_body():
    assert terms_of([], {}) == Terms()
    for prio, klass in ((-5, "interactive"), (0, "standard"), (3, "batch")):
        t = terms_of([], {"priority": prio})
        assert isinstance(t, Terms)
        assert t.klass == klass
    t = terms_of([(b"pdctl-priority", b"Batch"), (b"pdctl-slo-ttft-ms", b"800")], {"priority": -1})
    assert isinstance(t, Terms)
    assert (t.klass, t.slo_s, t.deadline_s, t.queue_limit_s) == ("batch", 0.8, None, 0.8)
    t = terms_of([(b"pdctl-deadline-ms", b"2000")], {}, default_deadline_ms=100)
    assert isinstance(t, Terms)
    assert t.deadline_s == 2.0
    t = terms_of([], {}, default_deadline_ms=100)
    assert isinstance(t, Terms)
    assert t.deadline_s == 0.1
    assert isinstance(terms_of([(b"pdctl-deadline-ms", b"99999999999")], {}), str)
    assert isinstance(terms_of([], {"priority": True}), str)
    assert json.dumps(Terms().klass) == '"standard"'


@pytest.mark.parametrize(
    ("args", "sent"),
    [
        (["--scheduling-policy", "priority"], -1),
        (["--scheduling-policy=priority"], -1),
        ([], None),
        (["--scheduling-policy", "fcfs"], None),
    ],
)
async def test_class_reaches_engines_as_priority_only_where_they_schedule_by_it(args, sent):
    async with rig("push", fleet={"vllm_args": args}) as t, httpx.AsyncClient() as c:
        assert t.app.priority_scheduling is (sent is not None)
        hs = {"pdctl-priority": "interactive"}
        r = await c.post(t.url + URL, json=body(priority=5), headers=hs)
        assert r.status_code == 200, r.text
        r = await c.post(t.url + URL, json=body(), headers=hs)
        assert r.status_code == 200, r.text
        got = [req["body"].get("priority") for req in t.d.state.requests]
        assert got == ([5, sent] if sent is not None else [None, None])
        assert [req["body"].get("priority") for req in t.p.state.requests] == got
