"""The GPU smoke kit's steps (``pdctl selftest --gpu``; docs/gpu-smoke.md).

On one GPU machine, without network, in under 10 minutes: the inventory (NVML /
nvidia-smi, sysfs), the live preflight, the NIXL probe VRAM → VRAM under NIXL's default
``none`` and pdctl's ``strict`` sync modes with checksums on every request and the UCX
lane it took, and a 1P1D pair of pdctl's push connector sharing the GPU (the locally
built tiny model) answering ``requests`` completions through pdctl's router.

The probe and the preflight run as subprocesses of this interpreter (the SDK imports
neither NIXL nor torch); the pair is an :class:`~pdctl.sdk.fleet.AsyncFleet`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.sdk.selftest.runner import Step, StepFailed

DEADLINE_S = 600.0
PROBE_SYNC_MODES = ("none", "strict")
GPU_TRANSPORTS = ("cuda_ipc", "cuda_copy", "gdr_copy", "rc", "dc")
"""UCX transports that move VRAM without staging it through a host copy loop."""


@dataclass(frozen=True)
class GpuOptions:
    model: Path
    """The tiny model's directory (built locally, as ``pdctl demo`` does)."""
    requests: int = 20
    python: str = sys.executable
    probe_count: int = 20
    device: int = 0


def _json_command(argv: list[str], timeout_s: float) -> tuple[int, dict[str, Any]]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise StepFailed(f"{' '.join(argv[2:5])} took over {timeout_s:.0f} s") from None
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise StepFailed(f"no JSON from {argv[2:4]} (exit {p.returncode}): {tail}") from None
    if not isinstance(doc, dict):
        raise StepFailed(f"{argv[2:4]} answered {type(doc).__name__}, not an object")
    return p.returncode, doc


def inventory_step(_: GpuOptions) -> Step:
    def run(budget_s: float) -> dict[str, Any]:
        from pdctl.sdk.preflight import collect_inventory

        inv = collect_inventory()
        found = {
            "gpus": len(inv.gpus),
            "gpu_names": ", ".join(sorted({g.name or "?" for g in inv.gpus})),
            "rdma_nics": len(inv.nics),
            "gpudirect_rdma": inv.gdr.present,
            "sources": {c.name: c.state for c in inv.checks},
        }
        if not inv.gpus:
            raise StepFailed("no GPU found (NVML and nvidia-smi see none)", found)
        return found

    return Step("inventory", "inventory (GPUs, NICs, GPUDirect)", run, 60)


def preflight_step(opts: GpuOptions) -> Step:
    def run(budget_s: float) -> dict[str, Any]:
        argv = [opts.python, "-m", "pdctl.cli.main", "preflight", "--model", str(opts.model)]
        rc, doc = _json_command([*argv, "--prompt-len", "1024", "--json"], budget_s)
        return check_preflight(rc, doc)

    return Step("preflight", "live preflight (KV path, verdict)", run, 120)


def check_preflight(rc: int, doc: dict[str, Any]) -> dict[str, Any]:
    """The preflight's verdict and the KV path of its first GPU pair (exit 0: pays, 1:
    warnings; 2 and up: it could not run)."""
    pairs = doc.get("pairs") or []
    first = pairs[0] if pairs and isinstance(pairs[0], dict) else {}
    found = {
        "exit_code": rc,
        "verdict": doc.get("verdict"),
        "pair": first.get("name"),
        "path": first.get("path"),
        "warnings": len(doc.get("warnings") or []),
    }
    if rc not in (0, 1) or doc.get("verdict") is None:
        raise StepFailed(f"the preflight did not reach a verdict (exit {rc})", found)
    return found  # one GPU may give no pair: the verdict is what is checked


def probe_step(opts: GpuOptions, sync_mode: str) -> Step:
    def run(budget_s: float) -> dict[str, Any]:
        argv = [opts.python, "-m", "pdctl.cli.main", "probe", "--device", "cuda"]
        argv += ["--sync-mode", sync_mode, "--verify", "all", "--count", str(opts.probe_count)]
        argv += ["--bytes-per-token", "131072", "--prompt-len", "2048", "--json"]
        rc, doc = _json_command(argv, budget_s)
        return check_probe(rc, doc)

    return Step(
        f"probe-{sync_mode}", f"probe VRAM → VRAM, sync mode {sync_mode}", run, 150, ("inventory",)
    )


def check_probe(rc: int, doc: dict[str, Any]) -> dict[str, Any]:
    """What a probe report says, or :class:`StepFailed` naming what is wrong with it."""
    integrity = doc.get("integrity") or {}
    lane = (doc.get("ucx") or {}).get("transports") or []
    found = {
        "exit_code": rc,
        "device": (doc.get("config") or {}).get("device"),
        "gbps_per_request_p50": doc.get("gbps_per_request_p50"),
        "checked": integrity.get("checked"),
        "mismatched": len(integrity.get("mismatched") or []),
        "ucx_lane": ", ".join(lane) or None,
    }
    if doc.get("error"):
        raise StepFailed(f"the probe failed: {doc['error']}", found)
    if not doc.get("ok") or rc != 0:
        raise StepFailed(f"the probe reports failed requests (exit {rc})", found)
    if found["device"] != "cuda":
        raise StepFailed(f"the probe's pools were on {found['device']}, not the GPU", found)
    if not found["checked"] or found["mismatched"]:
        raise StepFailed(
            f"checksums: {found['mismatched']} of {found['checked']} requests differ", found
        )
    if not lane:
        raise StepFailed("UCX did not say which transport it used (the lane is unknown)", found)
    found["gpu_lane"] = any(t.split("/")[0] in GPU_TRANSPORTS for t in lane)
    return found


def pair_spec(opts: GpuOptions, ports: list[int]) -> Any:
    from pdctl.sdk.spec import FleetSpec

    hp, hd, sp, sd, rp = ports
    shared = ["--gpu-memory-utilization", "0.3", "--enforce-eager"]
    return FleetSpec(
        model={"path": str(opts.model), "served_name": "tiny", "max_model_len": 1024},
        fleet={"name": "selftest-gpu", "mode": "push", "platform": "gpu", "vllm_args": shared},
        prefill=[{"devices": [opts.device], "http_port": hp, "side_channel_port": sp}],
        decode=[{"devices": [opts.device], "http_port": hd, "side_channel_port": sd}],
        router={"port": rp},
    )


def pair_step(opts: GpuOptions) -> Step:
    def run(budget_s: float) -> dict[str, Any]:
        return asyncio.run(asyncio.wait_for(_pair(opts), budget_s))

    return Step(
        "pair",
        f"1P1D push pair on GPU {opts.device}, {opts.requests} requests",
        run,
        300,
        ("inventory",),
    )


async def _pair(opts: GpuOptions) -> dict[str, Any]:
    import httpx

    from pdctl.sdk.fleet import AsyncFleet
    from pdctl.sdk.freeports import free_ports

    # both instances on one GPU (0.3 of its memory each): lint's PD013 (one GPU assigned
    # twice) is waived on purpose, loudly
    fleet = AsyncFleet(pair_spec(opts, free_ports(5)), ready_timeout=240, ignore_lint={"PD013"})
    async with fleet, httpx.AsyncClient(timeout=60) as c:
        body = {"model": "tiny", "max_tokens": 8, "temperature": 0}
        answers = await asyncio.gather(
            *(
                c.post(f"{fleet.router_url}/v1/completions", json={**body, "prompt": f"gpu {i}"})
                for i in range(opts.requests)
            ),
            return_exceptions=True,
        )
    return check_answers(answers, opts.requests)


def check_answers(answers: list[Any], wanted: int) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for a in answers:
        key = type(a).__name__ if isinstance(a, BaseException) else str(a.status_code)
        statuses[key] = statuses.get(key, 0) + 1
    found = {"answered_200": statuses.get("200", 0), "of": wanted, "statuses": statuses}
    if statuses.get("200", 0) != wanted:
        raise StepFailed(f"{statuses.get('200', 0)} of {wanted} requests answered 200", found)
    return found


def gpu_steps(opts: GpuOptions) -> list[Step]:
    return [
        inventory_step(opts),
        preflight_step(opts),
        *(probe_step(opts, m) for m in PROBE_SYNC_MODES),
        pair_step(opts),
    ]
