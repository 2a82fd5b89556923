"""Every rendered manifest validates against the Kubernetes JSON schemas (v1.33, strict:
unknown fields are errors) and the LeaderWorkerSet CRD schema, kept in tests/data/k8s."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
from referencing import Registry, Resource  # type: ignore[import-not-found, unused-ignore]
from referencing.jsonschema import DRAFT202012  # type: ignore[import-not-found, unused-ignore]

from pdctl.sdk.backends.k8s import build_manifests
from tests.conftest import FIXTURES
from tests.unit.test_k8s_manifests import EXAMPLE_FILES, k8s_example, kube

SCHEMAS = FIXTURES / "k8s" / "schemas"
BY_KIND = {
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicy-networking-v1.json",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-v1.json",
}
DEFINITIONS_URI = "https://kubernetes.io/api/_definitions.json"
POD_TEMPLATE = {"$ref": DEFINITIONS_URI + "#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return data


@cache
def registry() -> Any:
    """The shared definitions at the URI the per-kind schemas refer to
    (``/api/_definitions.json`` relative to their ``$id``)."""
    defs = Resource.from_contents(_load("_definitions.json"), default_specification=DRAFT202012)
    return Registry().with_resource(DEFINITIONS_URI, defs)


def validator(schema: dict[str, Any]) -> Any:
    return jsonschema.Draft202012Validator(schema, registry=registry())


def errors(doc: dict[str, Any]) -> list[str]:
    """Schema violations of one object ([] when valid). LWS pod templates are also
    checked against the strict core PodTemplateSpec: the CRD schema alone would let an
    unknown field through (the API server prunes it silently)."""
    name = BY_KIND.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    assert name is not None, f"no schema kept for {doc.get('apiVersion')} {doc.get('kind')}"
    found = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator(_load(name)).iter_errors(doc)
    ]
    if doc["kind"] == "LeaderWorkerSet":
        tpl = doc["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            found += [f"{key}: {e.message}" for e in validator(POD_TEMPLATE).iter_errors(tpl[key])]
    return found


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_examples_validate(path: Path):
    docs = build_manifests(k8s_example(path))
    for doc in docs:
        assert errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"


def test_every_setting_validates():
    spec = kube(
        k8s={
            "labels": {"team": "x"},
            "annotations": {"example.com/a": "b"},
            "node_selector": {"pool": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "service_account": "vllm",
            "image_pull_secrets": ["regcred"],
            "secret_env": ["hf-token"],
            "rdma_resources": {"rdma/ib": 1},
            "cpu": "8",
            "memory": "64Gi",
            "router_service_type": "NodePort",
        },
        prefill=[{"tp": 8, "dp": 2}],
        decode=[{"tp": 16}],
    )
    for doc in build_manifests(spec):
        assert errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ["spec", "template", "spec", "containers", 0, "imagePullPolcy"], "Never"),
        ("Deployment", ["spec", "replicas"], "one"),
        ("Service", ["spec", "ports", 0, "port"], "http"),
        ("LeaderWorkerSet", ["spec", "leaderWorkerTemplate", "size"], "2"),
        (
            "LeaderWorkerSet",
            ["spec", "leaderWorkerTemplate", "workerTemplate", "spec", "containers", 0, "cmd"],
            ["x"],
        ),
    ],
)
def test_the_schemas_catch_mistakes(kind: str, path: list[Any], value: Any):
    """The check can fail: a misspelt field or a wrong type is reported."""
    docs = build_manifests(kube(decode=[{"tp": 16}]))
    doc = copy.deepcopy(next(d for d in docs if d["kind"] == kind))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert errors(doc)
