"""RDMA-ready pods: IPC_LOCK with RDMA/EFA devices, extra capabilities, the pod patch, and
lint's PD050 over the pods as they will be applied."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pdctl.sdk.backends.k8s import build_manifests
from pdctl.sdk.errors import SpecError
from pdctl.sdk.lint import lint
from tests.unit.test_k8s_manifests import by_kind, container, kube
from tests.unit.test_k8s_schemas import errors

EFA = {"vpc.amazonaws.com/efa": 32}


def _caps(c: dict[str, Any]) -> list[str] | None:
    caps: list[str] | None = c.get("securityContext", {}).get("capabilities", {}).get("add")
    return caps


def test_rdma_or_efa_devices_bring_ipc_lock_to_the_engines_only():
    for res in (EFA, {"rdma/ib": 1}):
        docs = build_manifests(kube(k8s={"rdma_resources": res}))
        deps = by_kind(docs, "Deployment")
        assert _caps(container(deps["pdctl-prefill-0"])) == ["IPC_LOCK"]
        assert _caps(container(deps["pdctl-decode-0"])) == ["IPC_LOCK"]
        assert "securityContext" not in container(deps["pdctl-router"])


def test_no_rdma_no_security_context():
    deps = by_kind(build_manifests(kube()), "Deployment")
    assert all("securityContext" not in container(d) for d in deps.values())


def test_extra_capabilities_merge_with_ipc_lock_on_every_node_of_a_group():
    spec = kube(
        k8s={"rdma_resources": EFA, "capabilities": ["SYS_PTRACE", "IPC_LOCK"]},
        decode=[{"tp": 16}],
    )
    docs = build_manifests(spec)
    (lws,) = by_kind(docs, "LeaderWorkerSet").values()
    for tpl in ("leaderTemplate", "workerTemplate"):
        assert _caps(container(lws, tpl)) == ["IPC_LOCK", "SYS_PTRACE"]
    for doc in docs:
        assert errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"
    only = build_manifests(kube(k8s={"capabilities": ["SYS_PTRACE"]}))
    assert _caps(container(by_kind(only, "Deployment")["pdctl-decode-0"])) == ["SYS_PTRACE"]


@pytest.mark.parametrize(
    ("caps", "message"),
    [(["CAP_IPC_LOCK"], "write 'IPC_LOCK'"), (["ipc_lock"], "not a capability name")],
)
def test_capability_names_are_checked(caps: list[str], message: str):
    with pytest.raises(ValidationError, match=message):
        kube(k8s={"capabilities": caps})


def test_pod_patch_reaches_every_vllm_pod_and_validates():
    patch = [
        {"op": "add", "path": "/spec/hostIPC", "value": True},
        {"op": "add", "path": "/metadata/annotations", "value": {"example.com/x": "1"}},
        {
            "op": "add",
            "path": "/spec/containers/0/securityContext/capabilities/add/-",
            "value": "SYS_RESOURCE",
        },
    ]
    docs = build_manifests(kube(k8s={"rdma_resources": EFA, "pod_patch": patch}))
    deps = by_kind(docs, "Deployment")
    for name in ("pdctl-prefill-0", "pdctl-decode-0"):
        tpl = deps[name]["spec"]["template"]
        assert tpl["spec"]["hostIPC"] is True
        assert tpl["metadata"]["annotations"] == {"example.com/x": "1"}
        assert _caps(container(deps[name])) == ["IPC_LOCK", "SYS_RESOURCE"]
    assert "hostIPC" not in deps["pdctl-router"]["spec"]["template"]["spec"]
    for doc in docs:
        assert errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"


def test_a_patch_that_does_not_apply_names_the_field_and_the_pod():
    spec = kube(k8s={"pod_patch": [{"op": "remove", "path": "/spec/containers/0/securityContext"}]})
    with pytest.raises(SpecError) as err:
        build_manifests(spec)
    (p,) = err.value.problems
    assert p.field == "backend.k8s.pod_patch"
    assert "operation [0]" in p.message
    assert "prefill-0" in p.message


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"op": "add", "path": "/spec/hostIPC"}, "give a value"),
        ({"op": "add", "path": "spec/hostIPC", "value": 1}, "must start with '/'"),
        ({"op": "add", "path": "/status", "value": 1}, "point into the pod template"),
        ({"op": "move", "path": "/spec/x", "value": 1}, "'add', 'remove', 'replace' or 'test'"),
    ],
)
def test_patch_operations_are_checked_when_read(op: dict[str, Any], message: str):
    with pytest.raises(ValidationError, match=message):
        kube(k8s={"pod_patch": [op]})


def _pd050(k8s: dict[str, Any]) -> list[str]:
    return [
        f.message
        for f in lint(kube(k8s=k8s), check_bound_ports=False).findings
        if f.code == "PD050"
    ]


def test_lint_warns_for_rdma_pods_left_without_ipc_lock():
    assert _pd050({"rdma_resources": EFA}) == []
    drop = [{"op": "remove", "path": "/spec/containers/0/securityContext"}]
    (found,) = _pd050({"rdma_resources": EFA, "pod_patch": drop})
    assert "vpc.amazonaws.com/efa without the IPC_LOCK" in found
    # devices requested through the patch itself are seen too
    via_patch = [
        {
            "op": "add",
            "path": "/spec/containers/0/resources",
            "value": {"limits": {"rdma/hca_shared_devices_a": "1"}},
        }
    ]
    assert len(_pd050({"pod_patch": via_patch})) == 1
    privileged = [
        *via_patch,
        {"op": "add", "path": "/spec/containers/0/securityContext", "value": {"privileged": True}},
    ]
    assert _pd050({"pod_patch": privileged}) == []
