"""Kubernetes manifests: goldens of every example, and the properties each must have.

Regenerate the goldens after an intended change with
``pytest tests/unit/test_k8s_manifests.py --update-goldens``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdctl.cli.main import main
from pdctl.sdk.backends.k8s import build_manifests, cluster_plan, to_json, to_yaml
from pdctl.sdk.backends.k8s.manifests import SPEC_FILE
from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES, FIXTURES, spec_dict

GOLDENS = FIXTURES / "k8s"
IMAGE = "registry.example.com/pdctl-vllm:test"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.toml"))
FLEET_LABEL = "pdctl.io/fleet"


def k8s_example(path: Path) -> FleetSpec:
    """An example on the k8s backend (its own [backend.k8s] table, else a test image)."""
    spec = load_spec(path, environ={}).spec
    if spec.backend.k8s is not None:
        return spec
    return load_spec(path, ["backend.kind=k8s", f"backend.k8s.image={IMAGE}"], environ={}).spec


def kube(**kw: Any) -> FleetSpec:
    k8s = {"image": IMAGE, **kw.pop("k8s", {})}
    kw.setdefault("prefill", [{}])
    kw.setdefault("decode", [{}])
    return FleetSpec(**spec_dict(backend={"kind": "k8s", "k8s": k8s}, **kw))


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(workload: dict[str, Any], template: str = "template") -> dict[str, Any]:
    spec = workload["spec"]
    tpl = spec["leaderWorkerTemplate"][template] if template != "template" else spec["template"]
    (c,) = tpl["spec"]["containers"]
    return dict(c)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.usefixtures("yaml")  # to_yaml writes with PyYAML
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_golden(path: Path, golden):
    golden.check(GOLDENS / f"{path.stem}.yaml", to_yaml(build_manifests(k8s_example(path))))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_every_instance_keeps_its_rendered_identity(path: Path):
    spec = k8s_example(path)
    docs = build_manifests(spec)
    plan = build_plan(spec)
    names = {d["metadata"]["name"] for d in docs}
    for inst in plan.instances:
        obj = f"{spec.fleet.name}-{inst.name}"
        assert obj in names
        (w,) = [d for d in docs if d["metadata"]["name"] == obj and d["kind"] != "Service"]
        c = container(w, "leaderTemplate" if w["kind"] == "LeaderWorkerSet" else "template")
        argv = c["command"]
        assert flag(argv, "--host") == "0.0.0.0"
        assert flag(argv, "--port") == str(inst.http_port)
        ktc = json.loads(flag(argv, "--kv-transfer-config"))
        assert ktc["engine_id"] == inst.engine_id
        env = env_of(c)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(inst.side_channel_port)
        assert "CUDA_VISIBLE_DEVICES" not in env
        assert "VLLM_CPU_OMP_THREADS_BIND" not in env
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["http"] == inst.http_port
        assert ports["nixl"] == inst.side_channel_port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        tpl_meta = w["spec"].get("template") or w["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        assert tpl_meta["metadata"]["annotations"]["pdctl.io/engine-id"] == inst.engine_id


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_everything_is_labelled_for_finding_it_again(path: Path):
    spec = k8s_example(path)
    for d in build_manifests(spec):
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "pdctl"
        assert labels[FLEET_LABEL] == spec.fleet.name
        assert d["metadata"]["namespace"] == spec.backend.k8s.namespace  # type: ignore[union-attr]
        if d["kind"] in ("Deployment", "LeaderWorkerSet"):
            assert labels["pdctl.io/instance"]
            assert labels["pdctl.io/role"]


def test_gpu_resources_follow_tp_pp_dp():
    docs = build_manifests(
        kube(
            k8s={"rdma_resources": {"rdma/ib": 2}},
            prefill=[{"tp": 2, "dp": 2}],
            decode=[{"tp": 4}],
        )
    )
    deps = by_kind(docs, "Deployment")
    p = container(deps["pdctl-prefill-0"])["resources"]
    assert p["limits"] == p["requests"] == {"nvidia.com/gpu": "4", "rdma/ib": "2"}
    d = container(deps["pdctl-decode-0"])["resources"]
    assert d["limits"]["nvidia.com/gpu"] == "4"
    assert "resources" not in container(deps["pdctl-router"])


def test_cpu_platform_requests_no_gpu_and_runs_the_images_python():
    spec = kube(
        k8s={"cpu": "4", "memory": "16Gi"},
        fleet={"platform": "cpu", "block_size": 32},
        prefill=[{"cpu_cores": [0, 1]}],
        decode=[{}],
    )
    c = container(by_kind(build_manifests(spec), "Deployment")["pdctl-prefill-0"])
    assert c["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"memory": "16Gi"},
    }
    assert c["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env_of(c)


def test_model_path_is_the_specs_not_this_machines():
    spec = kube(model={"path": "~/models/tiny"})
    c = container(by_kind(build_manifests(spec), "Deployment")["pdctl-prefill-0"])
    assert c["command"][2] == "~/models/tiny"


def test_multinode_instance_is_a_leader_worker_set():
    spec = kube(prefill=[{"tp": 8}], decode=[{"tp": 16}])
    docs = build_manifests(spec)
    assert "pdctl-decode-0" not in by_kind(docs, "Service")  # LWS brings its own
    lws = by_kind(docs, "LeaderWorkerSet")["pdctl-decode-0"]
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2
    assert lws["spec"]["replicas"] == 1
    leader, worker = container(lws, "leaderTemplate"), container(lws, "workerTemplate")
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    la, wa = leader["command"], worker["command"]
    assert flag(la, "--nnodes") == flag(wa, "--nnodes") == "2"
    assert flag(la, "--node-rank") == "0"
    assert "--headless" not in la
    assert flag(wa, "--node-rank") == "$(PDCTL_NODE_RANK)"
    assert wa[-1] == "--headless"
    assert flag(wa, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    rank = env_of(worker)["PDCTL_NODE_RANK"]["fieldRef"]["fieldPath"]
    assert rank == "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"
    assert "readinessProbe" in leader
    assert "readinessProbe" not in worker
    assert "ports" not in worker
    assert by_kind(docs, "Deployment")["pdctl-prefill-0"]["spec"]["strategy"] == {
        "type": "Recreate"
    }


@pytest.mark.parametrize(
    ("workload", "tp", "kind"),
    [
        ("auto", 8, "Deployment"),
        ("leaderworkerset", 8, "LeaderWorkerSet"),
        ("deployment", 16, "Deployment"),
    ],
)
def test_workload_choice(workload: str, tp: int, kind: str):
    spec = kube(k8s={"workload": workload}, decode=[{"tp": tp}])
    assert "pdctl-decode-0" in by_kind(build_manifests(spec), kind)


def test_dollar_parens_in_user_args_are_not_expanded():
    spec = kube(fleet={"vllm_args": ["--chat-template=$(cat x)"]})
    argv = container(by_kind(build_manifests(spec), "Deployment")["pdctl-decode-0"])["command"]
    assert "--chat-template=$$(cat x)" in argv


def test_settings_reach_every_pod():
    spec = kube(
        k8s={
            "labels": {"team": "inference"},
            "annotations": {"example.com/owner": "ops"},
            "node_selector": {"pool": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "toleration_seconds": 30}],
            "service_account": "vllm",
            "image_pull_secrets": ["regcred"],
            "secret_env": ["hf-token"],
            "shm_size": "32Gi",
        }
    )
    for name, d in by_kind(build_manifests(spec), "Deployment").items():
        tpl = d["spec"]["template"]
        pod = tpl["spec"]
        assert tpl["metadata"]["labels"]["team"] == "inference", name
        assert tpl["metadata"]["annotations"]["example.com/owner"] == "ops"
        assert pod["nodeSelector"] == {"pool": "h100"}
        assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}]
        assert pod["serviceAccountName"] == "vllm"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["enableServiceLinks"] is False
        assert container(d)["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
        if name != "pdctl-router":
            assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}


def test_router_reads_the_spec_and_rolls_when_it_changes():
    spec = kube(router={"port": 9000}, k8s={"router_service_type": "LoadBalancer"})
    docs = build_manifests(spec)
    cm = by_kind(docs, "ConfigMap")["pdctl-spec"]
    assert FleetSpec.model_validate_json(cm["data"][SPEC_FILE]) == spec
    svc = by_kind(docs, "Service")["pdctl-router"]
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["port"] == 9000
    router = by_kind(docs, "Deployment")["pdctl-router"]
    assert container(router)["command"][:3] == ["python3", "-m", "pdctl.sdk.backends.k8s.router"]
    sha = router["spec"]["template"]["metadata"]["annotations"]["pdctl.io/spec-sha256"]
    other = by_kind(build_manifests(kube(router={"port": 9001})), "Deployment")["pdctl-router"]
    assert other["spec"]["template"]["metadata"]["annotations"]["pdctl.io/spec-sha256"] != sha


def test_instance_service_is_headless_and_published_before_ready():
    svc = by_kind(build_manifests(kube(prefill=[{"dp": 2}])), "Service")["pdctl-prefill-0"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {FLEET_LABEL: "pdctl", "pdctl.io/instance": "prefill-0"}
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http", "nixl", "nixl-1"]


def test_kv_events_reach_the_router_pod():
    """cache_aware on Kubernetes: each pod publishes its KV events on all interfaces,
    declares both ports, and the router's plan subscribes at the instance's DNS name."""
    spec = kube(
        k8s={"namespace": "llm"},
        prefill=[{"count": 2}],
        fleet={"enable_prefix_caching": True},
        router={"policy": "cache_aware"},
    )
    docs = build_manifests(spec)
    plan = cluster_plan(spec)
    for name, svc in by_kind(docs, "Service").items():
        if name == "pdctl-router":
            continue
        inst = plan.by_name(name.removeprefix("pdctl-"))
        assert inst.kv_events_port is not None
        ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
        assert ports["kv-events"] == inst.kv_events_port
        assert ports["kv-replay"] == inst.kv_events_port + 1
        cfg = json.loads(flag(list(inst.argv), "--kv-events-config"))
        assert cfg["endpoint"] == f"tcp://*:{inst.kv_events_port}"
        assert inst.host.endswith(".llm.svc.cluster.local")


def test_cluster_plan_names_each_instance_by_dns():
    spec = kube(k8s={"namespace": "llm"}, prefill=[{"count": 2}], decode=[{"tp": 16}])
    plan = cluster_plan(spec)
    p0 = plan.by_name("prefill-0")
    assert p0.host == p0.side_channel_host == "pdctl-prefill-0.llm.svc.cluster.local"
    assert p0.url == f"http://pdctl-prefill-0.llm.svc.cluster.local:{p0.http_port}"
    d0 = plan.by_name("decode-0")
    assert d0.host == "pdctl-decode-0-0.pdctl-decode-0.llm.svc.cluster.local"
    assert p0.engine_id == build_plan(spec).by_name("prefill-0").engine_id
    assert plan.router is not None
    assert plan.router.host == "pdctl-router.llm.svc.cluster.local"


def test_output_is_deterministic_and_parses_back(yaml):
    spec = k8s_example(EXAMPLES / "gpu-8x-4p1d.toml")
    docs = build_manifests(spec)
    text = to_yaml(docs)
    assert text == to_yaml(build_manifests(spec))
    assert "&id" not in text  # no YAML anchors
    assert list(yaml.safe_load_all(text)) == docs
    assert json.loads(to_json(docs)) == {"apiVersion": "v1", "kind": "List", "items": docs}


def test_spec_without_k8s_table_names_the_field(capsys):
    rc = main(["render", "-f", str(EXAMPLES / "gpu-8x-4p1d.toml"), "--backend", "k8s"])
    assert rc == 2
    assert "backend.k8s" in capsys.readouterr().err


def test_cli_render_yaml_and_json(capsys, yaml):
    path = str(EXAMPLES / "k8s-multinode.toml")
    assert main(["render", "-f", path]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {d["kind"] for d in docs} == {
        "Service",
        "Deployment",
        "LeaderWorkerSet",
        "ConfigMap",
        "NetworkPolicy",
    }
    assert main(["render", "-f", path, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == docs


def test_cli_render_refuses_lint_errors(capsys):
    path = str(EXAMPLES / "cpu-1p1d.toml")
    rc = main(["render", "-f", path, "--backend", "k8s", "--set", f"backend.k8s.image={IMAGE}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "PD031" in err
    assert "model.path" in err


def test_local_render_is_unchanged_by_the_backend_flag(capsys):
    path = str(EXAMPLES / "gpu-8x-4p1d.toml")
    assert main(["render", "-f", path, "--json"]) == 0
    default = capsys.readouterr().out
    assert main(["render", "-f", path, "--json", "--backend", "local"]) == 0
    assert capsys.readouterr().out == default
