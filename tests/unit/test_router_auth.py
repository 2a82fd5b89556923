"""The guarded router over mock workers: roles, tenants' rate limits, the audit log, and
keys that never leak into logs, timelines, metrics or the audit log."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.router.auth import KeyRing, Principal, access_for
from pdctl.sdk.spec.security import RateLimitSpec
from tests.unit.test_router import body, rig

ENV = {
    "K_ADMIN": "adm-7f3a9c1e5d",
    "K_APPS": "apps-2b8e4d6f0a",
    "K_BATCH": "batch-9c1d3e5f7b",
}
KEYS = [
    {"name": "ops", "role": "admin", "env": "K_ADMIN"},
    {"name": "apps", "role": "inference", "tenant": "web", "env": "K_APPS"},
    {"name": "batch", "role": "inference", "tenant": "batch", "env": "K_BATCH"},
]
CONTROL = [
    ("POST", "/v1/pdctl/mode", {"mode": "push"}),
    ("POST", "/v1/pdctl/drain", {"instance": "decode-0", "drain": False}),
    ("POST", "/v1/pdctl/instance", {"instance": "decode-0", "event": "up"}),
    ("POST", "/v1/pdctl/policy", {"policy": "round_robin"}),
    ("GET", "/v1/pdctl/requests", None),
    ("GET", "/v1/pdctl/state", None),
    ("GET", "/v1/pdctl/audit", None),
]


@pytest.fixture(scope="module")
def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
    import uvloop

    policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
    return policy


def bearer(env: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ENV[env]}"}


async def _call(c: httpx.AsyncClient, url: str, method: str, js: object, **kw: object):
    if method == "POST":
        return await c.post(url, json=js, **kw)  # type: ignore[arg-type]
    return await c.get(url, **kw)  # type: ignore[arg-type]


async def test_roles_decide_who_reaches_what(tmp_path):
    router = {"keys": KEYS}
    async with (
        rig("push", router=router, environ=ENV, audit_path=str(tmp_path / "a.jsonl")) as t,
        httpx.AsyncClient() as c,
    ):
        comp = t.url + "/v1/completions"
        assert (await c.post(comp, json=body())).status_code == 401
        assert (
            await c.post(comp, json=body(), headers={"Authorization": "Bearer x"})
        ).status_code == 401
        assert (
            await c.post(comp, json=body(), headers={"Authorization": ENV["K_APPS"]})
        ).status_code == 401
        for k in ("K_APPS", "K_BATCH", "K_ADMIN"):  # admin may also infer
            assert (await c.post(comp, json=body(), headers=bearer(k))).status_code == 200
        assert (await c.get(t.url + "/v1/models", headers=bearer("K_APPS"))).status_code == 200
        assert (await c.get(t.url + "/v1/models")).status_code == 401
        for method, path, js in CONTROL:
            none = await _call(c, t.url + path, method, js)
            assert none.status_code == 401, path
            inf = await _call(c, t.url + path, method, js, headers=bearer("K_APPS"))
            assert inf.status_code == 403, path
            err = inf.json()["error"]
            assert err["type"] == "permission_error"
            assert "'apps'" in err["message"]
            assert "admin" in err["message"]
            adm = await _call(c, t.url + path, method, js, headers=bearer("K_ADMIN"))
            assert adm.status_code == 200, (path, adm.text)
        assert (await c.get(t.url + "/nowhere", headers=bearer("K_APPS"))).status_code == 403
        # public: health checks and Prometheus need no key
        assert (await c.get(t.url + "/health")).status_code == 200
        metrics = (await c.get(t.url + "/metrics")).text
        assert 'pdctl_router_auth_failures_total{reason="role"}' in metrics


async def test_inference_keys_without_an_admin_key_leave_loopback_control_open():
    router = {"keys": KEYS[1:]}
    async with rig("push", router=router, environ=ENV) as t, httpx.AsyncClient() as c:
        assert (await c.post(t.url + "/v1/completions", json=body())).status_code == 401
        r = await c.post(t.url + "/v1/pdctl/mode", json={"mode": "push"})
        assert r.status_code == 200


async def test_keys_never_reach_logs_timelines_metrics_or_the_audit_log(tmp_path, caplog):
    audit = tmp_path / "audit.jsonl"
    caplog.set_level(logging.DEBUG)
    async with (
        rig("push", router={"keys": KEYS}, environ=ENV, audit_path=str(audit)) as t,
        httpx.AsyncClient() as c,
    ):
        for k in ENV:
            await c.post(t.url + "/v1/completions", json=body(), headers=bearer(k))
            await c.post(t.url + "/v1/pdctl/mode", json={"mode": "push"}, headers=bearer(k))
            await c.post(
                t.url + "/v1/completions",
                json=body(stream=True),
                headers={"Authorization": f"Bearer {ENV[k]}x"},  # near miss
            )
        seen = [
            (await c.get(t.url + "/v1/pdctl/requests", headers=bearer("K_ADMIN"))).text,
            (await c.get(t.url + "/v1/pdctl/audit", headers=bearer("K_ADMIN"))).text,
            (await c.get(t.url + "/metrics")).text,
            repr(t.app.guard.keys.principals),
            repr(t.app.guard.keys._keys),
        ]
    seen += [audit.read_text(), caplog.text]
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    # one mode change by the admin, two refused (inference keys), three near misses
    assert sorted(e["result"] for e in entries) == [200, 401, 401, 401, 403, 403]
    for secret in ENV.values():
        for text in seen:
            assert secret not in text


async def test_audit_log_records_control_actions_and_refusals(tmp_path):
    audit = tmp_path / "audit.jsonl"
    async with (
        rig("push", router={"keys": KEYS}, environ=ENV, audit_path=str(audit)) as t,
        httpx.AsyncClient() as c,
    ):
        h = bearer("K_ADMIN")
        await c.post(t.url + "/v1/pdctl/drain", json={"instance": "decode-0"}, headers=h)
        await c.post(t.url + "/v1/pdctl/drain", json={"instance": "nope"}, headers=h)
        await c.post(t.url + "/v1/pdctl/mode", json={"mode": "push"}, headers=bearer("K_APPS"))
        await c.post(t.url + "/v1/completions", json=body())
        got = (await c.get(t.url + "/v1/pdctl/audit", headers=h)).json()["entries"]
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert got == lines[::-1]  # newest first over HTTP, the same entries as the file
    drain, missing, role, nokey = lines
    assert drain["who"] == "ops"
    assert drain["action"] == "POST /v1/pdctl/drain"
    assert drain["result"] == 200
    assert drain["detail"] == {"request": {"instance": "decode-0"}}
    assert drain["from"].startswith("127.0.0.1:")
    assert isinstance(drain["ts"], float)
    assert missing["result"] == 404
    assert role["who"] == "apps"
    assert role["tenant"] == "web"
    assert role["result"] == 403
    assert role["detail"] == {"reason": "role"}
    assert nokey["who"] == "-"
    assert nokey["result"] == 401
    assert nokey["detail"] == {"reason": "missing_key"}
    assert (audit.stat().st_mode & 0o777) == 0o600


async def test_tenant_over_its_limit_gets_429_others_do_not(tmp_path):
    router = {
        "keys": KEYS,
        "tenants": {"batch": {"requests_per_s": 0.5, "burst_s": 2.0}},  # one request a 2 s
    }
    async with rig("push", router=router, environ=ENV) as t, httpx.AsyncClient() as c:
        comp = t.url + "/v1/completions"
        assert (await c.post(comp, json=body(), headers=bearer("K_BATCH"))).status_code == 200
        refused = await c.post(comp, json=body(), headers=bearer("K_BATCH"))
        assert refused.status_code == 429
        assert refused.headers["pdctl-drop-reason"] == "tenant_limit"
        assert int(refused.headers["retry-after"]) >= 1
        assert 0 < int(refused.headers["pdctl-retry-after-ms"]) <= 2000
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert "'batch'" in refused.json()["error"]["message"]
        for _ in range(5):
            assert (await c.post(comp, json=body(), headers=bearer("K_APPS"))).status_code == 200
        text = (await c.get(t.url + "/metrics")).text
    assert 'pdctl_router_tenant_requests_total{tenant="batch"} 1.0' in text
    assert 'pdctl_router_tenant_requests_total{tenant="web"} 5.0' in text
    assert 'pdctl_router_tenant_rejections_total{tenant="batch",reason="tenant_limit"} 1.0' in text
    assert 'pdctl_router_tenant_rejections_total{tenant="web",reason="tenant_limit"} 0.0' in text
    assert 'pdctl_router_tenant_requests_total{tenant="ops"} 0.0' in text  # known, exported
    # tokens settled from the mocks' usage: 24 prompt + 8 completion per request
    assert 'pdctl_router_tenant_tokens_total{tenant="web"} 160.0' in text


async def test_key_limit_on_tokens_settles_from_usage():
    keys = [{**KEYS[1], "limits": {"tokens_per_s": 40, "burst_s": 1.0}}]
    async with rig("push", router={"keys": keys}, environ=ENV) as t, httpx.AsyncClient() as c:
        comp = t.url + "/v1/completions"
        ok = await c.post(comp, json=body(max_tokens=8), headers=bearer("K_APPS"))
        assert ok.status_code == 200
        # reserved 8 + 11/4 ≈ 11; settled at 32 (24 + 8): the bucket is down to about 8
        again = await c.post(comp, json=body(max_tokens=30), headers=bearer("K_APPS"))
        assert again.status_code == 429
        assert again.headers["pdctl-drop-reason"] == "key_limit"


def test_access_classes():
    assert access_for("/health") == "public"
    assert access_for("/metrics") == "public"
    assert access_for("/v1/chat/completions") == "inference"
    assert access_for("/v1/pdctl/drain") == "admin"
    assert access_for("/anything/else") == "admin"


def test_every_key_is_compared_whichever_matches(monkeypatch):
    import hmac

    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", counting)
    ring = KeyRing(
        [
            (Principal(f"k{i}", "inference", "t"), f"s{i}".encode(), RateLimitSpec())
            for i in range(5)
        ]
    )
    for token, want in ((b"s0", "k0"), (b"s4", "k4"), (b"zz", None)):
        calls.clear()
        who = ring.identify(token)
        assert (who.name if who else None) == want
        assert len(calls) == 5
    v = ring.check("/v1/completions", b"Basic s0")
    assert v.status == 401
    assert v.reason == "missing_key"


def test_audit_log_rotates(tmp_path: Path):
    from pdctl.sdk.router.audit import AuditLog

    log = AuditLog(tmp_path / "a.jsonl", max_bytes=4096, backups=2)
    for i in range(200):
        log.record(who="ops", action=f"POST /v1/pdctl/mode {i}", peer="p", result=200)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["a.jsonl", "a.jsonl.1", "a.jsonl.2"]
    for name in files:
        text = (tmp_path / name).read_text()
        assert len(text) <= 4096
        assert all(json.loads(line)["who"] == "ops" for line in text.splitlines())
    newest = (tmp_path / "a.jsonl").read_text().splitlines()[-1]
    assert json.loads(newest)["action"].endswith(" 199")
    assert len(log.recent) == 200


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _limiter(tenant: RateLimitSpec, key: RateLimitSpec | None = None):
    from pdctl.sdk.router.limits import Limiter
    from pdctl.sdk.router.promreg import Registry

    clock = FakeClock()
    lim = Limiter(Registry(), {"t": tenant}, {"k": key} if key else {}, clock=clock)
    return lim, clock


WHO = Principal("k", "inference", "t")


def test_token_bucket_reserves_then_settles_from_usage():
    from pdctl.sdk.router.lease import Reservation
    from pdctl.sdk.router.limits import Refusal

    lim, clock = _limiter(RateLimitSpec(tokens_per_s=100, burst_s=1.0))
    r = lim.reserve(WHO, 60)
    assert isinstance(r, Reservation)
    assert isinstance(lim.reserve(WHO, 60), Refusal)  # 40 left, 60 asked
    r.settle(10)  # it used 10: 50 come back
    r.settle(1000)  # settles once
    r2 = lim.reserve(WHO, 60)
    assert isinstance(r2, Reservation)  # 90 were there
    r2.settle(120)  # 90 - 60 = 30 left, then 60 more than reserved: -30
    refused = lim.reserve(WHO, 10)
    assert isinstance(refused, Refusal)
    assert refused.limit == "tokens"
    assert refused.reason == "tenant_limit"
    assert refused.retry_after_s == pytest.approx(0.4)  # from -30 to 10 at 100/s
    clock.t += 0.4
    assert isinstance(lim.reserve(WHO, 10), Reservation)


def test_a_request_larger_than_the_bucket_waits_for_a_full_bucket_not_for_ever():
    from pdctl.sdk.router.lease import Reservation
    from pdctl.sdk.router.limits import Refusal

    lim, clock = _limiter(RateLimitSpec(tokens_per_s=10, burst_s=1.0))
    r = lim.reserve(WHO, 500)
    assert isinstance(r, Reservation)
    assert isinstance(lim.reserve(WHO, 500), Refusal)
    clock.t += 1.0
    assert isinstance(lim.reserve(WHO, 500), Reservation)


def test_requests_and_key_limits_and_the_worst_wait_wins():
    from pdctl.sdk.router.lease import Reservation
    from pdctl.sdk.router.limits import Refusal

    lim, clock = _limiter(
        RateLimitSpec(requests_per_s=10, burst_s=0.2), RateLimitSpec(requests_per_s=1)
    )
    first = lim.reserve(WHO, 1)
    assert isinstance(first, Reservation)
    with first as r:
        r.used = 1
    refused = lim.reserve(WHO, 1)
    assert isinstance(refused, Refusal)
    assert refused.reason == "key_limit"  # the key's 1 s beats the tenant's 0.1 s
    assert refused.retry_after_s == pytest.approx(1.0)
    assert dict(refused.headers())[b"retry-after"] == b"1"
    assert dict(refused.headers())[b"pdctl-drop-reason"] == b"key_limit"
    other = Principal("other", "inference", "t")  # same tenant, no key limit
    clock.t += 0.1
    assert isinstance(lim.reserve(other, 1), Reservation)
    assert lim.meter.rejections.values[("t", "key_limit")] == 1
    # a refusal charges nothing: after the key's second the tenant has room again
    clock.t += 1.0
    assert isinstance(lim.reserve(WHO, 1), Reservation)


async def test_a_guarded_router_is_ready_to_the_supervisors_keyless_check():
    from pdctl.sdk.fleet.readiness import check_ready

    async with rig("push", router={"keys": KEYS}, environ=ENV) as t, httpx.AsyncClient() as c:
        for _ in range(100):  # the mocks turn healthy at the first health check
            ok, why = await check_ready(c, t.url, "tiny", role="router")
            if ok:
                break
            await asyncio.sleep(0.05)
        assert ok, why
        assert why == "ready (its models listing needs a key)"
        # a vLLM instance answering 401 is not ready: only the router's own 401 counts
        ok, why = await check_ready(c, t.url, "tiny", role="decode")
        assert not ok
        assert why == "/v1/models answered 401"
