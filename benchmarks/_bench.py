"""Helpers shared by the benchmark scripts (run them from anywhere: python benchmarks/X.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pdctl.sdk.freeports import free_port as free_port


def find_vllm_router(given: str | None) -> str | None:
    """The vllm-router binary: the one given, else on PATH; None (with a note) if absent."""
    found = given or shutil.which("vllm-router")
    if not found:
        print(
            "note: vllm-router not found (pip install vllm-router, or --vllm-router PATH);"
            " it is left out of this run",
            flush=True,
        )
    return found


def vllm_router_argv(binary: str, prefill: str, decode: str, port: int) -> list[str]:
    """vllm-router in PD mode in front of one prefill and one decode (it learns the
    prefill's identity from its first request, then dispatches push requests concurrently)."""
    return [
        binary,
        "--vllm-pd-disaggregation",
        "--prefill",
        prefill,
        "--decode",
        decode,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--prometheus-port",
        str(free_port()),
    ]


def pdctl_router_argv(prefill: str, decode: str, port: int, tmp: Path) -> list[str]:
    """pdctl's router in push mode in front of one prefill and one decode URL."""
    from pdctl.sdk.spec import FleetSpec

    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": int(prefill.rsplit(":", 1)[1]), "devices": [0]}],
        decode=[{"http_port": int(decode.rsplit(":", 1)[1]), "devices": [1]}],
        router={"port": port},
    )
    f = tmp / f"spec-{port}.json"
    f.write_text(spec.model_dump_json())
    return [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]
