"""The ``vllm`` command lines pdctl renders for GPUs: every example's (local plan and
Kubernetes manifests) and a seeded sweep of generated specs."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from pdctl.sdk.backends.k8s.manifests import build_manifests
from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IMAGE = "registry.example.com/pdctl-vllm:test"
_K8S_VAR = re.compile(r"\$\$?\(([A-Z_]+)\)")
_K8S_VALUES = {"PDCTL_NODE_RANK": "1", "LWS_LEADER_ADDRESS": "10.0.0.9"}
SWEEP = 80


def _on_k8s(spec: FleetSpec) -> FleetSpec:
    if spec.backend.k8s is not None:
        return spec
    data = spec.model_dump(mode="json")
    data["backend"] = {"kind": "k8s", "k8s": {"image": IMAGE}}
    return FleetSpec(**data)


def _containers(node: Any, out: list[list[str]]) -> None:
    if isinstance(node, dict):
        if node.get("name") == "vllm" and isinstance(node.get("command"), list):
            out.append(
                [_K8S_VAR.sub(lambda m: _K8S_VALUES[m.group(1)], a) for a in node["command"]]
            )
        for v in node.values():
            _containers(v, out)
    elif isinstance(node, list):
        for v in node:
            _containers(v, out)


def gpu_commands(spec: FleetSpec) -> list[list[str]]:
    """Every ``vllm`` argv of the spec on GPUs: planned locally and in the manifests."""
    if spec.fleet.platform != "gpu":
        data = spec.model_dump(mode="json")
        data["fleet"].update(platform="gpu", python=None, block_size=None)
        data["fleet"]["kv_buffer_device"] = None
        spec = FleetSpec(**data)
    cmds = [list(i.argv) for i in build_plan(spec).instances]
    _containers(build_manifests(_on_k8s(spec)), cmds)
    return [c for c in cmds if c[:1] == ["vllm"]]


def example_commands() -> dict[str, list[list[str]]]:
    return {
        p.name: gpu_commands(load_spec(p, environ={}).spec) for p in sorted(EXAMPLES.glob("*.toml"))
    }


def swept_specs(n: int = SWEEP, seed: int = 0) -> list[FleetSpec]:
    """Specs over what changes the argv: modes, connectors, backends, block sizes, TP/PP/DP,
    dtypes, prefix caching, the tokens path and its render servers."""
    rng = random.Random(seed)

    def group() -> dict[str, Any]:
        g: dict[str, Any] = {
            "host": rng.choice(["127.0.0.1", "10.0.0.1", "10.0.0.2"]),
            "count": rng.randint(1, 2),
            "tp": rng.choice([1, 2, 4]),
            "dp": rng.choice([1, 2]),
            "pp": rng.choice([1, 2]),
        }
        if rng.random() < 0.5:
            g["max_num_seqs"] = rng.randint(1, 512)
        return g

    out = []
    for _ in range(n):
        d: dict[str, Any] = {
            "model": {
                "path": "org/m",
                "dtype": rng.choice(["auto", "bfloat16", "float16"]),
                "kv_cache_dtype": rng.choice(["auto", "fp8"]),
                "max_model_len": rng.choice([None, 4096, 131072]),
                "trust_remote_code": rng.random() < 0.5,
            },
            "fleet": {
                "platform": "gpu",
                "mode": rng.choice(["push", "pull"]),
                "block_size": rng.choice([16, 32, 64, 128]),
                "connector": rng.choice(["pdctl", "stock"]),
                "nixl_backends": rng.choice([["UCX"], ["LIBFABRIC"], ["UCX", "LIBFABRIC"]]),
                "enable_prefix_caching": rng.choice([None, True, False]),
                "failure_policy": rng.choice(["fail", "recompute"]),
            },
            "prefill": [group() for _ in range(rng.randint(1, 2))],
            "decode": [group() for _ in range(rng.randint(1, 2))],
        }
        if rng.random() < 0.5:
            path = rng.choice(["text", "tokens"])
            d["router"] = {"host": "0.0.0.0", "port": 8000, "path": path}
            if path == "tokens":
                d["render"] = [{"host": "127.0.0.1", "count": 1}]
        out.append(FleetSpec(**d))
    return out
