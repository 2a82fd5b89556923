"""Rebuild the schemas in this folder (see README.md): run once by hand, not by tests.

python tests/data/k8s/schemas/prepare.py KUBERNETES_VALIDATE_WHEEL [LWS_CRD_YAML]

Without the CRD file the LeaderWorkerSet schema is left as it is.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
K8S_VERSION = "v1.33.0-local-strict"
ROOTS = {
    "deployment-apps-v1.json",
    "service-v1.json",
    "configmap-v1.json",
    "networkpolicy-networking-v1.json",
}
EXTRA_DEFS = ("io.k8s.api.core.v1.PodTemplateSpec",)
"""Also kept: the core pod template, to check LeaderWorkerSet templates strictly."""
DEFS_REF = "/api/_definitions.json#/$defs/"


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for v in node.values():
            found |= refs(v)
        return found
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def closure(roots: list[Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Only the definitions reachable from ``roots``."""
    keep: dict[str, Any] = {}
    todo = [r for root in roots for r in refs(root)]
    while todo:
        name = todo.pop().removeprefix(DEFS_REF).removeprefix("#/$defs/")
        if name not in keep:
            keep[name] = defs[name]
            todo.extend(refs(defs[name]))
    return dict(sorted(keep.items()))


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: strip_descriptions(v)
            for k, v in node.items()
            if not (k == "description" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def write(name: str, obj: Any) -> None:
    (HERE / name).write_text(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")


def main(wheel: str, crd: str | None = None) -> None:
    import yaml  # type: ignore[import-untyped, unused-ignore]

    prefix = f"kubernetes_validate/kubernetes-json-schema/{K8S_VERSION}/"
    with zipfile.ZipFile(wheel) as z:
        roots = {n: json.loads(z.read(prefix + n)) for n in sorted(ROOTS)}
        defs = json.loads(z.read(prefix + "_definitions.json"))["$defs"]
    seeds: list[Any] = [*roots.values(), *({"$ref": DEFS_REF + d} for d in EXTRA_DEFS)]
    for name, schema in roots.items():
        write(name, strip_descriptions(schema))
    write("_definitions.json", {"$defs": strip_descriptions(closure(seeds, defs))})
    if crd is None:
        return
    doc = yaml.safe_load(Path(crd).read_text())
    (v1,) = (v for v in doc["spec"]["versions"] if v["name"] == "v1")
    write("leaderworkerset-v1.json", strip_descriptions(v1["schema"]["openAPIV3Schema"]))


if __name__ == "__main__":
    main(*sys.argv[1:3])  # type: ignore[arg-type, unused-ignore]
