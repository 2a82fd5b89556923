"""More than one router: Kubernetes router replicas (the Deployment's ``replicas``, one at a
time on rollout, a PodDisruptionBudget, a CPU size the workers follow) and ``/ready``,
the readiness that waits for the instances once and then holds."""

from __future__ import annotations

import asyncio

import httpx

from pdctl.sdk.backends.k8s import build_manifests
from pdctl.sdk.router.mock import MockConfig
from tests.unit.test_k8s_manifests import by_kind, container, kube
from tests.unit.test_router import rig


def test_router_replicas_roll_one_at_a_time_under_a_disruption_budget() -> None:
    docs = build_manifests(kube(k8s={"router_replicas": 3, "router_cpu": "4"}))
    dep = by_kind(docs, "Deployment")["pdctl-router"]
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    (pdb,) = by_kind(docs, "PodDisruptionBudget").values()
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    c = container(dep)
    assert c["resources"] == {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http", "scheme": "HTTP"}


def test_one_router_replica_has_no_budget_that_could_block_a_drain() -> None:
    docs = build_manifests(kube())
    assert by_kind(docs, "PodDisruptionBudget") == {}
    dep = by_kind(docs, "Deployment")["pdctl-router"]
    assert dep["spec"]["replicas"] == 1
    assert "strategy" not in dep["spec"]
    assert "resources" not in container(dep)


def test_a_tls_router_is_probed_over_https() -> None:
    tls = {"cert_file": "/certs/tls.crt", "key_file": "/certs/tls.key"}
    dep = by_kind(build_manifests(kube(router={"tls": tls})), "Deployment")["pdctl-router"]
    assert container(dep)["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


async def test_ready_waits_for_every_role_once_then_holds() -> None:
    down = [MockConfig(role="decode", healthy=False)]
    async with rig("push", decodes=down) as t, httpx.AsyncClient(base_url=t.url, timeout=2) as c:
        r = await c.get("/ready")
        assert r.status_code == 503
        await asyncio.sleep(0.5)  # a health round: decode answers 503
        r = await c.get("/ready")
        assert r.status_code == 503
        assert r.json()["status"] == "waiting for instances: no healthy decode instance"
        t.d.config.healthy = True
        for _ in range(50):
            if (await c.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        assert (await c.get("/ready")).status_code == 200
        t.d.config.healthy = False  # the decode restarts: the fleet's state, not ours
        for _ in range(50):
            if (await c.get("/health")).status_code == 503:
                break
            await asyncio.sleep(0.1)
        assert (await c.get("/health")).status_code == 503
        assert (await c.get("/ready")).status_code == 200
