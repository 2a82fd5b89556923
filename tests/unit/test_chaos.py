"""The chaos suite's pieces against an in-process fake instance (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from pdctl.sdk import chaos
from pdctl.sdk.chaos import kills, sidechannel


def metrics(kv: float, running: float = 0.0) -> str:
    return (
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}\n'
        f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0\n'
    )


def test_answers_classify_what_a_client_saw():
    report = chaos.FaultReport(
        "storm",
        [
            chaos.Answer(200, 1.0),
            chaos.Answer(400, 0.1),
            chaos.Answer(None, 0.5, cut=True),
            chaos.Answer(502, 2.0),
            chaos.Answer(None, 9.0, error="ReadTimeout"),
        ],
    )
    assert report.statuses == {"200": 1, "400": 1, "502": 1, "cut": 1, "error": 1}
    assert report.lost == 2  # the 502 and the connection that failed; a cut is the client's
    assert report.answer_p100_s == 9.0
    assert report.as_dict()["lost"] == 2


async def test_kv_back_to_idle_waits_for_the_fresh_value():
    usage = iter([0.2, 0.2, 0.0])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=metrics(next(usage, 0.0)))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        back, last = await chaos.kv_back_to_idle(c, {"http://d": 0.0}, wait_s=5, poll_s=0)
    assert back["http://d"] is not None
    assert last == {"http://d": 0.0}


async def test_kv_still_held_is_reported_as_not_back():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=metrics(0.1))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        back, last = await chaos.kv_back_to_idle(c, {"http://p": 0.0}, wait_s=0.05, poll_s=0.01)
    assert back == {"http://p": None}
    assert last == {"http://p": 0.1}


async def test_storm_cuts_clients_and_bad_input_asks_past_the_context():
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(400 if body["max_tokens"] > 1024 else 200, text="{}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        bad = await chaos.bad_input(c, "http://r", 3, max_model_len=1024)
        storm = await chaos.disconnect_storm(c, "http://r", 4, rng=random.Random(1), max_cut_s=1)
    assert [a.status for a in bad] == [400, 400, 400]
    assert all(a.status == 200 or a.cut for a in storm)
    assert all(b["stream"] for b in seen[3:])


async def test_a_stream_that_ends_with_an_error_event_is_a_clear_error():
    def handler(request: httpx.Request) -> httpx.Response:
        text = 'data: {"id":"1","choices":[]}\n\ndata: {"error": {"code": 502}}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=text)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        streamed = await chaos.send(c, "http://r", chaos.completion("x", 4, stream=True))
        whole = await chaos.send(c, "http://r", chaos.completion("x", 4))
    assert streamed.stream_error
    assert not whole.stream_error  # only a stream's events say how it ended
    report = chaos.FaultReport("kill", [streamed, chaos.Answer(500, 3.0)], fault_at_s=1.0)
    assert report.statuses == {"200+error": 1, "500": 1}
    assert report.answers_after_fault_s[-1] == 2.0
    assert report.as_dict()["answers_after_fault_s"] == report.answers_after_fault_s


def test_kill_points_plan_when_to_kill():
    for point in kills.POINTS:
        bodies, after = kills.plan(point, 4, 1.5)
        assert len(bodies) == 4
        assert after > 0
    bodies, after = kills.plan("kill-decode", 4, 1.5)
    late = [b for b in bodies if isinstance(b, tuple)]
    assert [at for at, _ in late] == [2.0, 2.0]  # sent after the streams' WRITEs went
    assert after == 2.5  # and killed before theirs (held 1.5 s)
    with pytest.raises(ValueError, match="kill point"):
        kills.plan("kill-router", 1, 1.0)


async def test_blackhole_accepts_and_never_answers_and_a_refused_port_refuses():
    async with sidechannel.Blackhole() as hole:
        r, w = await asyncio.open_connection("127.0.0.1", hole.port)
        w.write(b"hello")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(1), 0.2)
        w.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", sidechannel.refused_port())


async def test_kv_corrupt_fault_counts_detections_and_false_positives():
    from pdctl.sdk.chaos import kvcorrupt
    from pdctl.sdk.pd import PrefillIdentity

    seen = {"mismatch": 0.0, "ok": 0.0}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/metrics":
            lines = [
                f'pdctl:kv_verify_total{{engine="0",result="{r}"}} {seen.get(r, 0.0)}'
                for r in ("ok", "mismatch", "missing", "unsupported")
            ]
            return httpx.Response(200, text="\n".join(lines) + "\n")
        if req.url.host == "p":  # the prefill leg: one token, never a verdict
            return httpx.Response(200, json={})
        bad = kvcorrupt.TAG in req.headers["x-request-id"]
        seen["mismatch" if bad else "ok"] += 1
        return httpx.Response(500 if bad else 200, json={})

    ident = PrefillIdentity("P", "127.0.0.1", 5600, 1, 1)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        rep = await kvcorrupt.kv_corrupt(c, ("http://p", ident), "http://d", n=8, every=4)
    assert rep["tagged"] == 2
    assert rep["tagged_statuses"] == {"500": 2}
    assert rep["clean_statuses"] == {"200": 6}
    assert rep["verify"]["mismatch"] == 2
    assert rep["undetected"] == 0
    assert rep["false_positives"] == 0
    assert any("kv_verify_rate=1.0" in o for o in kvcorrupt.overrides())
