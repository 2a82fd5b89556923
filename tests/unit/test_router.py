"""The router against fast mock workers: the push contract, modes, failures, cancellation,
streaming, protection and observability. (tests/e2e proves it on real vLLM.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest
import uvicorn

from pdctl.sdk.lint import lint
from pdctl.sdk.router import Router, RouterApp
from pdctl.sdk.router.core import Breaker
from pdctl.sdk.router.guard import Guard
from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.sdk.router.server import server_config
from pdctl.sdk.spec import FleetSpec
from tests.conftest import free_ports
from tests.streams import adata


@pytest.fixture(scope="module")
def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
    """Run on uvloop, the loop the router uses in production."""
    import uvloop

    policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
    return policy


class Rig:
    def __init__(self, app: RouterApp, url: str, mocks: dict[str, MockServer]) -> None:
        self.app, self.url, self.mocks = app, url, mocks
        self.router = app.router

    @property
    def p(self) -> MockServer:
        return self.mocks["prefill-0"]

    @property
    def d(self) -> MockServer:
        return self.mocks["decode-0"]


@contextlib.asynccontextmanager
async def rig(
    mode: str = "push",
    *,
    prefill: MockConfig | None = None,
    decodes: list[MockConfig] | None = None,
    prefills: list[MockConfig] | None = None,
    router: dict[str, Any] | None = None,
    health_interval_s: float = 0.2,
    api_key: bytes | None = None,
    max_body: int = 1 << 20,
    render: bool = False,
    fleet: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    audit_path: str | None = None,
) -> AsyncIterator[Rig]:
    """``environ``: read the spec's ``[[router.keys]]`` from it (guarded router)."""
    pcfgs = prefills or [
        prefill or MockConfig(role="prefill", engine_id="prefill-0", side_channel_port=5600)
    ]
    dcfgs = decodes or [MockConfig(role="decode")]
    ps = [await MockServer(c).start() for c in pcfgs]
    ds = [await MockServer(c).start() for c in dcfgs]
    rs = [await MockServer(MockConfig(role="render")).start()] if render else []
    (rport,) = free_ports(1)
    fleet_mode = "push" if mode.startswith("push") else mode
    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": fleet_mode, "platform": "gpu", **(fleet or {})},
        prefill=[
            {
                "name": f"prefill{'' if i == 0 else i}",
                "http_port": pm.port,
                "side_channel_port": 5600 + i,
                "devices": [10 + i],
            }
            for i, pm in enumerate(ps)
        ],
        decode=[
            {
                "name": f"decode{'' if i == 0 else i}",
                "http_port": d.port,
                "side_channel_port": 5700 + i,
                "devices": [1 + i],
            }
            for i, d in enumerate(ds)
        ]
        if len(ds) > 1
        else [{"http_port": ds[0].port, "side_channel_port": 5700, "devices": [1]}],
        router={"port": rport, "concurrent": mode != "push-sequential", **(router or {})},
        render=[{"http_port": r.port} for r in rs],
    )
    plan = lint(spec, check_bound_ports=False).plan
    assert plan is not None
    r = Router(spec, plan, health_interval_s=health_interval_s)
    guard = None
    if environ is not None:
        assert spec.router is not None
        guard = Guard.from_spec(spec.router, r.registry, environ=environ, audit_path=audit_path)
    app = RouterApp(r, api_key=api_key, max_body=max_body, guard=guard)
    server = uvicorn.Server(server_config(app, "127.0.0.1", rport))  # as in production
    task = asyncio.create_task(server.serve())
    await wait_started(server)
    prefill_insts = [i for i in plan.instances if i.group_role == "prefill"]
    mocks = {inst.name: pm for inst, pm in zip(prefill_insts, ps, strict=True)}
    decode_insts = [i for i in plan.instances if i.group_role == "decode"]
    for inst, d in zip(decode_insts, ds, strict=True):
        mocks[inst.name] = d
    for i, rm in enumerate(rs):
        mocks[f"render-{i}"] = rm
    try:
        yield Rig(app, f"http://127.0.0.1:{rport}", mocks)
    finally:
        server.should_exit = True
        await task
        for m in [*ps, *ds, *rs]:
            await m.stop()


async def wait_started(server: uvicorn.Server) -> None:
    for _ in range(500):  # a poll: uvicorn offers no started event
        if server.started:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("router did not start")


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "hello world", "max_tokens": 8, **kw}


async def test_push_sends_both_legs_at_once_per_contract():
    pcfg = MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.3)
    async with rig("push", prefill=pcfg) as t, httpx.AsyncClient() as c:
        r = await c.post(
            t.url + "/v1/completions", json=body(stream_options={"x": 1}, min_tokens=2)
        )
        assert r.status_code == 200, r.text
        (preq,), (dreq,) = t.p.state.requests, t.d.state.requests
        assert preq["request_id"] == dreq["request_id"]
        assert preq["request_id"].startswith("pdctl-")
        assert preq["path"] == dreq["path"] == "/v1/completions"
        pb, db = preq["body"], dreq["body"]
        assert (pb["max_tokens"], pb["stream"]) == (1, False)
        assert "stream_options" not in pb
        assert "min_tokens" not in pb
        assert pb["kv_transfer_params"] == {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        assert db["max_tokens"] == 8
        assert db["kv_transfer_params"] == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": "prefill-0",
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
            "pp_size": 1,
            "remote_request_id": preq["request_id"],
        }
        (tl,) = t.router.recent()
        # decode was sent long before prefill answered: the legs overlapped
        assert tl["decode_sent_ms"] < tl["prefill_done_ms"] - 200
        assert tl["outcome"] == "ok"
        assert tl["completion_tokens"] == 8


async def test_push_sequential_sends_decode_after_prefill_with_its_id():
    async with rig("push-sequential") as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body())
        assert r.status_code == 200
        rid = t.p.state.requests[0]["request_id"]
        ktp = t.d.state.requests[0]["body"]["kv_transfer_params"]
        assert ktp["remote_request_id"] == f"cmpl-{rid}-0-b06667c3"
        assert ktp["pp_size"] == 1
        (tl,) = t.router.recent()
        assert tl["decode_sent_ms"] >= tl["prefill_done_ms"]


async def test_pull_forwards_prefill_params_as_is():
    async with rig("pull") as t, httpx.AsyncClient() as c:
        r = await c.post(
            t.url + "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "max_completion_tokens": 5,
            },
        )
        assert r.status_code == 200
        assert t.p.state.requests[0]["body"]["max_completion_tokens"] == 1
        ktp = t.d.state.requests[0]["body"]["kv_transfer_params"]
        assert ktp["transfer_mode"] == "push"  # exactly what the mock prefill returned
        assert ktp["remote_block_ids"] == [[171]]


async def test_colocated_balances_over_every_instance():
    cfgs = [MockConfig(role="decode"), MockConfig(role="decode")]
    async with rig("colocated", decodes=cfgs) as t, httpx.AsyncClient() as c:
        for _ in range(6):
            assert (await c.post(t.url + "/v1/completions", json=body())).status_code == 200
        # colocated: the prefill group's instance serves plain requests like the others
        assert [len(m.state.requests) for m in t.mocks.values()] == [2, 2, 2]
        for m in t.mocks.values():
            assert all("kv_transfer_params" not in r["body"] for r in m.state.requests)


async def test_identity_change_cancels_and_resends_decode():
    pcfg = MockConfig(role="prefill", engine_id="prefill-0-restarted", delay_s=0.1)
    dcfg = MockConfig(role="decode", delay_s=1.0)
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 200
        first, second = t.d.state.requests
        assert first["body"]["kv_transfer_params"]["remote_engine_id"] == "prefill-0"
        assert second["body"]["kv_transfer_params"]["remote_engine_id"] == "prefill-0-restarted"
        await asyncio.sleep(0.05)
        assert t.d.state.cancelled == 1
        assert r.json()["kv_transfer_params"]["remote_engine_id"] == "prefill-0-restarted"
        assert t.router.recent()[0]["redispatched"] is True
        # learned: the next request is right the first time
        await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert t.d.state.requests[2]["body"]["kv_transfer_params"]["remote_engine_id"] == (
            "prefill-0-restarted"
        )
        assert t.router.recent()[0]["redispatched"] is False
        metrics = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_prefill_identity_changes_total{instance="prefill-0"} 1.0' in metrics


async def test_prefill_failure_gives_502_and_cancels_decode():
    pcfg = MockConfig(role="prefill", status=500, delay_s=0.2)
    dcfg = MockConfig(role="decode", delay_s=5)
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 502
        err = r.json()["error"]
        assert err["code"] == 502
        assert "prefill prefill-0 answered 500" in err["message"]
        await asyncio.sleep(0.1)
        assert (t.d.state.cancelled, t.d.state.in_flight) == (1, 0)
        assert t.router.recent()[0]["outcome"] == "error"


async def test_prefill_timeout_gives_504():
    pcfg = MockConfig(role="prefill", delay_s=2)
    async with (
        rig("push", prefill=pcfg, router={"prefill_timeout_s": 0.3}) as t,
        httpx.AsyncClient() as c,
    ):
        r = await c.post(t.url + "/v1/completions", json=body(), timeout=10)
        assert r.status_code == 504
        assert r.json()["error"]["type"] == "timeout"
        await asyncio.sleep(0.1)
        assert t.p.state.in_flight == 0
        assert t.d.state.in_flight == 0


async def test_client_disconnect_cancels_both_legs():
    pcfg = MockConfig(role="prefill", delay_s=3)
    dcfg = MockConfig(role="decode", delay_s=3)
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(t.url + "/v1/completions", json=body(), timeout=0.3)
        for _ in range(50):
            if t.p.state.in_flight == 0 and t.d.state.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert (t.p.state.cancelled, t.d.state.cancelled) == (1, 1)
        assert (t.p.state.in_flight, t.d.state.in_flight) == (0, 0)
        assert t.router.recent()[0]["outcome"] == "cancelled"
        assert all(u.outstanding == 0 for u in t.router.upstreams)


async def test_client_disconnect_cancels_both_legs_under_another_asgi_server():
    """Without the router's own server (no ``GONE`` extension in the scope), the app learns
    that its client went away from ``receive()``'s ``http.disconnect``."""
    pcfg = MockConfig(role="prefill", delay_s=3)
    dcfg = MockConfig(role="decode", delay_s=3)
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        inbox.put_nowait({"type": "http.request", "body": json.dumps(body()).encode()})
        sent: list[dict[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
            "client": ("127.0.0.1", 40000),
        }
        call = asyncio.create_task(t.app(scope, inbox.get, send))
        for _ in range(100):
            if t.p.state.in_flight == 1 and t.d.state.in_flight == 1:
                break
            await asyncio.sleep(0.02)
        assert (t.p.state.in_flight, t.d.state.in_flight) == (1, 1)
        inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(call, 2.0)
        for _ in range(50):
            if t.p.state.in_flight == 0 and t.d.state.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert (t.p.state.cancelled, t.d.state.cancelled) == (1, 1)
        assert t.router.recent()[0]["outcome"] == "cancelled"
        assert sent == []  # nobody to answer


async def test_client_disconnect_is_not_logged_as_an_error(caplog):
    """A client going away is an ordinary event: no "Exception in ASGI application" and
    traceback per request (formatting one cost milliseconds of CPU each, so a burst of
    disconnects kept the router busy for seconds)."""
    pcfg = MockConfig(role="prefill", delay_s=3)
    dcfg = MockConfig(role="decode", delay_s=3)
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate to the root
    async with rig("push", prefill=pcfg, decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        uvicorn_log.addHandler(caplog.handler)
        try:
            for stream in (False, True):
                with pytest.raises(httpx.ReadTimeout):
                    await c.post(t.url + "/v1/completions", json=body(stream=stream), timeout=0.3)
            for _ in range(50):
                if t.p.state.cancelled == 2 and t.d.state.cancelled == 2:
                    break
                await asyncio.sleep(0.02)
            assert (t.p.state.cancelled, t.d.state.cancelled) == (2, 2)
            assert [r["outcome"] for r in t.router.recent()] == ["cancelled", "cancelled"]
        finally:
            uvicorn_log.removeHandler(caplog.handler)
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_streaming_relays_events():
    dcfg = MockConfig(role="decode", chunks=5, chunk_delay_s=0.01)
    async with rig("push", decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        async with c.stream("POST", t.url + "/v1/completions", json=body(stream=True)) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [d async for d in adata(r)]
        assert len(events) == 6
        assert events[-1] == "[DONE]"
        assert t.p.state.requests[0]["body"]["stream"] is False
        tl = t.router.recent()[0]
        assert (tl["outcome"], tl["completion_tokens"], tl["stream"]) == ("ok", 5, True)


async def test_decode_dying_mid_stream_gives_a_clean_error_and_router_stays_up():
    dcfg = MockConfig(role="decode", chunks=5, chunk_delay_s=0.01, die_after_chunks=2)
    async with rig("push", decodes=[dcfg]) as t, httpx.AsyncClient() as c:
        async with c.stream("POST", t.url + "/v1/completions", json=body(stream=True)) as r:
            events = [d async for d in adata(r)]
        err = json.loads(events[-2])["error"]
        assert err["code"] == 502
        assert "failed mid-answer" in err["message"]
        assert events[-1] == "[DONE]"
        t.d.config.die_after_chunks = None
        r2 = await c.post(t.url + "/v1/completions", json=body())  # waits out the re-check
        assert r2.status_code == 200
        assert (await c.get(t.url + "/health")).status_code == 200
        assert all(u.outstanding == 0 for u in t.router.upstreams)


async def test_dead_decode_is_retried_elsewhere_then_dropped_by_health_checks():
    cfgs = [MockConfig(role="decode"), MockConfig(role="decode")]
    async with (
        rig("push", decodes=cfgs, health_interval_s=30, router={"policy": "round_robin"}) as t,
        httpx.AsyncClient() as c,
    ):
        dead = t.mocks["decode-0"]
        await dead.stop()
        for _ in range(4):
            r = await c.post(t.url + "/v1/completions", json=body())
            assert r.status_code == 200
        assert any(tl["retries"] == 1 for tl in t.router.recent())
        await t.router.instances.check(t.router.decodes[0])
        assert t.router.decodes[0].healthy is False
        metrics = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_instance_up{instance="decode-0",role="decode"} 0.0' in metrics


def test_circuit_breaker_opens_and_recovers(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("pdctl.sdk.router.instances.time.monotonic", lambda: now[0])
    b = Breaker(threshold=3, cooldown_s=10, close_after=2)
    for _ in range(2):
        b.failure()
    assert b.allows()
    b.failure()
    assert (b.state, b.allows()) == ("open", False)
    now[0] += 10
    assert b.state == "half-open"
    b.success()
    assert b.state == "half-open"
    b.success()
    assert b.state == "closed"


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"model": "other", "prompt": "x"}).encode(), 404, "does not exist"),
        (json.dumps({"model": "tiny"}).encode(), 400, "'prompt' is required"),
        (
            json.dumps({"model": "tiny", "prompt": "x", "max_tokens": "5"}).encode(),
            400,
            "'max_tokens' must be a positive integer",
        ),
        (
            json.dumps({"model": "tiny", "prompt": "x", "kv_transfer_params": {}}).encode(),
            400,
            "set by the router",
        ),
    ],
)
async def test_bad_input_gets_openai_errors(payload, status, needle):
    async with rig("push") as t, httpx.AsyncClient() as c:
        r = await c.post(
            t.url + "/v1/completions", content=payload, headers={"content-type": "application/json"}
        )
        assert r.status_code == status
        assert needle in r.json()["error"]["message"]
        assert t.p.state.requests == []


async def test_body_limit_and_api_key():
    async with rig("push", api_key=b"s3cret", max_body=1000) as t, httpx.AsyncClient() as c:
        url = t.url + "/v1/completions"
        assert (await c.post(url, json=body())).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert (await c.post(url, json=body(), headers=bad)).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert (await c.post(url, json=body(), headers=ok)).status_code == 200
        big = body(prompt="x" * 2000)
        assert (await c.post(url, json=big, headers=ok)).status_code == 413
        assert (await c.get(t.url + "/v1/models")).status_code == 401
        assert (await c.get(t.url + "/health")).status_code == 200


async def test_models_metrics_and_request_history():
    async with rig("push") as t, httpx.AsyncClient() as c:
        models = (await c.get(t.url + "/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        await c.post(t.url + "/v1/completions", json=body())
        await c.post(t.url + "/v1/completions", json={"model": "zzz", "prompt": "x"})
        text = (await c.get(t.url + "/metrics")).text
        for name in (
            "pdctl_router_ttft_seconds_bucket",
            "pdctl_router_prefill_leg_seconds_count",
            "pdctl_router_decode_first_byte_after_prefill_seconds_sum",
            "pdctl_router_leg_overlap_seconds_count",
            'pdctl_router_requests_total{mode="push",outcome="ok"} 1.0',
        ):
            assert name in text
        hist = (await c.get(t.url + "/v1/pdctl/requests?outcome=ok")).json()
        assert hist["mode"] == "push"
        (tl,) = hist["requests"]
        assert {
            "id",
            "prefill",
            "decode",
            "prefill_sent_ms",
            "prefill_done_ms",
            "decode_sent_ms",
            "decode_first_byte_ms",
            "done_ms",
            "completion_tokens",
            "outcome",
        } <= set(tl)
        assert (await c.get(t.url + "/v1/pdctl/requests?instance=nope")).json()["requests"] == []
