"""The fleet's NetworkPolicies, read the way a CNI reads them: for each pair of pods (and
an outsider) and each named port, is the connection allowed?"""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk.backends.k8s import build_manifests
from pdctl.sdk.lint import lint
from tests.unit.test_k8s_manifests import by_kind, kube

Labels = dict[str, str]
OUTSIDER: Labels = {"app": "somebody-else"}
PROM: Labels = {"app.kubernetes.io/name": "prometheus"}


def _selects(sel: dict[str, Any], labels: Labels) -> bool:
    if any(labels.get(k) != v for k, v in sel.get("matchLabels", {}).items()):
        return False
    for e in sel.get("matchExpressions", []):
        assert e["operator"] == "In"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def allowed(
    policies: list[dict[str, Any]], src: Labels, dst: Labels, port: str, src_ns: str = "default"
) -> bool:
    """Kubernetes semantics: a pod no policy selects takes everything; a selected pod
    takes what any rule of any policy selecting it allows."""
    mine = [p for p in policies if _selects(p["spec"]["podSelector"], dst)]
    if not mine:
        return True
    for p in mine:
        for rule in p["spec"]["ingress"]:
            ports = rule.get("ports")
            if ports is not None and port not in [x["port"] for x in ports]:
                continue
            peers = rule.get("from")
            if peers is None:
                return True
            for peer in peers:
                ns_ok = (
                    "namespaceSelector" not in peer and src_ns == p["metadata"]["namespace"]
                ) or (
                    "namespaceSelector" in peer
                    and _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": src_ns})
                )
                if ns_ok and _selects(peer.get("podSelector", {}), src):
                    return True
    return False


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, Labels]:
    """Each pod template's labels, by the instance label (LWS: leader and worker)."""
    out: dict[str, Labels] = {}
    for d in docs:
        spec = d.get("spec", {})
        tpls = [spec.get("template")] + [
            spec.get("leaderWorkerTemplate", {}).get(t)
            for t in ("leaderTemplate", "workerTemplate")
        ]
        for t in tpls:
            if t:
                labels = t["metadata"]["labels"]
                out[labels["pdctl.io/instance"]] = labels
    return out


def test_engines_only_from_the_router_and_each_other():
    spec = kube(fleet={"kv_events": True}, router={"policy": "cache_aware"})
    docs = build_manifests(spec)
    pols = list(by_kind(docs, "NetworkPolicy").values())
    assert {p["metadata"]["name"] for p in pols} == {"pdctl-engines", "pdctl-router-ingress"}
    pods = pod_labels(docs)
    router, p, d = pods["router"], pods["prefill-0"], pods["decode-0"]
    for engine in (p, d):
        for port in ("http", "kv-events", "kv-replay"):
            assert allowed(pols, router, engine, port)
            assert not allowed(pols, OUTSIDER, engine, port)
        assert not allowed(pols, OUTSIDER, engine, "nixl")
        assert not allowed(pols, router, engine, "nixl")  # the router has no side channel
    assert allowed(pols, d, p, "nixl")  # decode reads the prefill's side channel
    assert allowed(pols, p, d, "nixl")  # push: prefill writes into decode
    assert allowed(pols, p, d, "40123")  # UCX's own data ports
    assert allowed(pols, OUTSIDER, router, "http")  # the router checks keys itself
    assert not allowed(pols, OUTSIDER, p, "http")
    # a pod of another fleet with the same role is an outsider
    other = {**p, "pdctl.io/fleet": "other"}
    assert not allowed(pols, other, d, "nixl")


def test_prometheus_may_scrape_http_only():
    spec = kube(
        k8s={"prometheus_pod_labels": PROM, "prometheus_namespace": "monitoring"},
        render=[{}],
        router={"path": "tokens"},
    )
    docs = build_manifests(spec)
    pols = list(by_kind(docs, "NetworkPolicy").values())
    pods = pod_labels(docs)
    for name in ("prefill-0", "decode-0", "render-0"):
        assert allowed(pols, PROM, pods[name], "http", src_ns="monitoring")
        assert not allowed(pols, PROM, pods[name], "http", src_ns="default")
        assert not allowed(pols, PROM, pods[name], "nixl", src_ns="monitoring")
        assert allowed(pols, pods["router"], pods[name], "http")
    assert not allowed(pols, pods["prefill-0"], pods["render-0"], "http")


def test_turned_off_nothing_is_emitted_and_lint_warns():
    spec = kube(k8s={"network_policies": False})
    assert by_kind(build_manifests(spec), "NetworkPolicy") == {}
    found = [f for f in lint(spec, check_bound_ports=False).findings if f.code == "PD047"]
    (f,) = found
    assert f.severity == "warning"
    assert f.field == "backend.k8s.network_policies"
    on = kube()
    assert "PD047" not in {f.code for f in lint(on, check_bound_ports=False).findings}


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_every_policy_names_only_ports_the_pods_declare(mode):
    docs = build_manifests(kube(fleet={"mode": mode, "kv_events": True}))
    declared = {
        port["name"]
        for d in docs
        for t in [d.get("spec", {}).get("template")]
        if t
        for c in t["spec"]["containers"]
        for port in c.get("ports", [])
    }
    for pol in by_kind(docs, "NetworkPolicy").values():
        for rule in pol["spec"]["ingress"]:
            for port in rule.get("ports", []):
                assert port["port"] in declared
