"""The discovery presets against the upstream projects' own files (tests/data/upstream-k8s,
copied unmodified; README there names repository, path and commit): the pods their
charts and controllers create are found in the right role, on the engine's port."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pdctl.sdk.kube import PRESETS, Selector
from pdctl.sdk.kube.pods import url_of
from tests.conftest import FIXTURES

UP = FIXTURES / "upstream-k8s"


def ready(template: dict[str, Any], ip: str = "10.1.2.3") -> dict[str, Any]:
    """The pod a workload's template becomes once scheduled and Ready."""
    return {
        "metadata": {"name": "x", "labels": dict(template["metadata"].get("labels") or {})},
        "spec": template["spec"],
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def role_of(preset: str, labels: dict[str, str]) -> str | None:
    for role, sel in PRESETS[preset].rules:
        if Selector.parse(sel).matches(labels):
            return role
    return None


def test_llmd_preset_finds_the_charts_prefill_and_decode_pods_on_vllms_port(yaml):
    docs = list(yaml.safe_load_all((UP / "llm-d-modelservice" / "output-pd.yaml").read_text()))
    found = {}
    for d in docs:
        if d and d.get("kind") == "Deployment":
            p = ready(d["spec"]["template"])
            found[d["metadata"]["name"]] = (
                role_of("llm-d", p["metadata"]["labels"]),
                url_of(p, PRESETS["llm-d"].hint),
            )
    assert found == {
        "pd-llm-d-modelservice-decode": ("decode", "http://10.1.2.3:8200"),
        "pd-llm-d-modelservice-prefill": ("prefill", "http://10.1.2.3:8000"),
    }
    helpers = (UP / "llm-d-modelservice" / "_helpers.tpl").read_text()
    assert "llm-d.ai/role: prefill" in helpers
    assert "llm-d.ai/role: decode" in helpers


def go_consts(text: str) -> dict[str, str]:
    return dict(re.findall(r'^\s*(\w+)\s*=\s*"([^"]*)"', text, re.M))


def kserve_labels(role: str) -> dict[str, str]:
    """The engine pod's labels as workload_single_node.go writes them, from constants.go."""
    c = go_consts((UP / "kserve" / "constants.go").read_text())
    return {
        c["KServeComponentLabelKey"]: c["KServeComponentWorkload"],
        c["LLMDRoleLabelKey"]: c[
            {"prefill": "LLMDRolePrefill", "decode": "LLMDRoleDecode", "both": "LLMDRoleBoth"}[role]
        ],
        c["KubernetesPartOfLabelKey"]: c["LLMInferenceServicePartOfValue"],
    }


def test_kserve_controller_labels_its_engine_pods_as_the_preset_says():
    code = (UP / "kserve" / "workload_single_node.go").read_text()
    # the main workload: decode (or both without a prefill); the prefill workload: prefill
    assert "labels[constants.KServeComponentLabelKey] = constants.KServeComponentWorkload" in code
    assert "labels[constants.LLMDRoleLabelKey] = role" in code
    assert re.search(r"LLMDRoleLabelKey:\s+constants\.LLMDRolePrefill", code)
    assert role_of("kserve", kserve_labels("prefill")) == "prefill"
    assert role_of("kserve", kserve_labels("decode")) == "decode"
    assert role_of("kserve", kserve_labels("both")) == "colocated"
    # the router's, scheduler's pods carry other component labels: not engines
    assert role_of("kserve", {"llm-d.ai/role": "decode"}) is None


def kserve_template(yaml: Any, name: str, tls: bool) -> dict[str, Any]:
    text = (UP / "kserve" / f"config-llm-{name}-template.yaml").read_text()
    branch = r"\1" if tls else r"\2"
    text = re.sub(
        r"\{\{ if \.GlobalConfig\.EnableTLS \}\}(\w*)\{\{else\}\}(\w*)\{\{- end \}\}", branch, text
    )
    spec = yaml.safe_load(text)["spec"]
    tpl = spec["prefill"]["template"] if name == "prefill" else spec["template"]
    return {"metadata": {"labels": {}}, "spec": tpl}


@pytest.mark.parametrize("tls", [False, True], ids=["http", "tls"])
def test_kserve_templates_serve_vllm_in_main_on_its_port(yaml, tls):
    hint = PRESETS["kserve"].hint
    scheme = "https" if tls else "http"
    assert url_of(ready(kserve_template(yaml, "decode", tls)), hint) == f"{scheme}://10.1.2.3:8001"
    assert url_of(ready(kserve_template(yaml, "prefill", tls)), hint) == f"{scheme}://10.1.2.3:8000"


def test_dynamo_preset_reads_both_labelings_and_the_system_port():
    """From ai-dynamo/dynamo consts.go (d195d280) and component_worker.go (015d780b),
    cited in the preset (not copied here): both the current and the legacy worker
    labels, the worker container ``main`` with ``system`` 9090 and ``nixl`` 19090."""
    t, sub = "nvidia.com/dynamo-component-type", "nvidia.com/dynamo-sub-component-type"
    assert role_of("dynamo", {t: "prefill"}) == "prefill"
    assert role_of("dynamo", {t: "worker", sub: "decode"}) == "decode"
    assert role_of("dynamo", {t: "frontend"}) is None
    assert role_of("dynamo", {t: "worker"}) is None  # a worker of another kind
    worker = {
        "metadata": {"labels": {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "args": ["python3 -m dynamo.vllm --model m"],
                    "ports": [
                        {"name": "system", "containerPort": 9090},
                        {"name": "nixl", "containerPort": 19090},
                    ],
                }
            ]
        },
    }
    assert url_of(ready(worker), PRESETS["dynamo"].hint) == "http://10.1.2.3:9090"


def test_pdctl_preset_matches_what_the_k8s_backend_labels():
    from pdctl.sdk import k8slabels

    labels = {k8slabels.MANAGED_BY: "pdctl", k8slabels.ROLE: "router", k8slabels.FLEET: "f"}
    assert role_of("pdctl", labels) == "router"
    assert role_of("pdctl", {**labels, k8slabels.ROLE: "decode"}) == "decode"
